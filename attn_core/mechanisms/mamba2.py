"""Mamba-2's state-space duality, scalar decay per head (Dao and Gu 2024, 'Transformers are SSMs', arXiv 2405.21060),
run by the chunked SSD algorithm; retention (Sun et al. 2023, arXiv 2307.08621) is the same kernel at a fixed decay."""
from __future__ import annotations

import math

import torch

from ..spec import Cost, Generation, Insight, MechanismSpec, Param, Shape, State, Supports
from ._cache import Cache
from ._common import check_key_padding, checked_shape, repeated, trusted, unfold
from ._cpu import caches
from ._linear_core import causal_chunks, work_dtype

# Mamba-2's initialisation in its reference code (state-spaces/mamba, mamba_ssm/modules/mamba2.py): A_init_range =
# (1, 16), −A drawn uniform in it (kept as its log, A_log); dt_min = 0.001, dt_max = 0.1, dt_init_floor = 1e-4, the
# bias of dt drawn so that softplus(bias) is log-uniform in [dt_min, dt_max], floored.
A_RANGE = (1.0, 16.0)
DT_RANGE = (0.001, 0.1)
DT_FLOOR = 1e-4
# one segment's chunk×chunk scores, all heads: twice the cores' own L2 (the scores and their decays side by side),
# 4 MiB on the EPYC it was measured on, and no more than that (see segment_rows)
SEGMENT_BYTES = min(2 * caches().own, 4 << 20)
CAUSAL_ONLY = ("the state-space recurrence h_t = exp(dt_t·A)·h_{t−1} + dt_t·k_t v_tᵀ runs forward in time: a query "
               "reads the state of the tokens before it, so it is causal by construction")


def init_state(shape: Shape, device=None, dtype=torch.float32, *, seed: int = 0, chunk: int = 64) -> dict:
    """{'dt': (B, H, Nk) step sizes, 'A': (H,) decay rates}, seeded, as Mamba-2's reference code initialises them:
    A = −uniform(1, 16), and dt log-uniform in [0.001, 0.1] (floored at 1e-4; one draw per token and head, as the
    softplus of dt's bias gives before the input's own projection adds to it), `draw_dt`. The decays and the first m
    tokens' step sizes are the same whatever Nk, so a generated token gets what a forward pass over the longer
    sequence gives it. `chunk` is checked, not used."""
    SPEC.check_params({"chunk": chunk}, shape)
    A, _ = _decays(shape.H, seed)
    return {"dt": draw_dt(shape.B, shape.H, shape.Nk, seed=seed, device=device, dtype=dtype),
            "A": A.to(device=device, dtype=dtype)}


def _decays(heads: int, seed: int) -> tuple[torch.Tensor, torch.Generator]:
    """(A = −uniform(1, 16) per head in float64, the seed's stream after those draws, where the step sizes start)."""
    g = torch.Generator().manual_seed(seed)
    return -torch.empty(heads, dtype=torch.float64).uniform_(*A_RANGE, generator=g), g


def draw_dt(B: int, H: int, n: int, *, seed: int = 0, device=None, dtype=torch.float32) -> torch.Tensor:
    """Step sizes (B, H, n), log-uniform in DT_RANGE and floored at DT_FLOOR: drawn after the decays, position by
    position (all B·H of one token, then the next token's), so that the first m are the same whatever n."""
    _, g = _decays(H, seed)
    lo, hi = (math.log(x) for x in DT_RANGE)
    dt = torch.rand(n, B, H, generator=g, dtype=torch.float64).mul_(hi - lo).add_(lo).exp_().clamp_(min=DT_FLOOR)
    return dt.permute(1, 2, 0).to(device=device, dtype=dtype).contiguous()


def retention_state(shape: Shape, device=None, dtype=torch.float32) -> dict:
    """RetNet's retention as this kernel (Sun et al. 2023, arXiv 2307.08621, eq. 1 and section 2.2): dt = 1 and
    A = log γ_h with γ_h = 1 − 2^(−5−h), h = 0 … H−1, so h_t = γ_h·h_{t−1} + k_t v_tᵀ and y_t = q_tᵀ h_t. RetNet's
    scaling of K by d^(−1/2) and its group norm sit outside the kernel."""
    gamma = 1 - 2.0 ** (-5 - torch.arange(shape.H, dtype=torch.float64))
    return {"dt": torch.ones(shape.B, shape.H, shape.Nk, device=device, dtype=dtype),
            "A": gamma.log().to(device=device, dtype=dtype)}


def mamba2_attention(q, k, v, *, causal: bool = False, key_padding_mask=None, chunk: int = 64, dt=None, A=None,
                     seed: int = 0):
    """y_t = q_tᵀ h_t with h_t = exp(dt_t·A)·h_{t−1} + dt_t·k_t v_tᵀ, h_0 = 0: Mamba-2's SSM with x ← v, B ← k, C ← q,
    no skip term and no scaling of q. Written out, y_t = Σ_{s ≤ t} (q_t·k_s)·exp(A·Σ_{s<r≤t} dt_r)·dt_s·v_s.

    q (B, H, n, D), k and v (B, Hk, n, D) → (B, H, n, D); `dt` (B, H, n) ≥ 0 and `A` (H,) < 0 from `init_state`
    (drawn from `seed` when absent). Causal only (a `causal=False` call is refused), self-attention only. Hk < H:
    the query heads sharing a key/value head read it in place (Mamba-2 shares B and C across heads in groups), each
    with its own decay, so the state is per query head. Chunked SSD (`_segment`): in each chunk of `chunk` tokens the
    quadratic form with the decay mask, each chunk's state, the recurrence over chunk states, then the states read by
    the queries. O(n·(chunk + D)·D) time; O(n·D) memory: the output and one segment's chunk×chunk products
    (`segment_rows`), never an n×n tensor. Half inputs run in float32.
    `key_padding_mask` (B, n), True where the key is padding: dt = 0 there, so a padded token adds nothing and the
    state passes it unchanged, the same as leaving it out; a query before any real token outputs zeros.
    """
    shape = checked_shape(SPEC, q, k, v, causal, chunk=chunk)
    dt, A = _state(shape, q, dt, A, seed, chunk)
    if key_padding_mask is not None:
        check_key_padding(SPEC, key_padding_mask, q, k)
        dt = dt.masked_fill(key_padding_mask[:, None, :], 0.0)
    return ssd(q, k, v, dt, A, chunk)[0]


def _state(shape: Shape, q, dt, A, seed: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """dt and A as given (checked outside `validated()`), or drawn from `seed`."""
    if dt is None or A is None:
        drawn = init_state(shape, q.device, work_dtype(q.dtype), seed=seed, chunk=chunk)
        dt, A = drawn["dt"] if dt is None else dt, drawn["A"] if A is None else A
    if not trusted():
        _check_state(shape, q, dt, A)
    return dt, A


def _check_state(shape: Shape, q, dt, A) -> None:
    want = {"dt": (shape.B, shape.H, shape.Nk), "A": (shape.H,)}
    for name, t in (("dt", dt), ("A", A)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != want[name] or not t.is_floating_point():
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a floating tensor of shape {want[name]} (batch, heads, tokens for dt; "
                             f"heads for A), got {got}; draw both with init_state or pass your own")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; move it with "
                             f"{name}.to({str(q.device)!r})")
    if not bool(torch.isfinite(dt).all() & (dt >= 0).all()):
        raise ValueError("dt holds a negative or non-finite step size; pass dt ≥ 0 (0 skips a token), e.g. "
                         "softplus of a projection")
    if not bool(torch.isfinite(A).all() & (A < 0).all()):
        raise ValueError("A must be negative and finite (a decay exp(dt·A) < 1 per head); pass e.g. -torch.exp(A_log)")


def segment_rows(bh: int, n: int, c: int) -> int:
    """Positions per segment: whole chunks whose (rows, c) products of all B·H heads fill SEGMENT_BYTES in float32,
    at least one chunk, at most n rounded up to whole chunks. SEGMENT_BYTES stops at 4 MiB: on a 2-core Xeon with
    2 MiB of L2 a core, twice the cores' own L2 (8 MiB) was the slowest of 2, 4, 8 and 16 MiB in four interleaved
    runs against fla's chunked form (mamba2 at n = 8192, B = 1, H = 8, D = 64, 9 rounds: 37.3, 35.6, 58.6 and 49.7 ms,
    the peer 44.1; 33.6, 32.3, 38.9 and 35.9, the peer 36.2; at 16384, 5 rounds: 71.1, 69.4, 87.9 and 119.5, the
    peer 115.2)."""
    chunks = max(1, SEGMENT_BYTES // (4 * bh * c * c))
    return min(chunks, -(-n // c)) * c


def ssd(q, k, v, dt, A, c: int, h: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(y (B, H, n, D) in v's dtype, the state after the last token (B, H, D, D) in the work dtype): segment by
    segment of `segment_rows` positions, each in chunks of c (a segment's last chunk may be shorter,
    `causal_chunks`), the state carried from one to the next. `h`: the state before the first token, zeros if None."""
    B, H, n, d = q.shape
    out = torch.empty(B, H, n, v.shape[-1], dtype=v.dtype, device=v.device)
    work = work_dtype(v.dtype)
    if h is None:
        h = torch.zeros(B, H, k.shape[-1], v.shape[-1], dtype=work, device=v.device)
    log_decay = dt.to(work) * A.to(work)[:, None]  # (B, H, n): dt·A ≤ 0
    for s, e, size in causal_chunks(n, segment_rows(B * H, n, c), c):
        rows = [t[:, :, s:e].to(work).contiguous() for t in (q, k, v)]  # one copy of a segment, or a view of all
        h = _segment(*rows, dt[:, :, s:e].to(work), log_decay[:, :, s:e], size, h, out[:, :, s:e])
        del rows
    return out, h


def ssd_state(k, v, dt, A, c: int, heads: int) -> torch.Tensor:
    """h = Σ_s exp(A·Σ_{s<r≤n} dt_r)·dt_s·k_s v_sᵀ (B, heads, D, D), work dtype: the state `ssd` leaves after the
    last token, made by the same steps segment by segment (`_chunk_states`, so the same numbers) without the
    queries. O(n·D²) a head."""
    B, n = k.shape[0], k.shape[2]
    work = work_dtype(v.dtype)
    h = torch.zeros(B, heads, k.shape[-1], v.shape[-1], dtype=work, device=v.device)
    log_decay = dt.to(work) * A.to(work)[:, None]
    for s, e, size in causal_chunks(n, segment_rows(B * heads, n, c), c):
        kc, vc = (t[:, :, s:e].to(work).contiguous().unflatten(2, (-1, size)) for t in (k, v))
        cum = _grouped(log_decay[:, :, s:e], k.shape[1], size).cumsum(-1)
        _, after = _chunk_states(kc, vc, cum, _grouped(dt[:, :, s:e].to(work), k.shape[1], size), h, False)
        h = after.reshape(h.shape)
    return h


def _grouped(x: torch.Tensor, key_heads: int, c: int) -> torch.Tensor:
    """Per-query-head rows x (B, H, L, …) → (B, Hk, L/c, H/Hk, c, …): a chunk's query heads of one group side by
    side, so that they meet their shared key/value head in one product (a view)."""
    B, H, L = x.shape[:3]
    return x.reshape(B, key_heads, H // key_heads, L // c, c, *x.shape[3:]).transpose(2, 3)


def _segment(q, k, v, dt, a, c: int, h, out) -> torch.Tensor:
    """One segment of L = nb·c positions, chunks of c, state `h` (B, H, D, D) before it → the state after it; writes
    y into `out` (B, H, L, D). Per chunk and query head, with cum_l = Σ_{r ≤ l} dt_r·A inside the chunk:
    y_intra = (Q Kᵀ ⊙ M) V, M_ls = exp(cum_l − cum_s)·dt_s for s ≤ l, 0 above (the decay mask);
    the chunk's own state Kᵀ diag(exp(cum_last − cum)·dt) V; the recurrence over chunks, h ← exp(cum_last)·h + own;
    y_state = diag(exp(cum)) Q h_before. Query heads of a group stacked as rows (`_grouped`), k and v read in place."""
    B, kh, L, d = k.shape
    g, nb = q.shape[1] // kh, L // c
    cum = _grouped(a, kh, c).cumsum(-1)  # (B, Hk, nb, g, c)
    step = _grouped(dt, kh, c)
    qg, kc, vc = _grouped(q, kh, c), k.view(B, kh, nb, c, d), v.view(B, kh, nb, c, -1)
    scores = (qg.flatten(3, 4) @ kc.transpose(-2, -1)).view(B, kh, nb, g, c, c)  # Q Kᵀ, each chunk, query head
    recorded = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, dt, a))
    mask = cum[..., :, None] - cum[..., None, :]
    mask = _times(mask.masked_fill_(_above(c, q.device), -math.inf).exp_(), step[..., None, :], recorded)
    y = _times(scores, mask, recorded).view(B, kh, nb, g * c, c) @ vc  # (B, Hk, nb, g·c, D)
    del scores, mask
    before, after = _chunk_states(kc, vc, cum, step, h, recorded)
    states = torch.stack(before, 2)  # (B, Hk, nb, g, D, D): the state before each chunk
    del before
    y = y.view(B, kh, nb, g, c, -1).addcmul_(qg @ states, cum.exp_()[..., None])
    del states
    out.unflatten(1, (kh, g)).unflatten(3, (nb, c)).transpose(2, 3).copy_(y)
    return after.reshape(B, kh * g, d, -1)


def _chunk_states(kc, vc, cum, step, h, recorded: bool) -> tuple[list[torch.Tensor], torch.Tensor]:
    """([the state before each chunk], the state after the last): each chunk's own state
    Kᵀ diag(exp(cum_last − cum)·dt) V, then h ← exp(cum_last)·h + own chunk by chunk. kc, vc (B, Hk, nb, c, D),
    cum and step (B, Hk, nb, H/Hk, c), h (B, H, D, D); the states (B, Hk, H/Hk, D, D)."""
    B, kh, nb, g, c = cum.shape
    d = kc.shape[-1]
    weights = _times((cum[..., -1:] - cum).exp_(), step, recorded)  # exp(cum_last − cum_s)·dt_s
    own = (kc.transpose(-2, -1)[:, :, :, None] * weights[..., None, :]).flatten(3, 4) @ vc  # (B, Hk, nb, g·D, D)
    del weights
    own = own.view(B, kh, nb, g, d, -1)
    decay = cum[..., -1].exp()  # (B, Hk, nb, g): a chunk's total decay
    before = [h.view(B, kh, g, d, -1)]
    for j in range(nb):  # the recurrence over chunk states: nb small steps
        before.append(torch.addcmul(own[:, :, j], before[-1], decay[:, :, j, :, None, None]))
    del own
    return before, before.pop()


def _times(x: torch.Tensor, y: torch.Tensor, recorded: bool) -> torch.Tensor:
    """x·y, into x unless autograd records (x may be a result it saved, as exp's output is)."""
    return x * y if recorded else x.mul_(y)


def _above(c: int, device) -> torch.Tensor:
    """(c, c) True above the diagonal: the keys after each query inside a chunk."""
    return torch.ones(c, c, dtype=torch.bool, device=device).triu_(1)


class SSMCache(Cache):
    """The state of Mamba-2's recurrence after the tokens so far: `h` (B, H, D, D), one D × D state per query head
    (each head decays at its own rate), in the work dtype (float32 for half inputs). `dt` (B, H, L) and `A` (H,) are
    the step sizes and decays of the tokens, inputs of future steps, not counted in `nbytes`: the step of the token
    at position t reads dt[..., t]. Past dt's end, a step size drawn from `seed` (dt was drawn, not given: the
    seeded stream goes on, `draw_dt`, as a forward pass over the longer sequence draws it), or the last given one
    (a caller's dt may run on over the tokens to generate). `mark`/`rewind` move the position only: what a step
    folded into `h` stays (`Cache.rewind`)."""

    def __init__(self, params, k: torch.Tensor, h: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                 seed: int | None = None):
        super().__init__(params, k)
        self.h, self.dt, self.A, self.seed = h, dt, A, seed

    def next_dt(self) -> torch.Tensor:
        """The step sizes (B, H) of the token at position `length`; past a seeded stream, those of positions up to
        twice as far are drawn first (once, amortized O(1) a token)."""
        t = self.length
        if t >= self.dt.shape[-1]:
            if self.seed is None:
                return self.dt[:, :, -1]
            self.dt = _seeded(self.dt, 2 * t + 1, self.seed)
        return self.dt[:, :, t]

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.h,)


def _seeded(dt: torch.Tensor, stop: int, seed: int) -> torch.Tensor:
    """Drawn step sizes (B, H, L) run on to `stop` positions by the same seed (the first L are the same)."""
    if dt.shape[-1] >= stop:
        return dt
    return draw_dt(dt.shape[0], dt.shape[1], stop, seed=seed, device=dt.device, dtype=dt.dtype)


def _cache(k, h, drawn, dt, A, chunk: int, seed: int, max_len: int | None) -> SSMCache:
    """The cache after a prompt: `dt` as given, or the prompt's `drawn` step sizes run on by `seed` to `max_len`."""
    if dt is not None:
        return SSMCache({"chunk": chunk}, k, h, dt, A)
    return SSMCache({"chunk": chunk}, k, h, _seeded(drawn, max(max_len or 0, k.shape[2] + 1), seed), A, seed)


def _prefill(q, k, v, *, max_len: int | None = None, chunk: int = 64, dt=None, A=None, seed: int = 0):
    """The causal outputs of a prompt and the state after it, from one chunked pass (`ssd` returns both)."""
    shape = Shape.of(q, k, True)
    prompt, A = _state(shape, q, _prompt_dt(shape, dt), A, seed, chunk)
    out, h = ssd(q, k, v, prompt, A, chunk)
    return out, _cache(k, h, prompt, dt, A, chunk, seed, max_len)


def _remember(k, v, *, max_len: int | None = None, chunk: int = 64, dt=None, A=None, seed: int = 0) -> SSMCache:
    """The state after a prompt without its outputs (`ssd_state`: what `ssd` carries, without the queries), one per
    query head, whose count A gives."""
    shape = Shape(k.shape[0], _heads(k, dt, A), k.shape[2], k.shape[2], k.shape[3],
                  dtype=str(k.dtype).removeprefix("torch."), causal=True, Hk=k.shape[1])
    prompt, A = _state(shape, k, _prompt_dt(shape, dt), A, seed, chunk)
    return _cache(k, ssd_state(k, v, prompt, A, chunk, shape.H), prompt, dt, A, chunk, seed, max_len)


def _heads(k, dt, A) -> int:
    """The query heads a cache is for: A's or dt's count, else one per key/value head (no state given)."""
    if isinstance(A, torch.Tensor) and A.dim() == 1:
        return A.shape[0]
    return dt.shape[1] if isinstance(dt, torch.Tensor) and dt.dim() == 3 else k.shape[1]


def _prompt_dt(shape: Shape, dt):
    """The prompt's step sizes: dt's first Nk (a longer dt holds those of the tokens to generate)."""
    if isinstance(dt, torch.Tensor) and dt.dim() == 3 and dt.shape[-1] > shape.Nk:
        return dt[..., :shape.Nk]
    return dt


def _step(q, k, v, cache: SSMCache):
    """h ← exp(dt_t·A)·h + dt_t·k vᵀ, then y = qᵀ h, per query head: O(D²) a head, whatever the context."""
    B, H, d, dv = cache.h.shape
    kh, work = k.shape[1], cache.h.dtype
    if q.shape[1] != H and not trusted():
        raise ValueError(f"q has {q.shape[1]} heads but this state was built for {H} (the heads of its dt and A); "
                         f"step with {H} query heads, or remember the prompt with dt and A for {q.shape[1]}")
    dt = cache.next_dt().to(work)  # (B, H)
    h = cache.h.view(B, kh, H // kh, d, dv)
    h.mul_((dt * cache.A.to(work)).exp_().view(B, kh, -1, 1, 1))
    h.addcmul_(k.to(work).transpose(-2, -1).unsqueeze(2) * dt.view(B, kh, -1, 1, 1), v.to(work).unsqueeze(2))
    cache.length += 1
    return (q.to(work).view(B, kh, H // kh, 1, d) @ h).view(B, H, 1, dv).to(q.dtype), cache


def _effective(q, k, v, causal: bool, state: dict, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """W_ts = (q_t·k_s)·exp(A·Σ_{s<r≤t} dt_r)·dt_s for s ≤ t, 0 above: the decayed mixing matrix the recurrence
    applies, out = W @ v (shared heads repeated: a dense picture, not a kernel)."""
    k, v = repeated(q, k, v)
    dt, A = state["dt"].to(q.dtype), state["A"].to(q.dtype)
    cum = (dt * A[:, None]).cumsum(-1)  # (B, H, n)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill_(_above(q.shape[2], q.device), -math.inf).exp_()
    return (q @ k.transpose(-2, -1)) * decay * dt[..., None, :], v


def _segments(s: Shape, chunk: int) -> list[tuple[int, int, int]]:
    """(how many, positions, chunk) of each kind of segment `ssd` runs (`causal_chunks`): whole segments, then the
    last one's whole chunks and its remainder as one short chunk. O(1), whatever n."""
    rows = segment_rows(s.bh, s.Nq, chunk)
    whole, rest = divmod(s.Nq, rows)
    kinds = [(whole, rows, chunk), (1, rest // chunk * chunk, chunk), (1, rest % chunk, rest % chunk)]
    return [kind for kind in kinds if kind[0] and kind[1]]


def _flops(s: Shape, chunk: int = 64) -> float:
    """Per query head: each token's D × D outer product folded into a chunk state and its read by the queries
    (2·D² each), and inside each chunk the pairs s ≤ t: q·k and the weighted value, 2·D each."""
    cells = sum(m * rows * (c + 1) / 2 for m, rows, c in _segments(s, chunk))  # pairs s ≤ t inside chunks
    return s.bh * (4.0 * s.Nq * s.D * s.D + 4.0 * s.D * cells)


def _executed_flops(s: Shape, chunk: int = 64) -> float:
    """The same with each chunk's full c × c products (the decay mask zeroes their upper half afterwards)."""
    cells = sum(m * rows * c for m, rows, c in _segments(s, chunk))
    return s.bh * (4.0 * s.Nq * s.D * s.D + 4.0 * s.D * cells)


def _cache_bytes(s: Shape, chunk: int = 64) -> float:
    return s.bh * s.D * s.D * max(s.elem, 4)  # one D × D state per query head, float32 for half inputs


def _step_flops(s: Shape, chunk: int = 64) -> float:
    """Per query head: decay the state (D²), add dt·k vᵀ (2·D² + D), read it with q (2·D²)."""
    return s.bh * (5.0 * s.D * s.D + s.D)


def _memory(s: Shape, chunk: int = 64) -> float:
    """Peak bytes above the inputs: the output, dt·A (and dt's float32 copy for half inputs) and the state carried,
    then the largest set one segment holds at once, in the order `_segment` makes them (work dtype): its rows of
    q, k, v copied (half inputs, or a segment short of the whole sequence), the cumulative decays, then
    (a) the c×c scores, the decay mask and the intra-chunk output y; (b) y, the chunk weights, the weighted keys and
    the chunk states; (c) y, the chunk states and the states before each chunk as the recurrence makes them;
    (d) those stacked; (e) y, the stacked states and their product with q (and q in the grouped order, heads shared)."""
    w, n, d, bh, bk = max(s.elem, 4), s.Nq, s.D, s.bh, s.bk
    half = s.elem < w
    first = bh * n * (2 if half else 1)  # dt·A, beside dt's float32 copy for half inputs
    alive = 0.0
    for _, L, c in _segments(s, chunk):
        nb = L // c
        rows = ((bh * L * d if half or (L < n and bh > 1) else 0)  # q's rows, then k's and v's, then dt's
                + (2 * bk * L * d if half or (L < n and bk > 1) else 0) + (bh * L if half else 0))
        grouped = bh * L * d if s.group > 1 else 0
        y, states = bh * L * d, bh * nb * d * d
        alive = max(alive, rows + bh * L + max(
            2 * bh * L * c + y + c * c / w,  # (a)
            2 * y + bh * L + states,  # (b)
            y + 2 * states + bh * nb,  # (c), beside the chunks' decays
            y + 2 * states,  # (d)
            y + states + bh * d * d + bh * L * d + grouped))  # (e)
    return s.bh * n * d * s.elem + max(first, bh * n + bh * d * d + alive) * w


SPEC = MechanismSpec(
    label="Mamba-2 (SSD)",
    fn=mamba2_attention,
    description="A state-space model read as attention: each head keeps a D × D state that decays by exp(dt·A) per "
                "token and adds dt·k vᵀ; queries read it. Chunked: quadratic inside chunks, a recurrence between "
                "them. Causal only; retention is the same kernel at a fixed decay (retention_state).",
    paper="Dao and Gu 2024, 'Transformers are SSMs: Generalized Models and Efficient Algorithms Through Structured "
          "State Space Duality', arXiv 2405.21060",
    params=(Param("chunk", 64, 1, 1 << 12, "Tokens per chunk: quadratic inside a chunk, a recurrence between chunks.",
                  log=True, small=lambda n: max(1, n // 4), tokens=True),),
    exact=False,
    state=State(init=init_state, keys=("dt", "A")),
    cost=Cost(flops=_flops, executed_flops=_executed_flops, memory_bytes=_memory, time_big_o="O(n·(c + d)·d)",
              memory_big_o="O(n·d)"),
    supports=Supports(
        causal=True,
        cross=False,
        causal_only=CAUSAL_ONLY,
        padding=True,
        shared_kv=True,
        generation=Generation(remember=_remember, step=_step, cache_bytes=_cache_bytes, prefill=_prefill,
                              step_flops=_step_flops, step_big_o="O(d²)", cache_big_o="O(d²)"),
    ),
    insight=Insight(
        effective=_effective,
        regime=("local", "gaussian", "Mamba-2 is its own model, not an approximation of softmax: its weights "
                "(q·k)·decay·dt are signed and not normalised, and fade with distance at the rate the decays set. "
                "Where nearby tokens score highest (local inputs) both weigh the recent past; with independent "
                "inputs softmax spreads its weight over every earlier key, which the decay forgets."),
        accuracy_note="Mamba-2 is a different model, not an approximation of softmax: these errors are the distance "
                      "between two models, with random step sizes and decays as at initialisation.",
    ),
)

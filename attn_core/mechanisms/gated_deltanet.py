"""Gated DeltaNet: the delta rule with a decay gate (Yang, Kautz, Hatamizadeh 2024, 'Gated Delta Networks: Improving
Mamba2 with Delta Rule', arXiv 2412.06464)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..spec import Cost, Generation, Insight, MechanismSpec, Param, Shape, State, Supports
from ._cache import Cache
from ._common import check_key_padding, checked_shape, repeated, trusted, workspace
from ._cpu import caches
from ._linear_core import _grouped_rows, _rows, causal_chunks, work_dtype

EPS = 1e-6  # k̂ = k / max(‖k‖, EPS): a zero key writes nothing
SEGMENT_BYTES = caches().own  # one segment's chunk tensors, all key/value heads, float32: the cores' own L2, 2 MiB
# on the EPYC it was measured on (see `segment_rows`, `_cpu.Caches.own`)
DT_RANGE = (1e-3, 1e-1)  # default decays α = exp(−dt), dt log-uniform here (see `init_state`)
BETA_LOGIT = 2.0  # default β = sigmoid(z), z uniform in [−2, 2]


# -- the three forms: the plain recurrence (reference), the chunked form (what runs), the step (generation) --------
def unit(x: torch.Tensor) -> torch.Tensor:
    """x / max(‖x‖, EPS) along the last dim (torch's F.normalize)."""
    return F.normalize(x, dim=-1, eps=EPS)


def recurrence(q, k, v, alpha, beta) -> torch.Tensor:
    """The definition, token by token (the reference, O(n·d²), slow): S₀ = 0,
    S_t = α_t S_{t−1} (I − β_t k̂_t k̂_tᵀ) + β_t v_t k̂_tᵀ, o_t = S_t q̂_t with q̂ = unit(q)/√d.
    q (B, H, n, D), k, v (B, Hk, n, D), alpha, beta (B, Hk, n) (shared heads repeated first) → (B, H, n, D)."""
    k, v, alpha, beta = repeated(q, k, v, alpha, beta)
    qs, ks = unit(q) / math.sqrt(q.shape[-1]), unit(k)
    S = q.new_zeros(*q.shape[:2], v.shape[-1], q.shape[-1])  # (B, H, d_v, d_k)
    eye = torch.eye(q.shape[-1], dtype=q.dtype, device=q.device)
    outs = []
    for t in range(q.shape[2]):
        kt, a, b = ks[:, :, t], alpha[:, :, t, None, None], beta[:, :, t, None, None]
        S = a * S @ (eye - b * kt[..., :, None] * kt[..., None, :]) + b * v[:, :, t, :, None] * kt[..., None, :]
        outs.append((S @ qs[:, :, t, :, None])[..., 0])
    return torch.stack(outs, dim=2)


def segment_rows(bk: int, d: int, chunk: int, device: str = "cpu") -> int:
    """Tokens per segment: a segment's chunk tensors (per key/value head and token about 7·d + 3·C numbers: k̂, v,
    the solve's two right sides, q̂, the C-wide decays and products) fill SEGMENT_BYTES (on a GPU, `workspace`'s
    multiple of it), in whole chunks, at least 8 chunks (fewer, and the per-op overhead of a few µs a call outweighs
    what the cache saves). Not sized by the query heads: a prompt's state (`_remember`, no queries) is then made
    segment by segment as its forward makes it, bit for bit; with shared heads a segment's query tensors are H/Hk
    times larger."""
    per_token = 4 * bk * (7 * d + 3 * chunk)
    return max(workspace(SEGMENT_BYTES, device) // per_token // chunk, 8) * chunk


def chunked(q, k, v, log_alpha, beta, chunk: int, *, outputs: bool = True):
    """The chunked (WY) form: (out (B, H, n, D) in v's dtype, or None when `outputs` is False; the final states
    (B·Hk, d_k, d_v)). q (B, H, n, D) (None without outputs), k, v (B, Hk, n, D), log_alpha and beta (B, Hk, n) in
    the work dtype (float32 for half inputs). Segments of `segment_rows` tokens in whole chunks of C, the last
    chunk the remainder (`causal_chunks`); each segment's chunks are prepared together (`_prepare`), then the chunk
    recurrence runs over them one by one, carrying S (d_k × d_v per key/value head, stored as Sᵀ)."""
    B, Hk, n, d = k.shape
    group = 1 if q is None else q.shape[1] // Hk
    out = torch.empty(B, Hk * group, n, v.shape[-1], dtype=v.dtype, device=v.device) if outputs else None
    S = torch.zeros(B * Hk, d, v.shape[-1], dtype=work_dtype(v.dtype), device=v.device)
    for s, e, c in causal_chunks(n, segment_rows(B * Hk, d, chunk, k.device.type), chunk):
        S = _segment(q, k, v, log_alpha, beta, S, out, s, e, c)
    return out, S


def _prepare(k, v, log_alpha, beta, s: int, e: int, c: int):
    """The chunks of tokens s:e, in parallel, per key/value head (bk = B·Hk, nb chunks of c): g, the cumulative
    log-decay inside each chunk (bk, nb, c); the decays Γ_ri = γ_r/γ_i for i ≤ r, 0 above (bk, nb, c, c); k̂; and
    the UT transform's solve (I + L) X = diag(β) [V, γ ⊙ K̂] with L_ri = β_r Γ_ri k̂_r·k̂_i (i < r): X = [Ũ, W], so
    that a chunk entered with state S writes U = Ũ − W S (rows u_r = β_r (v_r − α_r S_{r−1} k̂_r), S as d_k × d_v)."""
    bk, nb, d = k.shape[0] * k.shape[1], (e - s) // c, k.shape[-1]
    ks = unit(_rows(k, s, e)).view(bk, nb, c, d)
    b = beta[:, :, s:e].reshape(bk, nb, c, 1)
    g = log_alpha[:, :, s:e].reshape(bk, nb, c).cumsum(-1)
    above = torch.ones(c, c, dtype=torch.bool, device=k.device).triu_(1)
    decay = (g[..., :, None] - g[..., None, :]).masked_fill_(above, float("-inf")).exp_()
    del above
    kb = ks * b
    lower = (kb @ ks.transpose(-2, -1)) * decay  # only its strict lower part is read: unit diagonal
    rhs = torch.cat([_rows(v, s, e).view(bk, nb, c, -1) * b, kb * g.exp()[..., None]], dim=-1)
    del kb
    x = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
    del lower, rhs
    return g, decay, ks, x


def _segment(q, k, v, log_alpha, beta, S, out, s: int, e: int, c: int):
    """Tokens s:e: the recurrence over its chunks, U_c = Ũ_c − W_c S and S ← γ_C S + (K̂_c decayed to the chunk's
    end)ᵀ U_c; then, with outputs, O = (Q̂ K̂ᵀ ⊙ Γ) U + (γ ⊙ Q̂) S_before for all its chunks at once."""
    B, Hk, _, d = k.shape
    bk, nb, dv = B * Hk, (e - s) // c, v.shape[-1]
    g, decay, ks, x = _prepare(k, v, log_alpha, beta, s, e, c)
    u_tilde, w = x[..., :dv], x[..., dv:]
    kd = ks * (g[..., -1:] - g).exp_()[..., None]  # k̂ decayed to the end of its chunk
    last = g[..., -1].exp()  # (bk, nb): the decay across a whole chunk
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, log_alpha, beta, S))
    before = S.new_empty(bk, nb, d, dv) if out is not None and not grad else None
    us, states = [], []
    for j in range(nb):
        if grad:
            states.append(S)
            u = torch.baddbmm(u_tilde[:, j], w[:, j], S, alpha=-1)
            us.append(u)
            S = torch.baddbmm(S * last[:, j, None, None], kd[:, j].transpose(-2, -1), u)
        else:
            if before is not None:
                before[:, j].copy_(S)
            u = u_tilde[:, j].baddbmm_(w[:, j], S, alpha=-1)  # in place: Ũ becomes U
            S.mul_(last[:, j, None, None]).baddbmm_(kd[:, j].transpose(-2, -1), u)
    del w, kd, last
    if out is None:
        return S
    group = q.shape[1] // Hk
    U = torch.stack(us, 1) if grad else u_tilde
    before = torch.stack(states, 1) if grad else before
    del x, u_tilde, us, states
    qs = unit(_grouped_rows(q, s, e, Hk, c)).mul_(d ** -0.5)  # (bk, nb, group·c, d): q̂ of a chunk's group
    scores = (qs @ ks.transpose(-2, -1)).view(bk, nb, group, c, c) * decay[:, :, None]
    del ks, decay
    qs = qs.view(bk, nb, group, c, d) * g.exp()[:, :, None, :, None]  # γ_r q̂_r reads the state its chunk entered with
    o = (qs.view(bk * nb, -1, d) @ before.view(bk * nb, d, dv))
    del qs
    o = o + scores.view(bk * nb, -1, c) @ U.reshape(bk * nb, c, dv) if grad else o.baddbmm_(
        scores.view(bk * nb, -1, c), U.reshape(bk * nb, c, dv))
    target = out[:, :, s:e].unflatten(1, (Hk, group)).unflatten(3, (nb, c)).transpose(2, 3)
    target.copy_(o.view(B, Hk, nb, group, c, dv))
    return S


# -- gates: seeded defaults drawn outside the kernel -------------------------------------------------------------
def draw_gates(B: int, Hk: int, n: int, *, seed: int = 0, device=None, dtype=torch.float32) -> dict:
    """{'alpha': (B, Hk, n), 'beta': (B, Hk, n)}, one gate pair per key/value head and token: α = exp(−dt) with dt
    log-uniform in DT_RANGE = [0.001, 0.1] (Mamba's initial step sizes, Gu and Dao 2023, arXiv 2312.00752: α from
    0.905 to 0.999, memories of 10 to 1000 tokens), β = sigmoid(z), z uniform in [−2, 2] (0.12 to 0.88: a sigmoid of
    a zero-mean projection, neither ignoring a token nor overwriting its slot). Drawn position by position from one
    uniform stream, so the first m tokens' gates are the same whatever n: a generated token gets the gates a forward
    pass over the longer sequence would give it. float32 for half dtypes (bfloat16 cannot tell 0.999 from 1)."""
    u = torch.rand(n, 2, B, Hk, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    low, high = (math.log(x) for x in DT_RANGE)
    alpha = torch.exp(-torch.exp(low + (high - low) * u[:, 0]))
    beta = torch.sigmoid(BETA_LOGIT * (2 * u[:, 1] - 1))
    keep = work_dtype(dtype)
    return {name: t.permute(1, 2, 0).to(device=device, dtype=keep).contiguous()
            for name, t in (("alpha", alpha), ("beta", beta))}


def init_state(shape: Shape, device=None, dtype=torch.float32, *, seed: int = 0, chunk: int = 32) -> dict:
    """Seeded default gates for shape's tokens (`draw_gates`): {'alpha', 'beta'}, each (B, Hk, Nk). `chunk` is
    checked against the spec; the gates do not depend on it."""
    SPEC.check_params({"chunk": chunk}, shape)
    return draw_gates(shape.B, shape.key_heads, shape.Nk, seed=seed, device=device, dtype=dtype)


def _gates(k: torch.Tensor, alpha, beta, seed: int, key_padding_mask=None, *, longer: bool = False):
    """(log α, β) (B, Hk, n) in the work dtype: the given gates, checked (shape (B, Hk, n), or at least n tokens when
    `longer`, of which the first n are taken; α in (0, 1], β in [0, 1], except inside validated()), or the seeded
    defaults. Padded keys get α = 1, β = 0: the state passes them unchanged, as if they were not there."""
    B, Hk, n, _ = k.shape
    work = work_dtype(k.dtype)
    drawn = draw_gates(B, Hk, n, seed=seed, device=k.device, dtype=k.dtype) if alpha is None or beta is None else {}
    alpha, beta = (drawn[name] if t is None else _checked_gate(name, t, k, longer)[..., :n]
                   for name, t in (("alpha", alpha), ("beta", beta)))
    alpha, beta = alpha.to(work), beta.to(work)
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, :]
        alpha, beta = alpha.masked_fill(pad, 1.0), beta.masked_fill(pad, 0.0)
    return alpha.log(), beta


def _checked_gate(name: str, t, k: torch.Tensor, longer: bool) -> torch.Tensor:
    if trusted():
        return t
    B, Hk, n, _ = k.shape
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() != 3 or tuple(t.shape[:2]) != (B, Hk) \
            or (t.shape[2] < n if longer else t.shape[2] != n):
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        tokens = f"at least {n}" if longer else f"{n}"
        raise ValueError(f"{name} must be a floating tensor of shape (batch, key/value heads, tokens) = ({B}, {Hk}, "
                         f"{tokens}), one gate per key/value head and token, got {got}; init_state draws one")
    if t.device != k.device:
        raise ValueError(f"{name} is on {t.device} but the keys are on {k.device}; move it with "
                         f"{name}.to({str(k.device)!r})")
    low_ok = bool((t > 0).all()) if name == "alpha" else bool((t >= 0).all())
    if not (low_ok and bool((t <= 1).all())):
        allowed = "in (0, 1]: a decay, 1 keeps the state whole" if name == "alpha" else "in [0, 1]: a write strength"
        raise ValueError(f"{name} must lie {allowed}; got values from {float(t.min()):.3g} to {float(t.max()):.3g}")
    return t


# -- the mechanism -------------------------------------------------------------------------------------------------
def gated_deltanet_attention(q, k, v, *, causal: bool = True, key_padding_mask=None, chunk: int = 32, alpha=None,
                             beta=None, seed: int = 0):
    """o_t = S_t q̂_t with S₀ = 0, S_t = α_t S_{t−1} (I − β_t k̂_t k̂_tᵀ) + β_t v_t k̂_tᵀ (S_t: d_v × d_k), k̂ = k/‖k‖,
    q̂ = q/(‖q‖·√d): causal by construction (causal=False is refused), self-attention only.

    q (B, H, n, D), k, v (B, Hk, n, D) → (B, H, n, D). `alpha`, `beta` (B, Hk, n): the decay and write-strength gates
    of each key/value head (`init_state` draws seeded ones; None: drawn here from `seed`). Hk < H: the state depends
    on k, v and the gates only, so one state per key/value head, read in place by its H/Hk query heads.
    Runs the chunked form (`chunked`, chunks of `chunk` tokens): O(n·(C + d)·d) time, O(n·d) memory (the output and
    one segment's chunk tensors; nothing n × n). Half inputs are computed in float32.
    `key_padding_mask` (B, n), True where the key is padding: α = 1 and β = 0 there, so the state passes a padded
    token unchanged (later queries see the unpadded keys alone); a query with no unpadded key before it outputs 0.
    """
    checked_shape(SPEC, q, k, v, causal, chunk=chunk)
    if key_padding_mask is not None:
        check_key_padding(SPEC, key_padding_mask, q, k)
    log_alpha, b = _gates(k, alpha, beta, seed, key_padding_mask)
    return chunked(q, k, v, log_alpha, b, chunk)[0]


# -- generation: the recurrence is the step --------------------------------------------------------------------
class DeltaCache(Cache):
    """The state after the tokens so far, `state` = S_tᵀ (B, Hk, d_k, d_v) in the work dtype, one per key/value
    head, whatever the context; and the gates of the tokens to come, `alpha` and `beta` (B, Hk, L) from position
    `start` on: inputs of future steps (a model computes them from each new token; here they were given, or are
    drawn from `seed` at their positions), so not counted in `nbytes`, as Performer's projection is not."""

    def __init__(self, params: dict, k: torch.Tensor, state: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor,
                 seed: int):
        super().__init__(params, k)
        self.state = state.view(k.shape[0], k.shape[1], *state.shape[-2:])
        self.start, self.alpha, self.beta, self.seed = k.shape[2], alpha, beta, seed

    def next_gates(self) -> tuple[torch.Tensor, torch.Tensor]:
        """α and β of the token at position `length`, (B, Hk, 1, 1) views; past the stream, the seeded defaults of
        positions up to twice as far are drawn first (once, amortized O(1) a token)."""
        i = self.length - self.start
        if i >= min(self.alpha.shape[-1], self.beta.shape[-1]):
            self.alpha, self.beta = _stream(self.alpha, self.beta, self.start, 2 * self.length + 1, self.seed)
        return self.alpha[:, :, i, None, None], self.beta[:, :, i, None, None]

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.state,)


def _stream(alpha: torch.Tensor, beta: torch.Tensor, start: int, stop: int, seed: int):
    """The gates of positions start:stop: those held of each (B, Hk, L) from `start`, then its seeded defaults."""
    if start + min(alpha.shape[-1], beta.shape[-1]) >= stop:
        return alpha, beta
    drawn = draw_gates(alpha.shape[0], alpha.shape[1], stop, seed=seed, device=alpha.device, dtype=alpha.dtype)
    return tuple(torch.cat([t, drawn[name][..., start + t.shape[-1]:]], -1) if start + t.shape[-1] < stop else t
                 for name, t in (("alpha", alpha), ("beta", beta)))


def _cache(k, state, alpha, beta, max_len, chunk: int, seed: int) -> DeltaCache:
    """The cache of a prompt k (B, Hk, n, D) with final `state`: the gates given past the prompt kept for the
    steps, each followed by its seeded defaults up to `max_len`."""
    (B, Hk, n, _), work = k.shape, state.dtype
    ahead = [t[..., n:].to(work) if t is not None else state.new_empty(B, Hk, 0) for t in (alpha, beta)]
    return DeltaCache({"chunk": chunk}, k, state, *_stream(*ahead, n, max(max_len or 0, n + 1), seed), seed)


def _remember(k, v, *, max_len: int | None = None, chunk: int = 32, alpha=None, beta=None, seed: int = 0):
    """The state S_nᵀ after the prompt (d_k × d_v per key/value head, by the chunked form without its outputs):
    O(n·(C + d)·d) time, O(d²) kept. `alpha`, `beta` may cover more tokens than the prompt: the rest are the gates
    of the tokens to come."""
    log_alpha, b = _gates(k, alpha, beta, seed, longer=True)
    _, state = chunked(None, k, v, log_alpha, b, chunk, outputs=False)
    return _cache(k, state, alpha, beta, max_len, chunk, seed)


def _prefill(q, k, v, *, max_len: int | None = None, chunk: int = 32, alpha=None, beta=None, seed: int = 0):
    """The prompt's outputs and its state from one chunked pass."""
    log_alpha, b = _gates(k, alpha, beta, seed, longer=True)
    out, state = chunked(q, k, v, log_alpha, b, chunk)
    return out, _cache(k, state, alpha, beta, max_len, chunk, seed)


def _step(q, k, v, cache: DeltaCache):
    """S ← α S (I − β k̂ k̂ᵀ) + β v k̂ᵀ in place (as Sᵀ ← α Sᵀ + k̂ uᵀ, u = β (v − α S k̂)), then o = S q̂ for each
    query head of a group: O(d²) time and state, whatever the context."""
    S = cache.state  # (B, Hk, d_k, d_v)
    a, b = cache.next_gates()
    ks = unit(k.to(S.dtype))  # (B, Hk, 1, d)
    u = (v.to(S.dtype) - a * (ks @ S)).mul_(b)
    S.mul_(a).addcmul_(ks.transpose(-2, -1), u)  # += k̂ uᵀ without a (d, d) temporary
    cache.length += 1
    heads, Hk = q.shape[1], S.shape[1]
    qs = unit(q.to(S.dtype).reshape(q.shape[0], Hk, heads // Hk, -1)) * q.shape[-1] ** -0.5  # a group reads S once
    return (qs @ S).view(q.shape[0], heads, 1, -1).to(cache.dtype), cache


def _cache_bytes(s: Shape, chunk: int = 32) -> float:
    return s.bk * s.D * s.D * max(s.elem, 4)  # S per key/value head, float32 for half inputs


def _step_flops(s: Shape, chunk: int = 32) -> float:
    """Per key/value head: k̂ᵀ S (2·d²), α·S (d²), the rank-one update k̂ uᵀ (2·d²); per query head the read q̂ᵀ S
    (2·d²). Normalising k and q and forming u are O(d)."""
    return 5.0 * s.bk * s.D * s.D + 2.0 * s.bh * s.D * s.D


# -- what it costs ---------------------------------------------------------------------------------------------
def _chunk_flops(s: Shape, c: int, useful: bool) -> float:
    """Matmul FLOPs of one chunk of c tokens per key/value head, its group of H/Hk query heads included: K̂ᵀ-products
    β K̂ K̂ᵀ (2·c²·d; useful: the c(c−1)/2 cells below the diagonal), the unit-triangular solve for [Ũ, W]
    (c(c−1)·2d: one multiply-add per cell below the diagonal and right-side column), U = Ũ − W S and the state's
    update (2·c·d² each); per query head Q̂ K̂ᵀ and its product with U (2·c²·d each; useful: the c(c+1)/2 cells
    on and below the diagonal) and the read of the state (2·c·d²)."""
    d = s.D
    cells, lower, strict = c * c, c * (c + 1) / 2, c * (c - 1) / 2
    keys = 2.0 * d * (strict if useful else cells) + 2.0 * c * (c - 1) * d + 4.0 * c * d * d
    queries = 4.0 * d * (lower if useful else cells) + 2.0 * c * d * d
    return s.bk * keys + s.bh * queries


def _segments(s: Shape, chunk: int) -> list[tuple[int, int, int]]:
    """(how many, tokens, chunk) of each kind of segment `chunked` runs (`causal_chunks`): the whole segments (a
    whole number of chunks each), then the last one's whole chunks and its remainder as one short chunk. O(1)."""
    rows = segment_rows(s.bk, s.D, chunk, s.device)
    whole, rest = divmod(s.Nk, rows)
    kinds = [(whole, rows, chunk), (1, rest // chunk * chunk, chunk), (1, rest % chunk, rest % chunk)]
    return [kind for kind in kinds if kind[0] and kind[1]]


def _flops(s: Shape, chunk: int = 32) -> float:
    return sum(m * (r // c) * _chunk_flops(s, c, True) for m, r, c in _segments(s, chunk))


def _executed_flops(s: Shape, chunk: int = 32) -> float:
    return sum(m * (r // c) * _chunk_flops(s, c, False) for m, r, c in _segments(s, chunk))


def _memory(s: Shape, chunk: int = 32) -> float:
    """Peak bytes above the inputs: the output, log α (B·Hk·n) and the carried state, plus the largest set of one
    segment's tensors alive at once, in the order `_prepare` and `_segment` make them (numbers per token: key-side
    ones per key/value head, query-side ones per query head; a segment's states before each chunk d²/C per token).
    Half inputs copy the segment's rows of k, v and q to float32 for a moment; shared heads copy q's rows into the
    grouped order. Gates given as contiguous (B, Hk, n) tensors in the work dtype (init_state's) are read in place."""
    d, g, w = s.D, s.group, max(s.elem, 4)
    cp = d if s.elem < w else 0  # a segment's float32 copy of k, v or q rows
    cq = d if cp or g > 1 else 0
    alive = 0.0
    for _, r, c in _segments(s, chunk):
        keys = max(cp + d + 1,  # k̂ of the segment's rows, from a float32 copy of half rows
                   2 * d + 1 + 3 * c,  # k̂, g, Γ, β k̂, (β k̂) K̂ᵀ and L
                   3 * d + 2 * c + 1 + cp,  # then β v from v's float32 copy
                   6 * d + 2 * c + 2,  # β v, γ β k̂ (and γ) beside [β v, γ β k̂], the solve's right side
                   5 * d + 2 * c + 1)  # the solve's result beside its right side
        states = d * d / c
        queries = max(3 * d + 1 + c + states + g * (cq + d + 1),  # q̂ of the segment, from a copy
                      3 * d + 1 + c + states + g * (d + 2 * c),  # Q̂ K̂ᵀ and its decayed product
                      2 * d + 2 + states + g * (2 * d + c),  # γ q̂ beside q̂
                      2 * d + 1 + states + g * (2 * d + c))  # the output rows beside γ q̂ and the products
        alive = max(alive, s.bk * r * max(keys, queries))  # per key/value head, its group's query rows included
    fixed = s.bh * s.Nq * d * s.elem + (s.bk * s.Nk + s.bk * d * d) * w
    return fixed + alive * w


def _effective(q, k, v, causal: bool, state: dict, chunk: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """o_t = Σ_i M_ti v_i with M = (Q̂ K̂ᵀ ⊙ Γ)(I + L)⁻¹ diag(β), the whole sequence as one chunk (Γ_ti = γ_t/γ_i
    for i ≤ t, L_ti = β_t Γ_ti k̂_t·k̂_i for i < t): the decayed, delta-corrected mixing matrix (shared heads and
    their gates repeated: a dense picture, not a kernel)."""
    alpha, beta = state.get("alpha"), state.get("beta")
    if alpha is None or beta is None:
        alpha, beta = draw_gates(*k.shape[:3], device=k.device, dtype=k.dtype).values()
    k, v, alpha, beta = repeated(q, k, v, alpha.to(q.dtype), beta.to(q.dtype))
    qs, ks = unit(q) * q.shape[-1] ** -0.5, unit(k)
    g = alpha.log().cumsum(-1)
    n = g.shape[-1]
    above = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
    decay = (g[..., :, None] - g[..., None, :]).masked_fill(above, float("-inf")).exp()
    lower = (ks * beta[..., None]) @ ks.transpose(-2, -1) * decay
    mix = torch.linalg.solve_triangular(lower, torch.diag_embed(beta), upper=False, unitriangular=True)
    return (qs @ ks.transpose(-2, -1)) * decay @ mix, v


SPEC = MechanismSpec(
    label="Gated DeltaNet",
    fn=gated_deltanet_attention,
    description="A d×d memory per head, decayed by a gate α and corrected by the delta rule at each token (writes "
                "β·(v − S k̂) k̂ᵀ): linear in n, causal; its own model, not an approximation of softmax.",
    paper="Yang, Kautz and Hatamizadeh 2024, 'Gated Delta Networks: Improving Mamba2 with Delta Rule', "
          "arXiv 2412.06464",
    params=(Param("chunk", 32, 1, 1024, "Tokens per chunk of the WY form: a C×C solve inside each chunk, the "
                  "d×d state carried between chunks. The output does not depend on it.", log=True, tokens=True,
                  small=lambda n: 8),),
    exact=False,
    state=State(init=init_state, keys=("alpha", "beta")),
    cost=Cost(flops=_flops, executed_flops=_executed_flops, memory_bytes=_memory, time_big_o="O(n·(C + d)·d)",
              memory_big_o="O(n·d)"),
    supports=Supports(
        causal=True,
        cross=False,
        causal_only="the state S_t is built from tokens 1 … t, one after another: the recurrence is causal by "
                    "construction, with no form in which a query reads later keys",
        padding=True,
        shared_kv=True,
        generation=Generation(remember=_remember, step=_step, cache_bytes=_cache_bytes, prefill=_prefill,
                              step_flops=_step_flops, step_big_o="O(d²)", cache_big_o="O(d²)"),
    ),
    insight=Insight(
        effective=_effective,
        regime=("local", "peaky", "Gated DeltaNet is its own model, not an approximation of softmax: its decay "
                "favours recent tokens (local inputs), and a unit-norm key cannot single out one of many keys as a "
                "sharp softmax does (peaky inputs)."),
        accuracy_note="Gated DeltaNet is not an approximation of softmax: these errors are the distance between a "
                      "decayed, delta-corrected d×d memory with random, untrained gates (the paper learns them) and "
                      "softmax attention, not an approximation error.",
    ),
)

"""Kimi Delta Attention: the gated delta rule with a decay for each key channel (Kimi Team 2025, 'Kimi Linear: An
Expressive, Efficient Attention Architecture', arXiv 2510.26692)."""
from __future__ import annotations

import math

import torch

from ..spec import Cost, Generation, Insight, MechanismSpec, Param, Shape, State, Supports
from ._cache import Cache
from ._common import check_key_padding, checked_shape, repeated, trusted, workspace
from ._cpu import caches
from ._linear_core import _grouped_rows, _rows, causal_chunks, work_dtype
from .gated_deltanet import BETA_LOGIT, DT_RANGE, _chunk_flops, unit

SEGMENT_BYTES = caches().own  # one segment's chunk tensors, all key/value heads, float32: the cores' own L2, as
# gated_deltanet's (see `segment_rows`, `_cpu.Caches.own`)
# The chunk's products are formed as (k̂ ⊙ e^γ)(k̂ ⊙ e^−γ)ᵀ while a chunk's decay, −γ at its end, stays within this
# many nats in every channel: e^−γ then neither overflows nor, times the smallest k̂ entry, loses digits to
# subnormals (float32: e^80 < 3.4·10³⁸, and a subnormal's 1.4·10⁻⁴⁵ times e^80 is 8·10⁻¹¹). Past it (gates of a
# strongly decaying channel, α < 0.08 a token at C = 32), the relative decays e^(γ_r − γ_i) ≤ 1 are taken pair by pair.
SPAN = {torch.float32: 80.0, torch.float64: 600.0}


# -- the three forms: the plain recurrence (reference), the chunked form (what runs), the step (generation) --------
def recurrence(q, k, v, alpha, beta) -> torch.Tensor:
    """The definition, token by token (the reference, O(n·d²), slow): S₀ = 0,
    S_t = S_{t−1} Diag(α_t) (I − β_t k̂_t k̂_tᵀ) + β_t v_t k̂_tᵀ, o_t = S_t q̂_t with q̂ = unit(q)/√d.
    q (B, H, n, D), k, v (B, Hk, n, D), alpha (B, Hk, n, D), beta (B, Hk, n) (shared heads repeated first)
    → (B, H, n, D)."""
    k, v, alpha, beta = repeated(q, k, v, alpha, beta)
    qs, ks = unit(q) / math.sqrt(q.shape[-1]), unit(k)
    S = q.new_zeros(*q.shape[:2], v.shape[-1], q.shape[-1])  # (B, H, d_v, d_k)
    eye = torch.eye(q.shape[-1], dtype=q.dtype, device=q.device)
    outs = []
    for t in range(q.shape[2]):
        kt, a, b = ks[:, :, t], alpha[:, :, t, None, :], beta[:, :, t, None, None]
        S = (S * a) @ (eye - b * kt[..., :, None] * kt[..., None, :]) + b * v[:, :, t, :, None] * kt[..., None, :]
        outs.append((S @ qs[:, :, t, :, None])[..., 0])
    return torch.stack(outs, dim=2)


def segment_rows(bk: int, d: int, chunk: int, device: str = "cpu") -> int:
    """Tokens per segment: a segment's chunk tensors (per key/value head and token about 9·d + 2·C numbers: k̂, γ,
    e^γ, k̂ ⊙ e^−γ, the solve's two right sides and its result, q̂ ⊙ e^γ, the C-wide products) fill SEGMENT_BYTES (on a
    GPU, `workspace`'s multiple), in whole chunks, at least 8 (as gated_deltanet's `segment_rows`)."""
    per_token = 4 * bk * (9 * d + 2 * chunk)
    return max(workspace(SEGMENT_BYTES, device) // per_token // chunk, 8) * chunk


def chunked(q, k, v, log_alpha, beta, chunk: int, *, outputs: bool = True):
    """The chunked (WY) form: (out (B, H, n, D) in v's dtype, or None when `outputs` is False; the final states
    (B·Hk, d_k, d_v)). q (B, H, n, D) (None without outputs), k, v (B, Hk, n, D), log_alpha (B, Hk, n, D) and beta
    (B, Hk, n) in the work dtype. Segments of `segment_rows` tokens in whole chunks of C, the last chunk the
    remainder; each segment's chunks prepared together (`_prepare`), then the chunk recurrence over them one by one,
    carrying S (d_k × d_v per key/value head, stored as Sᵀ)."""
    B, Hk, n, d = k.shape
    group = 1 if q is None else q.shape[1] // Hk
    out = torch.empty(B, Hk * group, n, v.shape[-1], dtype=v.dtype, device=v.device) if outputs else None
    S = torch.zeros(B * Hk, d, v.shape[-1], dtype=work_dtype(v.dtype), device=v.device)
    for s, e, c in causal_chunks(n, segment_rows(B * Hk, d, chunk, k.device.type), chunk):
        S = _segment(q, k, v, log_alpha, beta, S, out, s, e, c)
    return out, S


def _prepare(k, v, log_alpha, beta, s: int, e: int, c: int):
    """The chunks of tokens s:e in parallel, per key/value head (bk = B·Hk, nb chunks of c): γ, the cumulative
    log-decay of each channel inside its chunk (bk, nb, c, d); e^γ; k̂; `keys`, what the chunk's products read the
    keys as (`_keys`); and the UT transform's solve (I + L) X = diag(β) [V, e^γ ⊙ K̂] with L_ri = β_r Σ_c k̂_rc k̂_ic
    e^(γ_rc − γ_ic) (i < r): X = [Ũ, W], so that a chunk entered with state S writes U = Ũ − W S (S as d_k × d_v)."""
    bk, nb, d = k.shape[0] * k.shape[1], (e - s) // c, k.shape[-1]
    ks = unit(_rows(k, s, e)).view(bk, nb, c, d)
    b = beta[:, :, s:e].reshape(bk, nb, c, 1)
    g = log_alpha[:, :, s:e].reshape(bk, nb, c, d).cumsum(-2)
    eg = g.exp()
    keys = _keys(ks, g, eg)
    kb = ks * b
    kbg = kb * eg
    lower = _pairs(kb, kbg, keys)  # only its strict lower part is read: unit diagonal
    del kb
    rhs = torch.cat([_rows(v, s, e).view(bk, nb, c, -1) * b, kbg], dim=-1)
    del kbg
    x = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
    del lower, rhs
    return g, eg, ks, keys, x


def _keys(ks: torch.Tensor, g: torch.Tensor, eg: torch.Tensor) -> tuple[str, torch.Tensor]:
    """The keys as the chunk's products read them: ('scaled', k̂ ⊙ e^−γ) while every chunk's decay stays within
    SPAN, so that a product Σ_c x_rc k̂_ic e^(γ_rc − γ_ic) is one matmul (x ⊙ e^γ)(k̂ ⊙ e^−γ)ᵀ; else ('pairs', the
    (c, c, d) keys k̂_ic e^(γ_rc − γ_ic) of each row r, 0 for i > r), each decay at most 1."""
    if float(g[..., -1, :].detach().amin()) >= -SPAN[g.dtype]:
        return "scaled", ks / eg
    above = torch.ones(g.shape[-2], g.shape[-2], dtype=torch.bool, device=g.device).triu_(1)[..., None]
    rel = (g[..., :, None, :] - g[..., None, :, :]).masked_fill_(above, float("-inf")).exp_()  # (bk, nb, c, c, d)
    return "pairs", rel * ks[..., None, :, :]


def _pairs(x: torch.Tensor, xg: torch.Tensor, keys: tuple[str, torch.Tensor]) -> torch.Tensor:
    """P_ρi = Σ_c x_ρc k̂_ic e^(γ_rc − γ_ic) for the rows ρ of x (bk, nb, m·c, d), r = ρ mod c, and xg = x ⊙ e^γ_r:
    (bk, nb, m·c, c), right for i ≤ r (the caller masks i > r, or reads below the diagonal only)."""
    kind, t = keys
    if kind == "scaled":
        return xg @ t.transpose(-2, -1)
    bk, nb, c, _, d = t.shape
    rows = x.view(bk, nb, -1, c, d).transpose(2, 3)  # (bk, nb, c, m, d): the m rows at position r meet t[r]
    return (rows @ t.transpose(-2, -1)).transpose(2, 3).reshape(bk, nb, -1, c)


def _segment(q, k, v, log_alpha, beta, S, out, s: int, e: int, c: int):
    """Tokens s:e: the recurrence over its chunks, U_c = Ũ_c − W_c S and S ← Diag(e^γ_C) S + (K̂_c decayed to the
    chunk's end)ᵀ U_c; then, with outputs, O = P U + (e^γ ⊙ Q̂) S_before for all its chunks at once, P_ri = Σ_c
    q̂_rc k̂_ic e^(γ_rc − γ_ic) for i ≤ r (`_pairs`)."""
    B, Hk, _, d = k.shape
    bk, nb, dv = B * Hk, (e - s) // c, v.shape[-1]
    g, eg, ks, keys, x = _prepare(k, v, log_alpha, beta, s, e, c)
    u_tilde, w = x[..., :dv], x[..., dv:]
    last = eg[..., -1, :]  # (bk, nb, d): each channel's decay across a whole chunk
    # k̂ decayed to the end of its chunk: e^γ_C (k̂ ⊙ e^−γ) while scaled, else e^(γ_C − γ) taken whole
    kd = keys[1] * last[:, :, None] if keys[0] == "scaled" else ks * (g[..., -1:, :] - g).exp_()
    del ks, g
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, log_alpha, beta, S))
    before = S.new_empty(bk, nb, d, dv) if out is not None and not grad else None
    us, states = [], []
    for j in range(nb):
        if grad:
            states.append(S)
            u = torch.baddbmm(u_tilde[:, j], w[:, j], S, alpha=-1)
            us.append(u)
            S = torch.baddbmm(S * last[:, j, :, None], kd[:, j].transpose(-2, -1), u)
        else:
            if before is not None:
                before[:, j].copy_(S)
            u = u_tilde[:, j].baddbmm_(w[:, j], S, alpha=-1)  # in place: Ũ becomes U
            S.mul_(last[:, j, :, None]).baddbmm_(kd[:, j].transpose(-2, -1), u)
    del w, kd, last
    if out is None:
        return S
    group = q.shape[1] // Hk
    U = torch.stack(us, 1) if grad else u_tilde
    before = torch.stack(states, 1) if grad else before
    del x, u_tilde, us, states
    qs = unit(_grouped_rows(q, s, e, Hk, c)).mul_(d ** -0.5)  # (bk, nb, group·c, d): q̂ of a chunk's group
    qg = (qs.view(bk, nb, group, c, d) * eg[:, :, None]).view(bk, nb, -1, d)  # e^γ_r q̂_r
    scores = _pairs(qs, qg, keys).view(bk, nb, group, c, c)
    del keys, qs, eg
    above = torch.ones(c, c, dtype=torch.bool, device=k.device).triu_(1)
    scores = scores.masked_fill(above, 0.0) if grad else scores.masked_fill_(above, 0.0)
    o = qg.view(bk * nb, -1, d) @ before.view(bk * nb, d, dv)  # e^γ_r q̂_r reads the state its chunk entered with
    del qg
    o = o + scores.view(bk * nb, -1, c) @ U.reshape(bk * nb, c, dv) if grad else o.baddbmm_(
        scores.view(bk * nb, -1, c), U.reshape(bk * nb, c, dv))
    target = out[:, :, s:e].unflatten(1, (Hk, group)).unflatten(3, (nb, c)).transpose(2, 3)
    target.copy_(o.view(B, Hk, nb, group, c, dv))
    return S


# -- gates: seeded defaults drawn outside the kernel -------------------------------------------------------------
def draw_gates(B: int, Hk: int, n: int, d: int, *, seed: int = 0, device=None, dtype=torch.float32) -> dict:
    """{'alpha': (B, Hk, n, d), 'beta': (B, Hk, n)}: a decay per key/value head, token and key channel, a write
    strength per key/value head and token, drawn as gated_deltanet's (α = exp(−dt), dt log-uniform in
    DT_RANGE = [0.001, 0.1], each channel its own; β = sigmoid(z), z uniform in [−2, 2]). Drawn position by position
    from one uniform stream, so the first m tokens' gates are the same whatever n; float32 for half dtypes."""
    u = torch.rand(n, d + 1, B, Hk, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    low, high = (math.log(x) for x in DT_RANGE)
    alpha = torch.exp(-torch.exp(low + (high - low) * u[:, :d]))  # (n, d, B, Hk)
    beta = torch.sigmoid(BETA_LOGIT * (2 * u[:, d] - 1))  # (n, B, Hk)
    keep = work_dtype(dtype)
    return {"alpha": alpha.permute(2, 3, 0, 1).to(device=device, dtype=keep).contiguous(),
            "beta": beta.permute(1, 2, 0).to(device=device, dtype=keep).contiguous()}


def init_state(shape: Shape, device=None, dtype=torch.float32, *, seed: int = 0, chunk: int = 32) -> dict:
    """Seeded default gates for shape's tokens (`draw_gates`): {'alpha' (B, Hk, Nk, D), 'beta' (B, Hk, Nk)}. `chunk`
    is checked against the spec; the gates do not depend on it."""
    SPEC.check_params({"chunk": chunk}, shape)
    return draw_gates(shape.B, shape.key_heads, shape.Nk, shape.D, seed=seed, device=device, dtype=dtype)


def _gates(k: torch.Tensor, alpha, beta, seed: int, key_padding_mask=None, *, longer: bool = False):
    """(log α (B, Hk, n, D), β (B, Hk, n)) in the work dtype: the given gates, checked (or at least n tokens when
    `longer`, of which the first n are taken), or the seeded defaults. Padded keys get α = 1, β = 0: the state
    passes them unchanged."""
    B, Hk, n, d = k.shape
    work = work_dtype(k.dtype)
    drawn = draw_gates(B, Hk, n, d, seed=seed, device=k.device, dtype=k.dtype) if alpha is None or beta is None else {}
    alpha = drawn["alpha"] if alpha is None else _checked_gate("alpha", alpha, k, longer)[:, :, :n]
    beta = drawn["beta"] if beta is None else _checked_gate("beta", beta, k, longer)[:, :, :n]
    alpha, beta = alpha.to(work), beta.to(work)
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, :]
        alpha, beta = alpha.masked_fill(pad[..., None], 1.0), beta.masked_fill(pad, 0.0)
    return alpha.log(), beta


def _checked_gate(name: str, t, k: torch.Tensor, longer: bool) -> torch.Tensor:
    if trusted():
        return t
    B, Hk, n, d = k.shape
    dims, tail = (4, (d,)) if name == "alpha" else (3, ())
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() != dims \
            or tuple(t.shape[:2]) != (B, Hk) or tuple(t.shape[3:]) != tail \
            or (t.shape[2] < n if longer else t.shape[2] != n):
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        tokens = f"at least {n}" if longer else f"{n}"
        what = (f"(batch, key/value heads, tokens, head_dim) = ({B}, {Hk}, {tokens}, {d}), one decay per key/value "
                f"head, token and key channel" if name == "alpha" else
                f"(batch, key/value heads, tokens) = ({B}, {Hk}, {tokens}), one write strength per key/value head "
                f"and token")
        raise ValueError(f"{name} must be a floating tensor of shape {what}, got {got}; init_state draws one")
    if t.device != k.device:
        raise ValueError(f"{name} is on {t.device} but the keys are on {k.device}; move it with "
                         f"{name}.to({str(k.device)!r})")
    low_ok = bool((t > 0).all()) if name == "alpha" else bool((t >= 0).all())
    if not (low_ok and bool((t <= 1).all())):
        allowed = "in (0, 1]: a decay, 1 keeps the channel whole" if name == "alpha" else "in [0, 1]: a write strength"
        raise ValueError(f"{name} must lie {allowed}; got values from {float(t.min()):.3g} to {float(t.max()):.3g}")
    return t


# -- the mechanism -------------------------------------------------------------------------------------------------
def kda_attention(q, k, v, *, causal: bool = True, key_padding_mask=None, chunk: int = 32, alpha=None, beta=None,
                  seed: int = 0):
    """o_t = S_t q̂_t with S₀ = 0, S_t = S_{t−1} Diag(α_t) (I − β_t k̂_t k̂_tᵀ) + β_t v_t k̂_tᵀ (S_t: d_v × d_k),
    k̂ = k/‖k‖, q̂ = q/(‖q‖·√d): Gated DeltaNet with a decay for each key channel; causal by construction
    (causal=False is refused), self-attention only.

    q (B, H, n, D), k, v (B, Hk, n, D) → (B, H, n, D). `alpha` (B, Hk, n, D), `beta` (B, Hk, n): the decay of each
    key/value head, token and key channel, and the write strength of each key/value head and token (`init_state`
    draws seeded ones; None: drawn here from `seed`). Hk < H: one state per key/value head, read in place by its H/Hk
    query heads. Runs the chunked form (`chunked`, chunks of `chunk` tokens): O(n·(C + d)·d) time, O(n·d) memory.
    Half inputs are computed in float32. `key_padding_mask` (B, n), True where the key is padding: α = 1 and β = 0
    there, so the state passes a padded token unchanged; a query with no unpadded key before it outputs 0.
    """
    checked_shape(SPEC, q, k, v, causal, chunk=chunk)
    if key_padding_mask is not None:
        check_key_padding(SPEC, key_padding_mask, q, k)
    log_alpha, b = _gates(k, alpha, beta, seed, key_padding_mask)
    return chunked(q, k, v, log_alpha, b, chunk)[0]


# -- generation: the recurrence is the step --------------------------------------------------------------------
class KDACache(Cache):
    """The state after the tokens so far, `state` = S_tᵀ (B, Hk, d_k, d_v) in the work dtype, one per key/value
    head, whatever the context; and the gates of the tokens to come, `alpha` (B, Hk, L, D) and `beta` (B, Hk, L)
    from position `start` on: inputs of future steps, so not counted in `nbytes` (as gated_deltanet's)."""

    def __init__(self, params: dict, k: torch.Tensor, state: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor,
                 seed: int):
        super().__init__(params, k)
        self.state = state.view(k.shape[0], k.shape[1], *state.shape[-2:])
        self.start, self.alpha, self.beta, self.seed = k.shape[2], alpha, beta, seed

    def next_gates(self) -> tuple[torch.Tensor, torch.Tensor]:
        """α (B, Hk, D, 1) and β (B, Hk, 1, 1) of the token at position `length`; past the stream, the seeded
        defaults of positions up to twice as far are drawn first (once, amortized O(1) a token)."""
        i = self.length - self.start
        if i >= min(self.alpha.shape[2], self.beta.shape[2]):
            self.alpha, self.beta = _stream(self.alpha, self.beta, self.start, 2 * self.length + 1, self.seed)
        return self.alpha[:, :, i, :, None], self.beta[:, :, i, None, None]

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.state,)


def _stream(alpha: torch.Tensor, beta: torch.Tensor, start: int, stop: int, seed: int):
    """The gates of positions start:stop: those held from `start` on, then the seeded defaults."""
    if start + min(alpha.shape[2], beta.shape[2]) >= stop:
        return alpha, beta
    B, Hk, _, d = alpha.shape
    drawn = draw_gates(B, Hk, stop, d, seed=seed, device=alpha.device, dtype=alpha.dtype)
    return tuple(torch.cat([t, drawn[name][:, :, start + t.shape[2]:]], 2) if start + t.shape[2] < stop else t
                 for name, t in (("alpha", alpha), ("beta", beta)))


def _cache(k, state, alpha, beta, max_len, chunk: int, seed: int) -> KDACache:
    """The cache of a prompt k (B, Hk, n, D) with final `state`: the gates given past the prompt kept for the steps,
    each followed by its seeded defaults up to `max_len`."""
    (B, Hk, n, d), work = k.shape, state.dtype
    ahead = (alpha[:, :, n:].to(work) if alpha is not None else state.new_empty(B, Hk, 0, d),
             beta[:, :, n:].to(work) if beta is not None else state.new_empty(B, Hk, 0))
    return KDACache({"chunk": chunk}, k, state, *_stream(*ahead, n, max(max_len or 0, n + 1), seed), seed)


def _remember(k, v, *, max_len: int | None = None, chunk: int = 32, alpha=None, beta=None, seed: int = 0):
    """The state S_nᵀ after the prompt (d_k × d_v per key/value head, by the chunked form without its outputs):
    O(n·(C + d)·d) time, O(d²) kept. `alpha`, `beta` may cover more tokens than the prompt: the tokens to come."""
    log_alpha, b = _gates(k, alpha, beta, seed, longer=True)
    _, state = chunked(None, k, v, log_alpha, b, chunk, outputs=False)
    return _cache(k, state, alpha, beta, max_len, chunk, seed)


def _prefill(q, k, v, *, max_len: int | None = None, chunk: int = 32, alpha=None, beta=None, seed: int = 0):
    """The prompt's outputs and its state from one chunked pass."""
    log_alpha, b = _gates(k, alpha, beta, seed, longer=True)
    out, state = chunked(q, k, v, log_alpha, b, chunk)
    return out, _cache(k, state, alpha, beta, max_len, chunk, seed)


def _step(q, k, v, cache: KDACache):
    """S ← S Diag(α) (I − β k̂ k̂ᵀ) + β v k̂ᵀ in place (as Sᵀ ← α ⊙ Sᵀ + k̂ uᵀ, u = β (v − (α ⊙ k̂)ᵀ Sᵀ)), then o = S q̂
    for each query head of a group: O(d²) time and state, whatever the context."""
    S = cache.state  # (B, Hk, d_k, d_v)
    a, b = cache.next_gates()  # (B, Hk, d_k, 1), (B, Hk, 1, 1)
    ks = unit(k.to(S.dtype))  # (B, Hk, 1, d)
    u = (v.to(S.dtype) - (ks * a.transpose(-2, -1)) @ S).mul_(b)
    S.mul_(a).addcmul_(ks.transpose(-2, -1), u)  # += k̂ uᵀ without a (d, d) temporary
    cache.length += 1
    heads, Hk = q.shape[1], S.shape[1]
    qs = unit(q.to(S.dtype).reshape(q.shape[0], Hk, heads // Hk, -1)) * q.shape[-1] ** -0.5  # a group reads S once
    return (qs @ S).view(q.shape[0], heads, 1, -1).to(cache.dtype), cache


def _cache_bytes(s: Shape, chunk: int = 32) -> float:
    return s.bk * s.D * s.D * max(s.elem, 4)  # S per key/value head, float32 for half inputs


def _step_flops(s: Shape, chunk: int = 32) -> float:
    """Per key/value head: (α ⊙ k̂)ᵀ S (2·d²), α ⊙ S (d²), the rank-one update k̂ uᵀ (2·d²); per query head the
    read q̂ᵀ S (2·d²), as gated_deltanet's step (α a vector multiplies S's rows, not a number)."""
    return 5.0 * s.bk * s.D * s.D + 2.0 * s.bh * s.D * s.D


# -- what it costs ---------------------------------------------------------------------------------------------
def _segments(s: Shape, chunk: int) -> list[tuple[int, int, int]]:
    """(how many, tokens, chunk) of each kind of segment `chunked` runs: the whole segments, then the last one's
    whole chunks and its remainder as one short chunk. O(1)."""
    rows = segment_rows(s.bk, s.D, chunk, s.device)
    whole, rest = divmod(s.Nk, rows)
    kinds = [(whole, rows, chunk), (1, rest // chunk * chunk, chunk), (1, rest % chunk, rest % chunk)]
    return [kind for kind in kinds if kind[0] and kind[1]]


def _flops(s: Shape, chunk: int = 32) -> float:
    """The matmuls of gated_deltanet's chunk (`_chunk_flops`): a decay per channel changes which keys the products
    read (k̂ ⊙ e^±γ), not their sizes."""
    return sum(m * (r // c) * _chunk_flops(s, c, True) for m, r, c in _segments(s, chunk))


def _executed_flops(s: Shape, chunk: int = 32) -> float:
    return sum(m * (r // c) * _chunk_flops(s, c, False) for m, r, c in _segments(s, chunk))


def _memory(s: Shape, chunk: int = 32) -> float:
    """Peak bytes above the inputs: the output, log α (B·Hk·n·d) and the carried state, plus the largest set of one
    segment's tensors alive at once, in the order `_prepare` and `_segment` make them (numbers per token: key-side
    ones per key/value head, query-side ones per query head; a segment's states before each chunk d²/C per token).
    Gates whose chunks' decays stay within SPAN (the defaults); stronger decays take the pair-by-pair keys, c·d a
    token more. Half inputs copy the segment's rows of k, v and q to float32 for a moment; shared heads copy q's
    rows into the grouped order."""
    d, g, w = s.D, s.group, max(s.elem, 4)
    cp = d if s.elem < w else 0  # a segment's float32 copy of k, v or q rows
    cq = d if cp or g > 1 else 0
    alive = 0.0
    for _, r, c in _segments(s, chunk):
        keys = max(cp + d + 1,  # k̂ of the segment's rows, from a float32 copy of half rows
                   6 * d + c,  # k̂, γ, e^γ, k̂ ⊙ e^−γ, β k̂ and β k̂ ⊙ e^γ beside L
                   6 * d + c + cp,  # then β v from v's float32 copy
                   8 * d + c)  # [β v, β k̂ ⊙ e^γ], the solve's right side, beside its parts and L
        states = d * d / c
        queries = max(7 * d,  # e^γ, k̂ ⊙ e^−γ and [Ũ, W] beside γ, k̂ and k̂ decayed to the chunk's end
                      4 * d + states + g * (cq + d + 1),  # q̂ of the segment, from a copy
                      4 * d + states + g * (2 * d + c))  # e^γ ⊙ q̂ beside q̂ and their products P
        alive = max(alive, s.bk * r * max(keys, queries))  # per key/value head, its group's query rows included
    fixed = s.bh * s.Nq * d * s.elem + (s.bk * s.Nk * d + s.bk * d * d) * w
    return fixed + alive * w


def _effective(q, k, v, causal: bool, state: dict, chunk: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """o_t = Σ_i M_ti v_i with M = P (I + L)⁻¹ diag(β), the whole sequence as one chunk, the decays taken pair by
    pair (P_ti = Σ_c q̂_tc k̂_ic e^(γ_tc − γ_ic) for i ≤ t, L_ti = β_t Σ_c k̂_tc k̂_ic e^(γ_tc − γ_ic) for i < t):
    the decayed, delta-corrected mixing matrix (shared heads and their gates repeated: a dense picture)."""
    alpha, beta = state.get("alpha"), state.get("beta")
    if alpha is None or beta is None:
        alpha, beta = draw_gates(*k.shape[:3], k.shape[-1], device=k.device, dtype=k.dtype).values()
    k, v, alpha, beta = repeated(q, k, v, alpha.to(q.dtype), beta.to(q.dtype))
    qs, ks = unit(q) * q.shape[-1] ** -0.5, unit(k)
    g = alpha.log().cumsum(-2)  # (B, H, n, d)
    n = g.shape[-2]
    above = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)[..., None]
    rel = (g[..., :, None, :] - g[..., None, :, :]).masked_fill(above, float("-inf")).exp() * ks[..., None, :, :]
    lower = (rel @ (ks * beta[..., None])[..., None])[..., 0]  # (B, H, n, n): L_ti, its diagonal unread
    mix = torch.linalg.solve_triangular(lower, torch.diag_embed(beta), upper=False, unitriangular=True)
    return (rel @ qs[..., None])[..., 0] @ mix, v


SPEC = MechanismSpec(
    label="Kimi Delta Attention",
    fn=kda_attention,
    description="Gated DeltaNet with a decay for each key channel: a d×d memory per head whose columns fade at "
                "their own rates α_t ∈ (0, 1)^d and is corrected by the delta rule at each token (writes "
                "β·(v − S Diag(α) k̂) k̂ᵀ): linear in n, causal; its own model, not an approximation of softmax.",
    paper="Kimi Team 2025, 'Kimi Linear: An Expressive, Efficient Attention Architecture', arXiv 2510.26692",
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
        no_rope_relative=("Its decay Diag(α) acts on each key channel, and RoPE turns the channels by the position: "
                          "a common shift changes which rotated features decay, so the output moves (Kimi Linear runs "
                          "its KDA layers without RoPE, the decays carrying the position)."),
        causal_only="the state S_t is built from tokens 1 … t, one after another: the recurrence is causal by "
                    "construction, with no form in which a query reads later keys",
        padding=True,
        shared_kv=True,
        generation=Generation(remember=_remember, step=_step, cache_bytes=_cache_bytes, prefill=_prefill,
                              step_flops=_step_flops, step_big_o="O(d²)", cache_big_o="O(d²)"),
    ),
    insight=Insight(
        effective=_effective,
        regime=("local", "peaky", "Kimi Delta Attention is its own model, not an approximation of softmax: its "
                "decays favour recent tokens (local inputs), and a unit-norm key cannot single out one of many keys "
                "as a sharp softmax does (peaky inputs)."),
        accuracy_note="Kimi Delta Attention is not an approximation of softmax: these errors are the distance "
                      "between a delta-corrected d×d memory with random, untrained per-channel decays (the paper "
                      "learns them) and softmax attention, not an approximation error.",
    ),
)

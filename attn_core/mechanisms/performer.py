"""Performer's FAVOR+: softmax attention estimated with positive orthogonal random features
(Choromanski et al. 2020, 'Rethinking Attention with Performers', arXiv 2009.14794)."""
from __future__ import annotations

import math

import torch

from ..spec import Cost, Generation, Insight, MechanismSpec, Param, Shape, State, Supports
from ._cache import StateCache
from ._common import check_key_padding, checked_shape, repeated, row_normalized
from ._linear_core import LOG2E, linear_attention_core, linear_core_flops, linear_core_memory, mapped, work_dtype


def orthogonal_features(features: int, d: int, *, seed: int = 0, device=None, dtype=torch.float32) -> torch.Tensor:
    """(features, d) random projection: stacked blocks of orthogonal rows (QR of Gaussian d×d), each row rescaled
    to the norm of an independent Gaussian vector so its length is distributed as a Gaussian row's."""
    g = torch.Generator().manual_seed(seed)
    w = torch.cat([_haar_orthogonal(d, g) for _ in range(math.ceil(features / d))])[:features]
    w = w * torch.randn(features, d, generator=g).norm(dim=1, keepdim=True)
    return w.to(device=device, dtype=dtype)


def _haar_orthogonal(d: int, g: torch.Generator) -> torch.Tensor:
    """A uniformly random (Haar) d×d orthogonal matrix: QR of a Gaussian, signs fixed by R's diagonal
    (without that fix the rows are biased towards some directions and the kernel estimate with them)."""
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g))
    return (q * torch.sign(torch.diagonal(r))).T


def init_state(shape: Shape, device=None, dtype=torch.float32, *, seed: int = 0, features: int = 256) -> dict:
    """Random state of one Performer layer: {'projection': (features, D)}. A new seed redraws the features.
    `features` is checked against the spec first (features = 0 or 10¹² is refused with a sentence)."""
    SPEC.check_params({"features": features}, shape)
    return {"projection": orthogonal_features(features, shape.D, seed=seed, device=device, dtype=dtype)}


def favor_features(x: torch.Tensor, projection: torch.Tensor, *, is_query: bool) -> torch.Tensor:
    """Positive random features of exp(q·k/√D): φ(x) = exp(w·x' − |x'|²/2 − c)/√m with x' = x/D^¼, w the rows of
    `projection` (m, D). x (B, H, N, D) → (B, H, N, m).

    The stabilizer c is each query's own largest exponent, or one over all keys of a head; both cancel in the
    normalization (the max-subtraction trick). Computed as `query_features` and `key_features` compute it inside
    the kernel, in base 2 on the `base2` projection: one implementation."""
    w = base2(projection)
    return query_features(x, w) if is_query else key_features(x, w)[0]


def base2(projection: torch.Tensor) -> torch.Tensor:
    """The projection scaled by D^-¼·log₂e, (m, D): x·wᵀ is then w·x' in base-2 exponents, 2^(w·x'·log₂e) = e^(w·x')
    (exp2 runs 2.5× faster than exp here) and x' = x/D^¼ is never formed."""
    return projection * (projection.shape[-1] ** -0.25 * LOG2E)


def query_features(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """FAVOR+ features of query rows x (…, D) with `base2` projection w (m, D), each stabilised by its own largest
    exponent: (…, m). |x'|²/2 is part of that stabilizer and never formed."""
    proj = x @ w.T  # (…, m): base-2 exponents
    shift = proj.detach().amax(-1, keepdim=True) + 0.5 * math.log2(w.shape[0])  # the 1/√m folded in
    return proj.sub_(shift).exp2_()  # in place to spare memory


def key_features(x: torch.Tensor, w: torch.Tensor, floor: torch.Tensor | None = None,
                 key_padding_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """FAVOR+ features of key rows x (B, Hk, N, D) with `base2` projection w (m, D), all of a key/value head relative
    to one stabilizer c, the largest exponent max_m w·x' − |x'|²/2 (log₂) over its N keys, at least `floor`:
    (features (B, Hk, N, m), c (B, Hk, 1, 1) in float64). |x'|²/2 is taken in float64 (`half_squared_norm`), so
    finite inputs as large as 10³⁰ give finite features, not inf − inf = NaN. A caller that maps a head's keys chunk
    by chunk, or generates token by token, passes the c so far as `floor` and rescales what it summed before by
    2^(floor − c).
    `key_padding_mask` (B, N), True where the key is padding: its exponent is −inf, so it neither sets c (a large
    padded key would push the real keys' features towards underflow) nor has features (2^−inf = 0)."""
    proj = x @ w.T  # (…, N, m)
    top = proj.detach().amax(-1, keepdim=True)  # (…, N, 1): max_m w·x'
    per_key = top.double() - half_squared_norm(x) * (x.shape[-1] ** -0.5 * LOG2E)  # float64, |x'|² = |x|²/√D
    if key_padding_mask is not None:
        per_key = per_key.masked_fill(key_padding_mask[:, None, :, None], float("-inf"))
    peak = per_key.detach().amax((-2, -1), keepdim=True)
    if key_padding_mask is not None:  # every key padded: c = 0, any finite value would do
        peak = peak.masked_fill(peak == float("-inf"), 0.0)
    if floor is not None:
        peak = torch.maximum(peak, floor)
    # per-key exponent offset −|x'|²/2 + max_m w·x' − c ≤ 0, in float64; −inf shifts give 0, never NaN
    shift = top + 0.5 * math.log2(w.shape[0]) - (per_key - peak).to(proj.dtype)
    return proj.sub_(shift).exp2_(), peak


def half_squared_norm(x: torch.Tensor) -> torch.Tensor:
    """|x|²/2 along the last dim in float64 without overflow: (…, D) → (…, 1). float32 and half inputs are squared in
    float64, where no finite input overflows (|x| < 3.5·10³⁸); float64 inputs are scaled by their largest |entry|
    first."""
    if x.dtype != torch.float64:
        return torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float64).square() / 2
    top = x.detach().abs().amax(-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
    return (torch.linalg.vector_norm(x / top, dim=-1, keepdim=True) * top).square() / 2


def performer_attention(q, k, v, *, causal: bool = False, features: int = 256, projection=None, seed: int = 0,
                        key_padding_mask=None):
    """FAVOR+ estimate of softmax(QKᵀ/√D)V: linear attention with φ = `favor_features`.

    q (B, H, Nq, D), k, v (B, Hk, Nk, D) → (B, H, Nq, D). `projection` (features, D) comes from `init_state`;
    when absent it is drawn here from `seed`. Hk < H (grouped-query attention): φ(K), its stabilizer and the sums
    over keys are made once per key/value head, read in place by the H/Hk query heads sharing it, so sharing costs
    less than multi-head attention. Unbiased for the kernel, error ~ 1/√features. O(n·m·D) time,
    O(n·D) memory: the output and one chunk of rows mapped at a time (causal by chunked prefix sums). float16/bfloat16
    inputs are mapped and summed in float32 (features near exp(−30) vanish in float16), the result cast back.
    `key_padding_mask` (B, Nk) boolean, True where the key is padding: those rows of φ(K) are zero and left out of
    the shared stabilizer, so they add nothing to the numerator or the normaliser, the same as leaving those keys out
    (exact masking); a query that sees no unpadded key outputs zeros.
    """
    shape = checked_shape(SPEC, q, k, v, causal, features=features)
    # only the base-2 projection is held: a half projection's float32 copy goes once it is scaled
    b = base2(_projection(shape, v, features, projection, seed))
    if key_padding_mask is None:  # φ mapped chunk by chunk inside the core, in base 2
        return linear_attention_core(q, k, v, causal, lambda x: query_features(x, b),
                                     lambda x, floor: key_features(x, b, floor), features)
    check_key_padding(SPEC, key_padding_mask, q, k)
    phi_q = query_features(q.to(b.dtype), b)  # φ(Q) first, as without a mask
    return mapped(phi_q, key_features(k.to(b.dtype), b, key_padding_mask=key_padding_mask)[0], v, causal)


def _projection(shape: Shape, v: torch.Tensor, features: int, projection: torch.Tensor | None,
                seed: int) -> torch.Tensor:
    """The random features in the work dtype: `projection` as given (shape checked), or drawn from `seed`."""
    if projection is None:
        projection = init_state(shape, v.device, v.dtype, seed=seed, features=features)["projection"]
    if projection.shape != (features, shape.D):
        raise ValueError(f"projection must have shape ({features}, {shape.D}), got {tuple(projection.shape)}")
    return projection.to(work_dtype(v.dtype))


def _remember(k, v, *, max_len: int | None = None, features: int = 256, projection=None,
              seed: int = 0) -> StateCache:
    """The state Σ φ(k_j) v_jᵀ (m × D), Σ φ(k_j) (m) and the stabilizer c the features share (log₂), one each per
    key/value head: O(m·D) whatever the context; the cache keeps the projection it was built with, in its `base2`
    form."""
    w = base2(_projection(Shape.of(k, k, True), v, features, projection, seed))
    phi_k, offset = key_features(k.to(w.dtype), w)
    return StateCache({"features": features}, k, phi_k, v, offset=offset, projection=w)


def _prefill(q, k, v, *, max_len: int | None = None, features: int = 256, projection=None, seed: int = 0):
    """The causal forward of the prompt and its state from one φ(K)."""
    w = base2(_projection(Shape.of(q, k, True), v, features, projection, seed))
    phi_k, offset = key_features(k.to(w.dtype), w)
    out = mapped(query_features(q.to(w.dtype), w), phi_k, v, True)
    return out, StateCache({"features": features}, k, phi_k, v, offset=offset, projection=w)


def _step(q, k, v, cache: StateCache):
    """Fold the new token into the state, then read it: O(m·D) whatever the context. A key whose exponent passes
    the stabilizer raises it, and the state is rescaled by 2^(c_old − c_new) ≤ 1 (as online softmax does)."""
    w = cache.projection  # base 2
    phi_k, offset = key_features(k.to(w.dtype), w, floor=cache.offset)
    factor = torch.exp2(cache.offset - offset).to(w.dtype)  # (B, Hk, 1, 1), 1 where c did not move
    cache.kv.mul_(factor)
    cache.z.mul_(factor)
    cache.offset.copy_(offset)
    cache.add(phi_k, v)
    return cache.read(query_features(q.to(w.dtype), w)), cache


def _cache_bytes(s: Shape, features: int = 256) -> float:
    # kv and z in the work dtype (float32 for half inputs), the float64 stabilizer, per key/value head
    return s.bk * ((features * s.D + features) * max(s.elem, 4) + 8)


def _step_flops(s: Shape, features: int = 256) -> float:
    """Per key/value head: project k onto the m features (2·m·D) and fold φ(k) vᵀ into the (m × D) state
    (2·m·D + m); per query head: project q (2·m·D) and read the state with φ(q), numerator and normaliser
    (2·m·D + 2·m)."""
    return s.bk * (4.0 * features * s.D + features) + s.bh * (4.0 * features * s.D + 2.0 * features)


def _effective(q, k, v, causal: bool, state: dict, features: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """φ(Q)φ(K)ᵀ with FAVOR+ features from state["projection"], row-normalized (causal: j ≤ i), applied to v (shared
    heads repeated: a dense picture, not a kernel)."""
    k, v = repeated(q, k, v)
    phi_q = favor_features(q, state["projection"], is_query=True)
    phi_k = favor_features(k, state["projection"], is_query=False)
    return row_normalized(phi_q @ phi_k.transpose(-2, -1), causal), v


def _maps_flops(s: Shape, features: int) -> float:
    return 2.0 * (s.bh * s.Nq + s.bk * s.Nk) * features * s.D  # the random projections x' Wᵀ of queries and keys


def _flops(s: Shape, features: int = 256) -> float:
    return _maps_flops(s, features) + linear_core_flops(s, features)


def _executed_flops(s: Shape, features: int = 256) -> float:
    return _maps_flops(s, features) + linear_core_flops(s, features, executed=True)


def _memory(s: Shape, features: int = 256) -> float:
    # Mapping a chunk: queries hold the projection (m per row) and two (rows, 1) maxima; keys the projection, a float64
    # copy of the rows for their norms (2·D numbers of 4 bytes) and five of (rows, 1) for the stabiliser. The base-2
    # projection (m, D) is held throughout.
    m, d = features, s.D
    return linear_core_memory(s, m, m + 2, m + 2 * d + 5) + m * d * max(s.elem, 4)


SPEC = MechanismSpec(
    label="Performer (FAVOR+)",
    fn=performer_attention,
    description="Estimates softmax attention with m positive orthogonal random features: linear in n, approximate.",
    paper="Choromanski et al. 2020, 'Rethinking Attention with Performers', arXiv 2009.14794",
    params=(Param("features", 256, 1, 16384, "Random features m: more is closer to softmax and slower.", log=True),),
    exact=False,
    state=State(init=init_state, keys=("projection",)),
    cost=Cost(flops=_flops, executed_flops=_executed_flops, memory_bytes=_memory, time_big_o="O(n·m·d)",
              memory_big_o="O(n·d)"),
    supports=Supports(
        no_rope_relative=("Its random features exp(ω·x) project the rotated q and k on fixed directions ω: φ(q)·φ(k) "
                          "matches exp(q·k) only on average, so the offset property holds in expectation, not call by "
                          "call."),
        causal=True,
        cross=True,
        padding=True,
        shared_kv=True,
        generation=Generation(remember=_remember, step=_step, cache_bytes=_cache_bytes, prefill=_prefill,
                              step_flops=_step_flops, step_big_o="O(m·d)", cache_big_o="O(m·d)"),
    ),
    insight=Insight(
        effective=_effective,
        regime=("gentle", "gaussian", "FAVOR+ estimates exp(q·k/√D) with random features whose variance grows as "
                "exp(‖q‖² + ‖k‖²)/√D: with unit-variance inputs (‖q‖²/√D = 8 at head dimension 64) a few hundred "
                "features cannot tame it (Choromanski et al. 2020, arXiv 2009.14794, Lemma 2)."),
    ),
)

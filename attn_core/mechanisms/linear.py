"""Linear attention with φ(x) = elu(x) + 1 (Katharopoulos et al. 2020, 'Transformers are RNNs', arXiv 2006.16236)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import native
from ..spec import Cost, Generation, Insight, MechanismSpec, Shape, Supports
from ._cache import StateCache
from ._common import check_finite, check_has_values, check_key_padding, checked_shape, repeated, row_normalized, trusted
from ._linear_core import (LOG2E, NATIVE_MIN, elu_attention, elu_flops, elu_memory, linear_attention_core,
                           linear_core_flops, linear_core_memory, mapped, whole_fits, whole_ready, work_dtype)


def feature_map(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = elu(x) + 1 > 0, elementwise: x + 1 for x > 0, eˣ (as 2^(x·log₂e)) otherwise. (…, D) → (…, D).
    The two parts are max(x, 0), by `threshold` (its gradient at 0 is 0; clamp's would be 1 and make φ'(0) = 2), and
    exp(min(x, 0)). (The chunks map with it, not with the C++ pass of the whole-tensor form: a chunk's φ is a few
    hundred KiB, where the custom op's dispatch, about 0.1 ms a call, costs more than the pass saves.)"""
    return F.threshold(x, 0.0, 0.0).add_(x.clamp(max=0).mul_(LOG2E).exp2_())


def _key_map(x: torch.Tensor, floor: None) -> tuple[torch.Tensor, None]:
    return feature_map(x), None  # no stabiliser: elu + 1 of finite input is finite


def linear_attention(q, k, v, *, causal: bool = False, key_padding_mask=None):
    """out_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ / φ(q_i)ᵀ Σ_j φ(k_j), j over all keys (causal: j ≤ i).

    q (B, H, Nq, D), k, v (B, Hk, Nk, D) → (B, H, Nq, D). Not softmax: a different, cheaper similarity. Hk < H
    (grouped-query attention): φ(K) and the sums over keys are made once per key/value head, read in place by the
    H/Hk query heads sharing it, so sharing costs less than multi-head attention.
    O(n·D²) time; O(n·D) memory. float32/float64 forward calls on a CPU (on a GPU: whose tensors fit the shared
    cache) run in a few large operations (`elu_attention`, by groups of heads, causal by segments of positions:
    steady when another process holds a core), float32 with AVX-512 or AVX2 in one C++ call that reads q, k and v
    once (`native.linear`; causal where B·Hk holds a key/value head for each thread); half-precision inputs, calls
    autograd records and longer ones on a GPU run cache-blocked chunk by chunk (`linear_attention_core`), half inputs
    in float32 (φ(q)·Σφ(k) overflows float16: NaN at inputs × 30).
    `key_padding_mask` (B, Nk) boolean, True where the key is padding: those rows of φ(K) are zeroed, so they add
    nothing to the numerator or the normaliser, the same as leaving those keys out (exact masking); a query that
    sees no unpadded key outputs zeros.
    NaN or ±inf in q, k or v: a ValueError naming the tensor (outside `validated()`, where the caller checked them);
    the whole-tensor form notices them in its sums and normalizers instead of reading the inputs again.
    """
    checked_shape(SPEC, q, k, v, causal)
    if not trusted():
        check_has_values(q=q, k=k, v=v)
    if key_padding_mask is None and whole_ready(q, k, v, causal):
        return elu_attention(q, k, v, causal)  # notices NaN and inf in its sums and normalizers
    if not trusted():
        check_finite(q=q, k=k, v=v)
    if key_padding_mask is None:
        return linear_attention_core(q, k, v, causal, feature_map, _key_map, q.shape[-1])
    check_key_padding(SPEC, key_padding_mask, q, k)
    work = work_dtype(v.dtype)
    phi_q = feature_map(q.to(work))
    return mapped(phi_q, feature_map(k.to(work)).masked_fill_(key_padding_mask[:, None, :, None], 0.0), v, causal)


def _effective(q, k, v, causal: bool, state: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """φ(Q)φ(K)ᵀ row-normalized (causal: j ≤ i), applied to v (shared heads repeated: a dense picture, not a
    kernel)."""
    k, v = repeated(q, k, v)
    return row_normalized(feature_map(q) @ feature_map(k).transpose(-2, -1), causal), v


def _flops(s: Shape) -> float:
    return linear_core_flops(s, s.D)  # φ = elu + 1 is elementwise: no matmul


def _whole(s: Shape) -> bool:
    """The call runs `elu_attention` (float32/float64 inputs that `whole_fits`; forward, as the engine times it)."""
    return s.elem >= 4 and whole_fits(s.bh, max(s.Nq, s.Nk), s.D, s.causal, s.device)


def _executed_flops(s: Shape) -> float:
    if _whole(s) and s.causal and _fused(s):
        return _fused_causal_flops(s)
    if _whole(s):
        return elu_flops(s.bh, s.bk, s.Nq, s.Nk, s.D, s.causal)
    return linear_core_flops(s, s.D, executed=True)


def _fused(s: Shape) -> bool:
    """The call runs in one C++ call (`native.linear`, as `native.linear_runs` decides): float32 on a CPU whose
    library has a vector form, D a multiple of its lanes (contiguous inputs, as the engine makes them); causal, as
    many queries as keys and at least as many key/value heads B·Hk as torch's threads."""
    causal_ok = not s.causal or (s.Nq == s.Nk and s.bk >= torch.get_num_threads())
    lanes = native.linear_lanes() if s.device == "cpu" and s.elem == 4 else 0
    return causal_ok and lanes > 0 and s.D % lanes == 0


def _fused_causal_flops(s: Shape) -> float:
    """The products of linear.cpp's causal call, as its tiles run them (TILE rows by CV vectors of L lanes,
    `native.LINEAR_TILES`): per block of m ≤ C = native.LINEAR_ROWS positions and per query head, the in-block
    products of each tile of rows over the tiles of columns that hold a key at or before one of its rows (2·D a
    cell), their product with V_b up to the tile's last row (2·D a cell), φ(Q_b) times the state and the normalizers
    (2·m·D·(D + 1)); per key/value head the state's update φ(K_b)ᵀV_b (2·m·D²)."""
    c, d = native.LINEAR_ROWS, s.D
    lanes = native.linear_lanes()
    tile, cv = native.LINEAR_TILES[lanes]

    def block(m: int) -> float:
        cells = 0
        for r0 in range(0, m, tile):
            rows = min(tile, m - r0)
            cols = sum(min(cv, c // lanes - c0) * lanes for c0 in range(0, c // lanes, cv) if c0 * lanes < r0 + rows)
            cells += rows * (cols + min(m, r0 + rows))  # scores, then P·V_b up to the tile's last row
        return s.bh * 2.0 * (cells * d + m * d * (d + 1)) + s.bk * 2.0 * m * d * d
    full, rest = divmod(s.Nq, c)
    return full * block(c) + (block(rest) if rest else 0.0)


def _memory(s: Shape) -> float:
    if _whole(s) and _fused(s):  # the output and the kernel's scratch (the states, a block's φ a thread)
        return s.bh * s.Nq * s.D * s.elem + native.linear_scratch_bytes(s.bk, s.bh, s.Nq, s.Nk, s.D, s.causal)
    if _whole(s):
        # φ in one C++ pass for every group (`_linear_core.phi_native` of the queries), no scratch
        in_cpp = s.device == "cpu" and s.elem == 4 and native.elu_expected() and s.bh * s.Nq * s.D >= NATIVE_MIN
        return elu_memory(s.bh, s.bk, s.Nq, s.Nk, s.D, s.causal, s.elem, scratch=not in_cpp, device=s.device) * s.elem
    # φ = elu + 1 of a chunk: two (rows, D) tensors at its peak, the features and the other of clamp(x, max=0)
    return linear_core_memory(s, s.D, 2 * s.D, 2 * s.D)


def _keeps_threads(q=None, k=None, v=None, causal: bool = False, key_padding_mask=None, **_) -> bool:
    """`Cost.keeps_threads`: True for a causal call that the fused C++ kernel runs (`native.linear_runs`: a
    key/value head a task, in one parallel region), so that where other programs hold every core it keeps torch's
    threads. Beside two spinning programs (n = 8192, B = 1, H = 8, D = 64, the 2-core Xeon, 5 rounds, twice) it took
    24–29 ms on two threads against 46 on one; beside one program, where one core is free, 21–27 against 23–25.
    Not causal it stays fitted: its first pass has a task a head, and beside one program two threads took 24–28 ms
    against 12 on one (beside two, 24 either way)."""
    return bool(causal) and key_padding_mask is None and q is not None and native.linear_runs(q, k, v, causal=True)


def _remember(k, v, *, max_len: int | None = None) -> StateCache:
    """The RNN state of Katharopoulos et al. (eq. 8–9): Σ φ(k_j) v_jᵀ (D × D) and Σ φ(k_j) (D) per key/value head,
    whatever the context; `max_len` changes nothing."""
    return StateCache({}, k, feature_map(k.to(work_dtype(v.dtype))), v)


def _step(q, k, v, cache: StateCache):
    """Fold the new token into the state, then read it with φ(q): O(D²) time, whatever the context."""
    work = cache.kv.dtype
    cache.add(feature_map(k.to(work)), v)
    return cache.read(feature_map(q.to(work))), cache


def _cache_bytes(s: Shape) -> float:
    return s.bk * (s.D * s.D + s.D) * max(s.elem, 4)  # a state per key/value head, float32 for half inputs


def _step_flops(s: Shape) -> float:
    """Fold φ(k) vᵀ into each key/value head's (D × D) state (2·D² + D), read it with φ(q) for each query head,
    numerator and normaliser (2·D² + 2·D)."""
    return s.bk * (2.0 * s.D * s.D + s.D) + s.bh * (2.0 * s.D * s.D + 2.0 * s.D)


SPEC = MechanismSpec(
    label="Linear (elu+1)",
    fn=linear_attention,
    description="Replaces exp(q·k) by φ(q)·φ(k) with φ = elu+1, so (φ(K)ᵀV) is computed once: linear in n.",
    paper="Katharopoulos et al. 2020, 'Transformers are RNNs', arXiv 2006.16236",
    params=(),
    exact=False,
    cost=Cost(flops=_flops, executed_flops=_executed_flops, memory_bytes=_memory, time_big_o="O(n·d²)",
              memory_big_o="O(n·d)", keeps_threads=_keeps_threads),
    supports=Supports(
        no_rope_relative=("Its feature map elu(x) + 1 acts on each rotated feature separately, and φ(q)·φ(k) is not a "
                          "function of q·k: the rotation no longer cancels to the offset i − j."),
        causal=True,
        cross=True,
        padding=True,
        shared_kv=True,
        generation=Generation(remember=_remember, step=_step, cache_bytes=_cache_bytes, step_flops=_step_flops,
                              step_big_o="O(d²)", cache_big_o="O(d²)"),
        checks_finite=True,
    ),
    insight=Insight(
        effective=_effective,
        regime=("gentle", "peaky", "elu(x) + 1 is a smooth, positive kernel: it cannot put nearly all of a query's "
                "weight on a few keys, as softmax does when scores spread widely."),
    ),
)

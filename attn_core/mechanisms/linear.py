"""Linear attention with φ(x) = elu(x) + 1 (Katharopoulos et al. 2020, 'Transformers are RNNs', arXiv 2006.16236)."""
from __future__ import annotations

import torch.nn.functional as F

from ..spec import Generation, MechanismSpec, Shape
from ._cache import StateCache
from ._common import check_key_padding, checked_shape, row_normalized
from ._linear_core import linear_attention_core, linear_core_flops, linear_core_memory, work_dtype


def feature_map(x):
    """φ(x) = elu(x) + 1 > 0, elementwise: (…, D) → (…, D)."""
    return F.elu(x).add_(1)


def linear_attention(q, k, v, *, causal: bool = False, key_padding_mask=None):
    """out_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ / φ(q_i)ᵀ Σ_j φ(k_j), j over all keys (causal: j ≤ i).

    q (B, H, Nq, D), k, v (B, H, Nk, D) → (B, H, Nq, D). Not softmax: a different, cheaper similarity.
    O(n·D²) time; O(n·D) memory (causal by chunked prefix sums). `key_padding_mask` (B, Nk) boolean, True where
    the key is padding: those rows of φ(K) are zeroed, so they add nothing to the numerator or the normaliser, the
    same as leaving those keys out (exact masking); a query that sees no unpadded key outputs zeros.
    """
    checked_shape(SPEC, q, k, v, causal)
    work = work_dtype(v.dtype)  # float32 for half inputs: φ(q)·Σφ(k) overflows float16 (NaN at inputs × 30)
    if key_padding_mask is None:
        return linear_attention_core(feature_map(q.to(work)), feature_map(k.to(work)), v, causal)
    check_key_padding(SPEC, key_padding_mask, q, k)
    phi_q = feature_map(q.to(work))
    return linear_attention_core(phi_q, feature_map(k.to(work)).masked_fill_(key_padding_mask[:, None, :, None], 0.0),
                                 v, causal)


def _effective(q, k, v, causal: bool, state: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """φ(Q)φ(K)ᵀ row-normalized (causal: j ≤ i), applied to v."""
    return row_normalized(feature_map(q) @ feature_map(k).transpose(-2, -1), causal), v


def _flops(s: Shape) -> float:
    return linear_core_flops(s.bh, s.Nq, s.Nk, s.D, s.D, s.causal)  # φ = elu + 1 is elementwise: no matmul


def _executed_flops(s: Shape) -> float:
    return linear_core_flops(s.bh, s.Nq, s.Nk, s.D, s.D, s.causal, executed=True)


def _memory(s: Shape) -> float:
    # φ(Q) and φ(K) (float32 for half inputs), then the core.
    return (s.bh * (s.Nq + s.Nk) * s.D * max(s.elem, 4)
            + linear_core_memory(s.bh, s.Nq, s.D, s.D, s.elem, s.causal, s.Nk))


def _remember(k, v, *, max_len: int | None = None) -> StateCache:
    """The RNN state of Katharopoulos et al. (eq. 8–9): Σ φ(k_j) v_jᵀ (D × D) and Σ φ(k_j) (D), whatever the
    context; `max_len` changes nothing."""
    return StateCache("linear", {}, k, feature_map(k.to(work_dtype(v.dtype))), v)


def _step(q, k, v, cache: StateCache):
    """Fold the new token into the state, then read it with φ(q): O(D²) time, whatever the context."""
    work = cache.kv.dtype
    cache.add(feature_map(k.to(work)), v)
    return cache.read(feature_map(q.to(work))), cache


def _cache_bytes(s: Shape) -> float:
    return s.bh * (s.D * s.D + s.D) * max(s.elem, 4)  # in the work dtype: float32 for half inputs


SPEC = MechanismSpec(
    key="linear",
    label="Linear (elu+1)",
    fn=linear_attention,
    description="Replaces exp(q·k) by φ(q)·φ(k) with φ = elu+1, so (φ(K)ᵀV) is computed once: linear in n.",
    paper="Katharopoulos et al. 2020, 'Transformers are RNNs', arXiv 2006.16236",
    params=(),
    exact=False,
    supports_causal=True,
    supports_cross=True,
    time_big_o="O(n·d²)",
    memory_big_o="O(n·d)",
    flops=_flops,
    executed_flops=_executed_flops,
    memory_bytes=_memory,
    effective=_effective,
    padding=True,
    regime=("gentle", "peaky", "elu(x) + 1 is a smooth, positive kernel: it cannot put nearly all of a query's "
            "weight on a few keys, as softmax does when scores spread widely."),
    generation=Generation(remember=_remember, step=_step, cache_bytes=_cache_bytes),
)

"""PyTorch's fused scaled_dot_product_attention (FlashAttention: Dao et al. 2022, arXiv 2205.14135)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import masks
from ..spec import MechanismSpec, Shape
from ._common import checked_shape

_BACKENDS = {0: "math", 1: "flash", 2: "memory-efficient", 3: "cuDNN", 4: "overrideable"}


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False) -> torch.Tensor:
    """softmax(Q Kᵀ/√D) V through torch.nn.functional.scaled_dot_product_attention.

    Shapes as softmax_attention. PyTorch picks the kernel (see `sdpa_backend`): flash on CPU and on recent GPUs,
    memory-efficient or cuDNN otherwise, the unfused math path as a fallback. Fused kernels never hold the n×n
    matrix: O(n²·d) time, O(n) memory; causal kernels skip the masked half.
    """
    checked_shape(SPEC, q, k, v, causal)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False) -> str:
    """The name of the kernel PyTorch's dispatcher chooses for these inputs ('flash', 'math', ...)."""
    try:
        choice = torch._fused_sdp_choice(q, k, v, None, 0.0, causal)  # private, but the dispatcher's own answer
    except (AttributeError, RuntimeError, TypeError):
        return "unknown"
    return _BACKENDS.get(int(choice), "unknown")


def _flops(s: Shape) -> float:
    return (2.0 if s.causal else 4.0) * s.heads * s.Nq * s.Nk * s.D


def _memory(s: Shape) -> float:
    # Fused kernels: the output; tiles live in per-thread scratch (a log-sum-exp row is kept only for backward).
    return float(s.output_bytes)


SPEC = MechanismSpec(
    key="sdpa",
    label="Softmax (fused SDPA)",
    fn=sdpa_attention,
    description="Exact softmax attention in one fused kernel that tiles the computation and never stores n×n.",
    paper="PyTorch scaled_dot_product_attention; FlashAttention, Dao et al. 2022, arXiv 2205.14135",
    params=(),
    exact=True,
    supports_causal=True,
    supports_cross=True,
    time_big_o="O(n²·d)",
    memory_big_o="O(n·d)",
    flops=_flops,
    memory_bytes=_memory,
    pattern=lambda causal: masks.causal if causal else masks.full,
)

"""PyTorch's fused scaled_dot_product_attention (FlashAttention: Dao et al. 2022, arXiv 2205.14135)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import masks
from ..spec import Cost, Generation, Insight, MechanismSpec, Shape, Supports
from ._cache import KVCache, attend, kv_bytes
from ._common import (check_key_padding, check_score_bias, check_sinks, checked_shape, first_key, fold, repeated,
                      scale, sink_weight, unfold, with_options)

_BACKENDS = {0: "math", 1: "flash", 2: "memory-efficient", 3: "cuDNN", 4: "overrideable"}


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                   key_padding_mask: torch.Tensor | None = None,
                   score_bias: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
                   output_gate: torch.Tensor | None = None, qk_norm: bool | torch.Tensor = False) -> torch.Tensor:
    """softmax(Q Kᵀ/√D [+ score_bias]) V through torch.nn.functional.scaled_dot_product_attention.

    Shapes as softmax_attention. PyTorch picks the kernel (see `sdpa_backend`): flash on CPU and on recent GPUs,
    memory-efficient or cuDNN otherwise, the unfused math path as a fallback. Fused kernels never hold the n×n
    matrix: O(n²·d) time, O(n) memory; causal kernels skip the key tiles wholly above the diagonal.
    `key_padding_mask` (B, Nk) boolean, True where the key is padding, becomes a boolean attn_mask (B, 1, 1, Nk)
    (kernels that take no mask, such as CUDA flash, then give way to memory-efficient or math); causal with padding
    needs the joint (B, 1, Nq, Nk) boolean mask, Nq·Nk bytes per batch element, as torch.nn.MultiheadAttention
    builds. A query that sees no unpadded key outputs zeros, whatever the backend does with an empty row.
    k and v with Hk < H heads (grouped-query attention) go in as they are, `enable_gqa=True` (torch ≥ 2.5; the CPU
    flash kernel reads each shared head in place), where a fused kernel takes them so; elsewhere (CUDA in float32,
    an older torch) they are repeated (`in_place`).
    `score_bias`: float, broadcastable to (B, H, Nq, Nk), added to the scaled scores (ALiBi, relative positions:
    attn_core.positions.encodings). It goes in as a float attn_mask, with −∞ where causality or padding forbids: flash
    kernels take no mask, so PyTorch falls back to memory-efficient or math, and the mask is an (Nq, Nk) tensor
    per head it varies over.
    `sinks` (H,): a logit per query head joining every row's denominator with no value (gpt-oss, arXiv 2508.10925),
    through `sink_sdpa`; a row that sees no key outputs zeros.
    `qk_norm` (True, or a (D,) weight): q and k RMS-normalised per head first (Llama 4, Qwen3, Gemma 3).
    `output_gate` (B, H, Nq, D): gate logits g, out ⊙ σ(g) (arXiv 2505.06708, Qwen3-Next).
    """
    if output_gate is not None or qk_norm is not False:
        return with_options(SPEC, sdpa_attention, q, k, v, qk_norm=qk_norm, output_gate=output_gate, causal=causal,
                            key_padding_mask=key_padding_mask, score_bias=score_bias, sinks=sinks)
    checked_shape(SPEC, q, k, v, causal)
    if score_bias is not None:
        check_score_bias(SPEC, score_bias, q, k)
    if sinks is not None:
        check_sinks(SPEC, sinks, q)
    if key_padding_mask is None and score_bias is None:
        return shared_sdpa(q, k, v, is_causal=causal) if sinks is None else sink_sdpa(q, k, v, sinks, causal)
    Nq, Nk = q.shape[-2], k.shape[-2]
    keep = torch.ones(Nq, Nk, dtype=torch.bool, device=q.device).tril_() if causal else None
    if key_padding_mask is not None:
        check_key_padding(SPEC, key_padding_mask, q, k)
        pad = ~key_padding_mask[:, None, None, :]
        keep = pad if keep is None else keep & pad
    if score_bias is not None:  # float: added to the scores, −∞ where keep is False; attn_mask needs (..., Nq, Nk)
        bias = score_bias.to(q.dtype) if score_bias.dim() >= 2 else score_bias.to(q.dtype).expand(Nq, Nk)
        keep = bias if keep is None else bias.masked_fill(~keep, float("-inf"))
    out = shared_sdpa(q, k, v, attn_mask=keep) if sinks is None else sink_sdpa(q, k, v, sinks, False, keep)
    return out if key_padding_mask is None else _zero_dead(out, key_padding_mask, causal)


FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)  # (out, log-sum-exp)


def sink_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, causal: bool,
              mask: torch.Tensor | None = None) -> torch.Tensor:
    """Fused attention whose rows have head h's sink logit a_h in their denominators (no value). Where the kernel
    can hand back each row's log-sum-exp ℓ (`lse_sdpa`: the CPU flash kernel, no gradient asked for), its output
    scaled by σ(ℓ − a_h) (`sink_weight`): O(n·H) more. Elsewhere the sink is a real key (`sink_key_sdpa`)."""
    if _lse_ready(q, k, v, mask):
        out, lse = lse_sdpa(q, k, v, causal, mask)
        return out.mul_(sink_weight(lse, sinks).to(out.dtype))
    return sink_key_sdpa(q, k, v, sinks, causal, mask)


def _lse_ready(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether `lse_sdpa` runs these: on a CPU whose torch has the flash kernel that returns each row's log-sum-exp,
    no gradient asked for (that log-sum-exp carries none), and a mask it takes without an (Nq, Nk) copy (none, a
    float bias, or a boolean one of a row for every query)."""
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    fits = mask is None or mask.is_floating_point() or mask.shape[-2] == 1
    return FLASH_CPU is not None and q.device.type == "cpu" and not grad and fits


def lse_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
             mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(output (B, H, Nq, D), log-sum-exp (B, H, Nq)) of the CPU flash kernel, which takes no shared heads: a call
    for each query head of a group (heads j, r + j, …, one view of q), each against the Hk key/value heads in
    place. A boolean mask becomes a float one of its shape (the kernel takes masks in q's dtype only), with a finite
    floor (a row with no key gets a finite log-sum-exp far below any sink, so weight 0, not NaN)."""
    if mask is not None and not mask.is_floating_point():
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, torch.finfo(q.dtype).min / 2)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    r = q.shape[1] // k.shape[1]
    if r == 1:
        return FLASH_CPU(q, k, v, 0.0, causal, attn_mask=mask)
    out = q.new_empty(q.shape)
    lse = q.new_empty(q.shape[:-1], dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
    for j in range(r):  # query heads j, r + j, 2r + j, …: one of each group
        found, sums = FLASH_CPU(q[:, j::r], k, v, 0.0, causal, attn_mask=mask)
        out[:, j::r], lse[:, j::r] = found, sums
        del found, sums
    return out, lse


def sink_key_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, causal: bool,
                  mask: torch.Tensor | None = None) -> torch.Tensor:
    """The sink as key 0 of a problem with D + 1 dimensions, for any device and with gradients (public API only):
    q' = [q, a_h·√D], key 0 = [0…0, 1] and value 0, the keys [k, 0], scale 1/√D, so key 0 scores a_h on every row
    of head h and the others q·k/√D. Causal (torch's mask is top-left), a zero query row goes first too: row i + 1
    then sees key 0 and keys 0 … i. The mask gains a first column that keeps key 0. Copies q, k, v, O(n·D), and the
    odd dimension slows the kernels (CPU flash: about 2×)."""
    B, H, Nq, D = q.shape
    lead = 1 if causal else 0
    a = (sinks.to(q.dtype) / scale(D))[:, None, None].expand(B, H, Nq + lead, 1)  # a_h·√D
    qx = torch.cat([F.pad(q, (0, 0, lead, 0)), a], dim=-1)  # (B, H, lead + Nq, D + 1)
    kx = F.pad(k, (0, 1, 1, 0))  # (B, Hk, 1 + Nk, D + 1)
    kx[:, :, 0, D] = 1.0
    vx = F.pad(v, (0, 0, 1, 0))
    if mask is not None:
        mask = F.pad(mask, (1, 0), value=0.0 if mask.is_floating_point() else True)
    return shared_sdpa(qx, kx, vx, attn_mask=mask, is_causal=causal, scale=scale(D))[:, :, lead:]


def _zero_dead(out: torch.Tensor, key_padding_mask: torch.Tensor, causal: bool) -> torch.Tensor:
    """out with zeros for the queries that see no unpadded key."""
    Nq, Nk = out.shape[-2], key_padding_mask.shape[-1]
    # query i sees keys up to i (causal) or Nk − 1: none unpadded when the first unpadded key lies past that
    last = torch.arange(Nq, device=out.device) if causal else torch.full((Nq,), Nk - 1, device=out.device)
    dead = first_key(key_padding_mask)[:, None] > last  # (B, Nq)
    return out.masked_fill(dead[:, None, :, None], 0.0)


GQA_NATIVE = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")  # torch ≥ 2.5


def shared_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """F.scaled_dot_product_attention with k, v of Hk ≤ H heads: shared in place (enable_gqa) where a fused kernel
    takes them so (`in_place`), else repeated."""
    if k.shape[1] == q.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    if in_place(q, k, v, kwargs.get("attn_mask"), kwargs.get("is_causal", False)):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)
    return F.scaled_dot_product_attention(q, *repeated(q, k, v), **kwargs)


def in_place(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool) -> bool:
    """Whether shared key/value heads go in as they are (enable_gqa, torch ≥ 2.5): always on the CPU, whose flash
    kernel reads them in place; elsewhere only where the dispatcher picks a fused kernel for them. CUDA's
    memory-efficient kernel takes no enable_gqa, so float32 would run the unfused math path: at n = 8192, H = 8,
    Hk = 2 on an H200 it took 2.0× multi-head attention's time, 3.7× causal (measured here), where k and v repeated
    to H heads run fused."""
    if not GQA_NATIVE:
        return False
    if q.device.type == "cpu":
        return True
    try:  # private: the dispatcher's own answer
        choice = torch._fused_sdp_choice(q, k, v, mask, 0.0, causal, enable_gqa=True)
    except (AttributeError, RuntimeError, TypeError):
        return True
    return _BACKENDS.get(int(choice)) != "math"


def sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False) -> str:
    """The name of the kernel PyTorch's dispatcher chooses for these inputs ('flash', 'math', ...)."""
    if k.shape[1] != q.shape[1] and not in_place(q, k, v, None, causal):
        k, v = repeated(q, k, v)  # as shared_sdpa runs them
    try:
        shared = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
        choice = torch._fused_sdp_choice(q, k, v, None, 0.0, causal, **shared)  # private: the dispatcher's own answer
    except (AttributeError, RuntimeError, TypeError):
        return "unknown"
    return _BACKENDS.get(int(choice), "unknown")


def _flops(s: Shape) -> float:
    cells = s.Nq * (s.Nq + 1) / 2 if s.causal else s.Nq * s.Nk  # causal keeps j ≤ i
    return 4.0 * s.bh * cells * s.D


def _executed_flops(s: Shape) -> float:
    """Q Kᵀ and P V as PyTorch's CPU flash kernel tiles them (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp):
    query blocks of 256 rows (Nq ≥ 768), 64 (Nq ≥ 192) or 32, key blocks of 512. Causal, a query block stops at
    the key block holding its last query but computes that whole block, masking after; non-causal, every cell.
    The fp16 path with oneDNN packing (keys padded to 64) and the GPU kernels, with their own tiles, differ."""
    if not s.causal:
        return 4.0 * s.bh * s.Nq * s.Nk * s.D
    q_split, kv_split = _tiles(s)
    cells = 0
    for first in range(0, s.Nq, q_split):
        rows = min(q_split, s.Nq - first)
        cells += rows * min(s.Nk, -(-(first + rows) // kv_split) * kv_split)  # whole key blocks up to its last query
    return 4.0 * s.bh * cells * s.D


def _tiles(s: Shape) -> tuple[int, int]:
    """(query rows, key columns) of one tile of the CPU flash kernel: 256 × 512 for Nq ≥ 768, 64 × 512 for
    Nq ≥ 192, 32 × 512 below, each cut to the sequence."""
    return min(256 if s.Nq >= 768 else 64 if s.Nq >= 192 else 32, s.Nq), min(512, s.Nk)


def cpu_flash_platform(dtype: str) -> tuple[int, bool]:
    """(threads, packs): the intra-op thread count, each thread holding its own scratch, and whether this CPU's
    flash kernel repacks K and V for AMX tiles in this dtype (bfloat16 with AMX-BF16, float16 with AMX-FP16;
    PyTorch's cpublas::could_pack). The one place the spec reads the machine."""
    has = {"bfloat16": "_is_amx_tile_supported", "float16": "_is_amx_fp16_supported"}.get(dtype)
    packs = bool(has) and bool(getattr(torch.cpu, has, lambda: False)())
    return torch.get_num_threads(), packs


def _memory(s: Shape) -> float:
    """The CPU flash kernel's allocations, all alive at its end (FlashAttentionKernel.cpp, measured op by op):
    the output; the log-sum-exp, fp32 (B, H, Nq); per thread, fp32 scratch for a tile's scores, row max and sum
    and output (qs·ks + 2·qs + qs·D) and, in half precision, the scores again in that dtype; when the kernel
    repacks for AMX (cpu_flash_platform, and enough work per thread to pay for it): K with D padded to even,
    V with each key tile padded to even, per thread a padded query tile when D is odd, and a (ks, D) transpose
    buffer. O(n·d + threads·qs·ks). On a GPU: the output alone (an H200's flash and memory-efficient kernels, the
    allocator's peak at n = 1024 … 32768 measured here), and shared key/value heads repeated where they run so
    (`in_place`: float32 and float64 on CUDA)."""
    if s.device != "cpu":
        repeated_kv = 2 * s.bh * s.Nk * s.D * s.elem if s.group > 1 and s.elem >= 4 else 0
        return float(s.output_bytes + repeated_kv)
    qs, ks = _tiles(s)
    threads, packs = cpu_flash_platform(s.dtype)
    half = s.elem < 4
    tail = (s.Nk - 1) % ks + 1
    even = lambda x: x + x % 2  # noqa: E731
    if packs:  # enough GEMMs per packed element: at least 4 (q tiles per thread × qs × Nk·D) ÷ (B·H·Nk·D)
        per_thread = -(-s.bh * -(-s.Nq // qs) // threads)
        packs = s.Nq >= 64 and s.Nk >= 64 and per_thread * qs >= 4 * s.bh
    ek, ed = (even(ks), even(s.D)) if packs else (ks, s.D)
    scratch = threads * (qs * ks + 2 * qs + qs * s.D) * 4 + (threads * qs * ek * s.elem if half else 0)
    packed = 0
    if packs:
        padded_keys = (s.Nk - 1) // ks * ek + even(tail)
        packed = s.bh * (ed * s.Nk + padded_keys * s.D) * s.elem + threads * ks * s.D * s.elem
        packed += threads * qs * ed * s.elem if s.D % 2 else 0
    return float(s.output_bytes + s.bh * s.Nq * 4 + scratch + packed)



def _biased_memory(s: Shape) -> float:
    """With a float score bias (H, Nq, Nk) and no padding, the CPU dispatcher leaves flash for the math path
    (torch's _scaled_dot_product_attention_math; allocations measured op by op, torch 2.13): in its work dtype w
    (float32 for half inputs, which it upcasts first) the scores and the probabilities, (B, H, Nq, Nk) each, and a
    byte per score (the rows left with no key), and the output; shared key/value heads repeated for every query
    head; causal, the bias with −∞ above the diagonal, one more (H, Nq, Nk) in the input dtype. O(n²): a GPU's
    memory-efficient kernel takes the bias without the scores, so this overestimates there."""
    w = 8 if s.dtype == "float64" else 4
    upcast = (s.bh * s.Nq + 2 * s.bk * s.Nk) * s.D * w if s.elem < w else 0
    repeat = 2 * s.bh * s.Nk * s.D * w if s.key_heads != s.H else 0
    masked = s.H * s.Nq * s.Nk * s.elem if s.causal else 0
    return float(s.bh * s.Nq * s.Nk * (2 * w + 1) + s.bh * s.Nq * s.D * w + upcast + repeat + masked)

def _sinks_memory(s: Shape) -> float:
    """With sinks, no padding or bias. On a CPU (`lse_sdpa`): the flash kernel's own allocations (its output and
    log-sum-exp kept), or, with shared heads, the output and log-sum-exp of all heads beside each group member's call
    (the spec's prediction for B·Hk problems); then the weights σ(ℓ − a), two (B, H, Nq) rows in the log-sum-exp's
    dtype and one in q's for half inputs. Elsewhere (`sink_key_sdpa`): q, k, v copied with a key, a row (causal) and
    a dimension more beside the kernel's output (and the repeated heads, `_memory`)."""
    w = 8 if s.dtype == "float64" else 4
    rows = s.bh * s.Nq
    after = s.output_bytes + rows * (3 * w + (s.elem if s.elem != w else 0))
    if s.device != "cpu":
        lead = 1 if s.causal else 0
        copies = (s.bh * (s.Nq + lead) * (2 * s.D + 1) + s.bk * (s.Nk + 1) * (2 * s.D + 1)) * s.elem
        return float(copies + _memory(Shape(s.B, s.H, s.Nq + lead, s.Nk + 1, s.D, dtype=s.dtype, Hk=s.Hk,
                                            device=s.device)))
    if s.group == 1:
        return float(max(_memory(s), after))
    one = Shape(s.B, s.key_heads, s.Nq, s.Nk, s.D, dtype=s.dtype, causal=s.causal)
    return float(max(s.output_bytes + rows * w + _memory(one), after))


def _remember(k, v, *, max_len: int | None = None, sinks: torch.Tensor | None = None) -> KVCache:
    """Key-value cache of every token, as softmax's."""
    return KVCache({}, k, v, max_len=max_len, sinks=sinks)


def _step(q, k, v, cache: KVCache) -> tuple[torch.Tensor, KVCache]:
    """The new token's query against every cached key through the fused kernel (not causal: it sees them all):
    O(n·d) for a context of n. The query heads sharing a key/value head go in as rows of one query (`fold`), so
    each cached head is read once."""
    keys, values = cache.append(k, v)
    if cache.sinks is not None:  # the sink as one more score column: one row a head, O(n·d) as the kernel
        return attend(q, (keys, values), sinks=cache.sinks), cache
    return unfold(F.scaled_dot_product_attention(fold(q, keys.shape[1]), keys, values), q.shape[1]), cache


def _cache_bytes(s: Shape) -> float:
    """K and V of every token so far."""
    return kv_bytes(s, s.Nk)


SPEC = MechanismSpec(
    label="Softmax (fused SDPA)",
    fn=sdpa_attention,
    description="Exact softmax attention in one fused kernel that tiles the computation and never stores n×n.",
    paper="PyTorch scaled_dot_product_attention; FlashAttention, Dao et al. 2022, arXiv 2205.14135",
    params=(),
    exact=True,
    cost=Cost(flops=_flops, executed_flops=_executed_flops, memory_bytes=_memory, time_big_o="O(n²·d)",
              memory_big_o="O(n·d)", biased_memory_bytes=_biased_memory, sinks_memory_bytes=_sinks_memory),
    supports=Supports(
        causal=True,
        cross=True,
        padding=True,
        shared_kv=True,
        repeats_kv=not GQA_NATIVE,
        score_bias=True,
        sinks=True,
        output_gate=True,
        qk_norm=True,
        generation=Generation(remember=_remember, step=_step, cache_bytes=_cache_bytes, step_big_o="O(n·d)",
                              cache_big_o="O(n·d)"),
    ),
    insight=Insight(pattern=lambda causal: masks.causal if causal else masks.full),
)

"""Input checks and helpers shared by every mechanism."""
from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Any, Iterator

import torch

from ..spec import MechanismSpec, Shape

HALF = (torch.float16, torch.bfloat16)  # half precisions, whose sums and products run in float32

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

# How many times a CPU's chunk a GPU's chunk holds. A chunked kernel sizes its chunks for a CPU's cache (a few MiB,
# so that a chunk is still there for its second product); on a GPU each of a chunk's operations is a kernel launch of
# several microseconds that so small a chunk cannot fill: sigmoid attention at n = 16384 took 1.13 s in chunks of
# 8 rows on an H200 (fused SDPA 16 ms), measured here.
GPU_WORKSPACE = 64
GPUS = ("cuda", "mps")


def workspace(size: int, device: str) -> int:
    """A chunk's workspace (elements or bytes) on `device` (a Shape's device type): `size`, a CPU's, or
    GPU_WORKSPACE times it on a GPU."""
    return size * GPU_WORKSPACE if device in GPUS else size


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q (B, H, Nq, D), k and v (B, Hk, Nk, D) with Hk dividing H (grouped-query attention), one device, one
    floating dtype; ValueError otherwise."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-D tensor (batch, heads, seq, head_dim), got {got}")
        if t.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{name} has dtype {t.dtype}; use float32, float16 or bfloat16")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree on batch and head_dim"
        )
    heads, key_heads = q.shape[1], k.shape[1]
    if key_heads < 1 or heads % key_heads:
        raise ValueError(f"k and v have {key_heads} heads, which does not divide q's {heads}; each key/value head "
                         f"serves a group of query heads, so give k and v {divisors(heads)} heads ({heads}: one per "
                         f"query head, 1: one for all)")
    if min(q.shape) < 1 or k.shape[-2] < 1:
        raise ValueError(f"empty input: q {tuple(q.shape)}, k {tuple(k.shape)}; batch, heads, sequence lengths and "
                         f"head_dim must each be at least 1: pass at least one sequence of at least one token")


def divisors(n: int) -> str:
    """'1, 2, 4 or 8': the key/value head counts that n query heads can share."""
    found = [str(g) for g in range(1, n + 1) if n % g == 0]
    return found[0] if len(found) == 1 else f"{', '.join(found[:-1])} or {found[-1]}"


def check_finite(**tensors: torch.Tensor) -> None:
    """ValueError naming a tensor that holds NaN or ±inf, with counts. One sum per tensor (NaN and ±inf carry
    through a sum, inf − inf included) and one host sync; a sum that overflows from finite values (at least 10³⁸
    in float32) is told apart by the exact count that follows. On the CPU 5.3 ms for three tensors of 32 MiB (a
    sliding-window call at n = 16384, B = 1, H = 8, D = 64, of 51–70 ms), where a min and max per tensor took
    8.5 ms and isfinite(t).all() 21 ms a tensor. Run by the public entry points only (attn_core.attention,
    MultiHeadAttention.forward), not inside the mechanism functions the benchmark times. First, a tensor with no
    values to check (on the meta device, or empty) is refused with a sentence (`check_has_values`)."""
    check_has_values(**tensors)
    sums = torch.stack([t.detach().sum(dtype=torch.float64 if t.dtype == torch.float64 else torch.float32)
                        for t in tensors.values()])
    if bool(torch.isfinite(sums).all()):
        return
    for name, t in tensors.items():
        nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
        if nan or inf:
            raise ValueError(f"{name} holds {nan} NaN and {inf} infinite values; attention of NaN or inf is NaN: "
                             f"clean the input (e.g. torch.nan_to_num) before calling")


def check_has_values(**tensors: torch.Tensor) -> None:
    """ValueError naming a tensor on the meta device (shapes without values: nothing to attend over or to check)
    or one with no elements (a batch of 0, or a sequence of 0 tokens), saying what to pass instead."""
    for name, t in tensors.items():
        if t.is_meta:
            raise ValueError(f"{name} is on the meta device, which holds shapes but no values; build it on a real "
                             f"device (e.g. torch.randn(..., device='cpu')) or move it with {name}.to('cpu')")
        if t.numel() == 0:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, which holds no tokens (a batch of 0, or a sequence "
                             f"of 0 tokens); pass at least one sequence of at least one token")


_VALIDATED: contextvars.ContextVar[bool] = contextvars.ContextVar("attn_core_validated", default=False)


@contextlib.contextmanager
def validated() -> Iterator[None]:
    """Inside, mechanism functions trust their arguments: the measurement engine checks a case once, before it is
    measured, so no timed call pays for argument checking (about 5 µs a call, 14% of softmax at n = 16)."""
    token = _VALIDATED.set(True)
    try:
        yield
    finally:
        _VALIDATED.reset(token)


def autocast_dtype(device: str) -> torch.dtype | None:
    """The dtype torch.autocast casts to on `device` where it is on there, else None."""
    try:
        return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    except (RuntimeError, ValueError):  # a device type autocast does not know
        return None


@contextlib.contextmanager
def own_precision(device: str, tensors: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Runs a mechanism as autocast means it, yielding `tensors` as it takes them: under torch.autocast on `device`,
    the floating-point tensors autocast would cast (not float64) in its dtype, and autocast off inside; elsewhere
    as given. A mechanism sets its own precision (half inputs mapped and summed in float32 where they would
    overflow): autocast re-casting its operations one by one mixed its float32 buffers with bfloat16 products, which
    index_copy_, index_add_, baddbmm and the triangular solve refused (Longformer, BigBird, Reformer, Performer,
    gated DeltaNet, KDA, linear's torch form), so the call runs on inputs in autocast's dtype instead, with the
    result in that dtype, as torch's scaled_dot_product_attention gives it under autocast."""
    dtype = autocast_dtype(device)
    if dtype is None:
        yield tensors
        return
    cast = {name: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
            else t for name, t in tensors.items()}
    with torch.autocast(device, enabled=False):
        yield cast


def trusted() -> bool:
    """True inside `validated()`: the caller has checked the arguments, so a mechanism skips its own checks of
    tensors it takes besides q, k and v (those cost a host sync)."""
    return _VALIDATED.get()


def checked_shape(spec: MechanismSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  **params: Any) -> Shape:
    """Validate tensors and parameters against a spec; return the call's Shape (only the Shape inside
    `validated()`, where the caller has checked them already)."""
    if _VALIDATED.get():
        return Shape.of(q, k, bool(causal))
    check_qkv(q, k, v)
    spec.check_causal(causal)
    shape = Shape.of(q, k, bool(causal))
    spec.check(shape, params)
    return shape


def _refuse_unless(spec: MechanismSpec, capability: str, what: str, why: str, instead: str) -> None:
    """ValueError "<label> cannot take <what>: <why>; choose one of <the mechanisms that can>, <instead>" unless
    spec.supports.<capability>; the spec's own no_<capability> sentence, when it has one, replaces `why`."""
    if getattr(spec.supports, capability):
        return
    from . import MECHANISMS  # the catalogue imports this module

    takers = ", ".join(key for key, s in MECHANISMS.items() if getattr(s.supports, capability))
    why = getattr(spec.supports, f"no_{capability}") or why
    raise ValueError(f"{spec.label} cannot take {what}: {why}; choose one of {takers}, {instead}")


def check_score_bias(spec: MechanismSpec, bias: Any, q: torch.Tensor, k: torch.Tensor) -> None:
    """ValueError with a sentence unless `spec` takes an additive score bias and `bias` is one for these inputs (a
    mechanism's `score_bias=`): a
    floating tensor on q's device broadcastable to (B, H, Nq, Nk). Skipped inside `validated()`; called only when a
    bias is given."""
    if _VALIDATED.get():
        return
    _refuse_unless(spec, "score_bias", "an additive score bias (ALiBi, relative positions)",
                   "it never forms the scores q·k one by one, so there is nothing to add to",
                   "or apply RoPE to q and k instead (attn_core.positions.encodings.rope)")
    full = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    if not isinstance(bias, torch.Tensor) or not bias.is_floating_point():
        got = bias.dtype if isinstance(bias, torch.Tensor) else type(bias).__name__
        raise ValueError(f"score_bias must be a floating-point tensor broadcastable to (batch, heads, queries, keys) = "
                         f"{full}, got {got}; a boolean pattern goes in `mask` instead")
    try:
        fits = bias.dim() <= 4 and torch.broadcast_shapes(bias.shape, full) == full
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"score_bias {tuple(bias.shape)} does not broadcast to (batch, heads, queries, keys) = "
                         f"{full}; e.g. alibi_bias(heads, Nq, Nk) of shape (heads, Nq, Nk) broadcasts as it is")
    if bias.device != q.device:
        raise ValueError(f"score_bias is on {bias.device} but q is on {q.device}; move it with "
                         f"score_bias.to({str(q.device)!r})")


def check_sinks(spec: MechanismSpec, sinks: Any, q: torch.Tensor) -> None:
    """ValueError with a sentence unless `spec` takes attention sinks (`supports.sinks`) and `sinks` is one logit per
    query head for these inputs: a floating tensor of shape (H,) on q's device with finite values. Skipped inside
    `validated()`; called only when sinks are given."""
    if _VALIDATED.get():
        return
    _refuse_unless(spec, "sinks", "attention sinks (a learned logit per head in the softmax's denominator)",
                   "it has no softmax row whose denominator a sink could join", "or drop sinks=")
    heads = q.shape[1]
    if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point():
        got = sinks.dtype if isinstance(sinks, torch.Tensor) else type(sinks).__name__
        raise ValueError(f"sinks must be a floating-point tensor of one logit per query head, shape ({heads},), got "
                         f"{got}; e.g. torch.zeros({heads})")
    if tuple(sinks.shape) != (heads,):
        raise ValueError(f"sinks must have shape (heads,) = ({heads},), one logit per query head, got "
                         f"{tuple(sinks.shape)}")
    if sinks.device != q.device:
        raise ValueError(f"sinks are on {sinks.device} but q is on {q.device}; move them with "
                         f"sinks.to({str(q.device)!r})")
    if not bool(torch.isfinite(sinks).all()):
        raise ValueError("sinks hold NaN or infinite values; a sink is a finite logit (−inf would be no sink: pass "
                         "sinks=None instead)")


def sink_weight(lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """σ(ℓ − a_h) of each row, (B, H, N, 1) in lse's dtype: the share of its softmax mass a row's keys keep when
    head h's sink logit a_h joins the denominator, e^ℓ/(e^ℓ + e^a) (gpt-oss, arXiv 2508.10925; the sink carries no
    value). ℓ (B, H, N) is the row's log-sum-exp over the keys it sees; ℓ = −∞ (no key) gives 0. Multiplying a
    softmax output by it is attention with the sink as an extra zero-valued column, exactly, at O(N·H)."""
    return torch.sigmoid(lse - sinks.to(lse.dtype)[:, None])[..., None]


def group_sinks(sinks: torch.Tensor, key_heads: int, rows: int) -> torch.Tensor:
    """sinks (H,) as the rows of `fold`'s layout: (Hk, r·rows), row ρ of group g the sink of query head
    g·r + ρ // rows."""
    return sinks.view(key_heads, -1, 1).expand(-1, -1, rows).reshape(key_heads, -1)


# -- options of the softmax family: an output gate (Qiu et al. 2025, arXiv 2505.06708; Qwen3-Next's full-attention
# layers) and QK-norm (RMS-normalised q and k per head before the scores: Llama 4, Qwen3, Gemma 3)
QK_NORM_EPS = 1e-6  # Qwen3's and Gemma 3's rms_norm_eps


def check_output_gate(spec: MechanismSpec, gate: Any, q: torch.Tensor) -> None:
    """ValueError with a sentence unless `spec` takes an output gate and `gate` is gate logits for these inputs: a
    tensor of q's shape (B, H, Nq, D), dtype and device. Skipped inside `validated()`."""
    if _VALIDATED.get():
        return
    _refuse_unless(spec, "output_gate", "an output gate", "its output is not one softmax row per query head",
                   "or gate the output yourself: out * torch.sigmoid(gate)")
    if not isinstance(gate, torch.Tensor) or tuple(gate.shape) != tuple(q.shape):
        got = tuple(gate.shape) if isinstance(gate, torch.Tensor) else type(gate).__name__
        raise ValueError(f"output_gate must be gate logits of q's shape (batch, heads, queries, head_dim) = "
                         f"{tuple(q.shape)}, got {got}; draw one with output_gate_logits(shape, seed=0)")
    if gate.dtype != q.dtype or gate.device != q.device:
        raise ValueError(f"output_gate is {gate.dtype} on {gate.device} but q is {q.dtype} on {q.device}; convert "
                         f"it with output_gate.to(q)")


def check_qk_norm(spec: MechanismSpec, qk_norm: Any, q: torch.Tensor) -> None:
    """ValueError with a sentence unless `spec` takes QK-norm and `qk_norm` is True, False or a learned weight: a
    floating tensor (D,) on q's device. Skipped inside `validated()`."""
    if _VALIDATED.get() or qk_norm is False:
        return
    _refuse_unless(spec, "qk_norm", "QK-norm", "it has no scores q·k to normalise",
                   "or normalise q and k yourself before the call (rms_norm)")
    if qk_norm is True:
        return
    D = q.shape[-1]
    if not isinstance(qk_norm, torch.Tensor) or not qk_norm.is_floating_point() or tuple(qk_norm.shape) != (D,):
        got = (f"{qk_norm.dtype} {tuple(qk_norm.shape)}" if isinstance(qk_norm, torch.Tensor)
               else type(qk_norm).__name__)
        raise ValueError(f"qk_norm must be True, False or a floating weight of shape (head_dim,) = ({D},), got {got}")
    if qk_norm.device != q.device:
        raise ValueError(f"the qk_norm weight is on {qk_norm.device} but q is on {q.device}; move it with "
                         f"qk_norm.to({str(q.device)!r})")


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = QK_NORM_EPS) -> torch.Tensor:
    """x / √(mean(x²) + ε) over the last dimension [· weight] (Zhang & Sennrich 2019, arXiv 1910.07467), summed in
    float32 for half inputs, returned in x's dtype. O(numel) time."""
    work = x.float() if x.dtype in HALF else x
    out = work * torch.rsqrt(work.pow(2).mean(-1, keepdim=True) + eps)
    return (out if weight is None else out * weight.to(out.dtype)).to(x.dtype)


def with_options(spec: MechanismSpec, attend: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                 qk_norm: bool | torch.Tensor, output_gate: torch.Tensor | None, **kwargs: Any) -> torch.Tensor:
    """`attend(q, k, v, **kwargs)` with the softmax family's options, each checked with a sentence: q and k
    RMS-normalised first (`qk_norm`), the output gated by σ(`output_gate`) after. O(n·H·D) on top of `attend`."""
    if output_gate is not None:
        check_output_gate(spec, output_gate, q)
    check_qk_norm(spec, qk_norm, q)
    out = attend(*(qk_normed(q, k, qk_norm) if qk_norm is not False else (q, k)), v, **kwargs)
    return out if output_gate is None else out * torch.sigmoid(output_gate)


def qk_normed(q: torch.Tensor, k: torch.Tensor, qk_norm: bool | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k RMS-normalised per head and position (`rms_norm`), one learned (D,) weight for both where given."""
    weight = None if qk_norm is True else qk_norm
    return rms_norm(q, weight), rms_norm(k, weight)


def output_gate_logits(shape: Shape, device=None, dtype=torch.float32, *, seed: int = 0) -> torch.Tensor:
    """Seeded gate logits (B, H, Nq, D), standard normal: in a model g = x W_g, a projection of the layer's input;
    here state drawn outside the kernel and passed as `output_gate=`."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape.B, shape.H, shape.Nq, shape.D, generator=g, dtype=torch.float64).to(device=device,
                                                                                                   dtype=dtype)


def check_key_padding(spec: MechanismSpec, mask: Any, q: torch.Tensor, k: torch.Tensor) -> None:
    """ValueError with a sentence unless `spec` takes a key-padding mask and `mask` is one for these inputs: a boolean
    (B, Nk) tensor on k's device, True where the key is padding. Skipped inside `validated()`. Callers call it only
    when a mask is given, so the default None costs nothing."""
    if _VALIDATED.get():
        return
    _refuse_unless(spec, "padding", "a key-padding mask", "it has no masked form",
                   "or run each sequence at its own length")
    B, Nk = k.shape[0], k.shape[-2]
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"key_padding_mask must be a boolean tensor of shape (batch, keys) = ({B}, {Nk}), got "
                         f"{type(mask).__name__}; build it e.g. as torch.arange({Nk}) >= lengths[:, None]")
    if mask.dtype != torch.bool:
        raise ValueError(f"key_padding_mask must be boolean (True where the key is padding), got {mask.dtype}; "
                         f"convert it with mask.bool() if 1 marks padding")
    if tuple(mask.shape) != (B, Nk):
        raise ValueError(f"key_padding_mask must have shape (batch, keys) = ({B}, {Nk}), got {tuple(mask.shape)}")
    if mask.device != k.device:
        raise ValueError(f"key_padding_mask is on {mask.device} but the keys are on {k.device}; move it with "
                         f"mask.to({str(k.device)!r})")


def first_key(key_padding_mask: torch.Tensor) -> torch.Tensor:
    """(B,) index of each batch element's first unpadded key, Nk where every key is padding."""
    nk = key_padding_mask.shape[-1]
    where = torch.arange(nk, device=key_padding_mask.device).masked_fill(key_padding_mask, nk)
    return where.amin(-1)


def softmax_or_zeros(scores: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(scores) @ v for scores (B, H, Nq, Nk) with −inf where a key is masked or padded, and v (B, Hk, Nk, D)
    (`grouped_matmul`): a row with no key left is filled with 0 before the softmax (uniform, not NaN, so its
    gradients stay finite) and outputs zeros. Fills `scores` in place. `sinks` (H,): each row scaled by
    `sink_weight` of its log-sum-exp (one (Nq, Nk) temporary while it is summed, beside the scores)."""
    dead = scores.amax(-1, keepdim=True) == float("-inf")
    scores.masked_fill_(dead, 0.0)
    weight = None if sinks is None else sink_weight(torch.logsumexp(scores, -1), sinks).masked_fill(dead, 0.0)
    out = grouped_matmul(torch.softmax(scores, dim=-1).masked_fill(dead, 0.0), v)
    return out if weight is None else out * weight.to(out.dtype)


def grouped_matmul(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """p (B, H, N, L) @ v (B, Hk, L, D) → (B, H, N, D), each key/value head read in place by its group of query
    heads (`fold`): weights times values of grouped-query attention without repeating v."""
    return unfold(fold(p, v.shape[1]) @ v, p.shape[1])


def scale(d: int) -> float:
    """1/√d, the scaling of 'Attention Is All You Need'."""
    return 1.0 / math.sqrt(d)


def row_normalized(scores: torch.Tensor, causal: bool) -> torch.Tensor:
    """Rows of non-negative similarities (B, H, Nq, Nk), causal-masked (j ≤ i), divided by their sums: the weights a
    kernel-feature mechanism applies, written out densely."""
    if causal:
        scores = scores.tril()
    return scores / scores.sum(-1, keepdim=True).clamp_min(torch.finfo(scores.dtype).tiny)


# -- key/value heads shared by groups of query heads (grouped-query attention, Ainslie et al. 2023, arXiv 2305.13245)
def fold(q: torch.Tensor, key_heads: int) -> torch.Tensor:
    """q (B, H, N, D) → (B, Hk, (H/Hk)·N, D): the query heads that share a key/value head stacked as rows of one
    problem, so each shared head is read in place, once per group (a view of a contiguous q). Query head i goes with
    key/value head ⌊i·Hk/H⌋, torch's enable_gqa order; row ρ of a group is query position ρ mod N."""
    B, H, N, D = q.shape
    return q.reshape(B, key_heads, (H // key_heads) * N, D)


def unfold(out: torch.Tensor, heads: int) -> torch.Tensor:
    """Inverse of `fold`: (B, Hk, (H/Hk)·N, D) → (B, H, N, D)."""
    B, _, rows, D = out.shape
    return out.reshape(B, heads, rows * out.shape[1] // heads, D)


def repeated(q: torch.Tensor, *kv: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """k and v (B, Hk, N, D) with each head repeated for the H/Hk query heads that share it: (B, H, N, D). For a
    mechanism whose per-head work cannot read a shared head in place (spec.supports.repeats_kv): the memory of
    multi-head attention; the tensors themselves when Hk = H."""
    group = q.shape[1] // kv[0].shape[1]
    return kv if group == 1 else tuple(t.repeat_interleave(group, dim=1) for t in kv)

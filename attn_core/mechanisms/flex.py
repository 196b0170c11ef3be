"""One mask, three implementations: a mechanism defined by a mask run by our kernel ("ours"), by compiled
FlexAttention ("flex": torch.nn.attention.flex_attention, PyTorch ≥ 2.5; Dong et al. 2024, 'Flex Attention: A
Programming Model for Generating Optimized Attention Kernels', arXiv 2412.05496) and by SDPA with a dense boolean mask
("dense-mask"). Flex's mask_mod and the dense mask are both built from the mechanism's own predicate (its spec's
Insight.pattern, over attn_core.masks), so the three cannot drift apart."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from attn_core import masks
from attn_core.positions import encodings as positional
from attn_core.mechanisms import MECHANISMS
from attn_core.mechanisms.sdpa import shared_sdpa
from attn_core.mechanisms.softmax import softmax_attention
from attn_core.native import cache
from attn_core.spec import Shape

IMPLEMENTATIONS = ("ours", "flex", "dense-mask")
# The mechanisms that are masked softmax under a pattern (exact, with an Insight.pattern): the ones Flex and a dense
# mask can run as well.
MASKED = ("softmax", "sliding_window", "local", "sparse", "longformer", "bigbird")
# Distinct graphs Flex may compile (one per mask and per class of n) before Dynamo gives up and runs it eagerly;
# Dynamo's own default (8) is reached by a sweep of a few masks.
RECOMPILE_LIMIT = 64

Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class FlexUnavailable(RuntimeError):
    """torch.compile cannot build FlexAttention on this machine (no C++ compiler, an unsupported platform): a missing
    capability, never a failing kernel (`missing_capability`)."""


class EagerFallback(RuntimeError):
    """Compiled FlexAttention ran eagerly (Dynamo's recompile limit, or a frame it skipped): an unfused call that
    materializes n × n scores, which must never be reported as Flex's time."""


@dataclass(frozen=True)
class Masking:
    """What a masked call keeps: query i of sequence b sees key j iff pattern(i, j) and key j of b is not padding
    (`key_padding_mask` (B, Nk) bool, True on padding; None: no padding)."""

    pattern: masks.Pattern
    key_padding_mask: torch.Tensor | None = None

    def mask_mod(self) -> Callable[..., torch.Tensor]:
        """Flex's mask_mod(b, h, q_idx, kv_idx): the same predicate on scalar indices."""
        pattern, pad = self.pattern, self.key_padding_mask
        if pad is None:
            return lambda b, h, i, j: pattern(i, j)
        return lambda b, h, i, j: pattern(i, j) & ~pad[b, j]

    def dense(self, nq: int, nk: int, device: torch.device | str | None = None) -> torch.Tensor:
        """(B or 1, 1, nq, nk) bool, True where attention is allowed: O(nq·nk) memory."""
        keep = masks.dense_mask(self.pattern, nq, nk, device)[None, None]
        if self.key_padding_mask is None:
            return keep
        return keep & ~self.key_padding_mask[:, None, None, :].to(keep.device)


@dataclass(frozen=True)
class OneTime:
    """The one-time costs of an implementation, kept apart from its time per call: `mask_s` builds its mask (Flex's
    create_block_mask, the dense boolean mask), `compile_s` is its first call when that call compiled (NaN: nothing
    was compiled, the graph came from Dynamo's cache of this process)."""

    mask_s: float = math.nan
    compile_s: float = math.nan


def cost_of(implementation: str, shape: Shape, useful_flops: float) -> tuple[float, float]:
    """(executed FLOPs, predicted peak bytes above the inputs) of one forward call by "flex" or "dense-mask".
    flex: the useful FLOPs (a lower bound: it computes whole 128 × 128 blocks, skipping only empty ones), the output
    and the block mask's indices; dense-mask: every cell, 4·B·H·Nq·Nk·D, and the (B, 1, Nq, Nk) boolean mask and a
    float copy of it as SDPA's additive mask beside the output."""
    blocks = -(-shape.Nq // 128) * -(-shape.Nk // 128)
    if implementation == "flex":
        return useful_flops, shape.output_bytes + 4.0 * shape.B * blocks * 4
    return 4.0 * shape.bh * shape.Nq * shape.Nk * shape.D, float(shape.output_bytes + shape.B * shape.Nq * shape.Nk * (
        1 + shape.elem))


def masking_of(key: str, causal: bool, params: Mapping[str, Any], state: Mapping[str, Any] | None = None,
               key_padding_mask: torch.Tensor | None = None) -> Masking:
    """The masking of mechanism `key` at these settings: its spec's pattern (with its state: BigBird's random
    blocks) and the key padding."""
    if key not in MASKED:
        raise ValueError(f"{key!r} is not defined by a mask; Flex and a dense mask run {', '.join(MASKED)}")
    spec = MECHANISMS[key]
    held = {name: t for name, t in (state or {}).items() if name in spec.state.keys}
    return Masking(spec.insight.pattern(causal, **spec.resolved(params), **held), key_padding_mask)


def implementation_problem(implementation: str, key: str, mode: str, device: str) -> str | None:
    """Why `implementation` cannot run mechanism `key` in `mode` on `device` (a sentence saying what to change), or
    None when it can."""
    if implementation not in IMPLEMENTATIONS:
        return f"implementation {implementation!r} is unknown; choose {' or '.join(IMPLEMENTATIONS)}"
    if implementation == "ours":
        return None
    if key not in MASKED:
        return (f"{key} is not defined by a mask, so only our kernel runs it; choose implementation 'ours', or one "
                f"of {', '.join(MASKED)}")
    if mode == "generate":
        return f"generating steps token by token with our caches; choose implementation 'ours' or the forward mode"
    if implementation == "flex" and mode == "forward+backward" and str(device).startswith("cpu"):
        return ("FlexAttention has no backward on CPU (PyTorch raises NotImplementedError); choose the forward mode, "
                "a CUDA device, or another implementation")
    return None


def alibi_score_mod(heads: int, nq: int, nk: int) -> Callable[..., torch.Tensor]:
    """Flex's score_mod of ALiBi (Press et al. 2021, arXiv 2108.12409): score − m_h·|i + nk − nq − j|, the slopes and
    positions of positional.alibi_bias (our score_bias for softmax and SDPA), computed per cell, no (H, n, n) bias."""
    slopes, shift = positional.alibi_slopes(heads).float(), nk - nq
    return lambda score, b, h, i, j: score - slopes[h] * (i + shift - j).abs()


def softcap_score_mod(cap: float) -> Callable[..., torch.Tensor]:
    """Flex's score_mod of tanh soft-capping: cap·tanh(score / cap), the scaled scores bounded to (−cap, cap) (Gemma 2
    caps attention logits at 50: Gemma Team 2024, arXiv 2408.00118). Our kernels have no such form."""
    if not (isinstance(cap, (int, float)) and math.isfinite(cap) and cap > 0):
        raise ValueError(f"the soft cap must be a positive number, got {cap!r}; Gemma 2 uses 50")
    return lambda score, b, h, i, j: cap * torch.tanh(score / cap)


def sigmoid_score_mod(offsets: torch.Tensor, sink: int) -> Callable[..., torch.Tensor]:
    """Flex's score_mod for sigmoid attention (Ramapuram et al. 2024, arXiv 2409.04431): log σ(score + b_i), so
    that Flex's exp gives each weight σ(score + b_i), with b (1 or B, Nq) our sigmoid mechanism's offsets
    (mechanisms.sigmoid.offsets: bias − ln of the keys query i sees); key `sink` (one appended after the nk real
    keys) scores 0, a weight of exactly 1. Flex always divides by the weights' sum and sigmoid attention never does:
    the sink's weight and an extra value column give that sum back (`sigmoid_flex_inputs`, `sigmoid_from_flex`)."""
    per_row = offsets.shape[0] > 1  # (B, Nq) with key padding: each sequence counts its own keys

    def score_mod(score, b, h, i, j):
        return torch.where(j == sink, 0.0, torch.nn.functional.logsigmoid(score + offsets[b if per_row else 0, i]))
    return score_mod


def sigmoid_flex_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                        bias: float = 0.0, key_padding_mask: torch.Tensor | None = None) -> tuple[Any, ...]:
    """What Flex needs to compute our `sigmoid` mechanism exactly: (k with a sink key appended (B, Hk, nk + 1, D),
    v with a column of zeros and a sink row (0, …, 0, 1) (B, Hk, nk + 1, D + 1), the block mask of causal and
    padding with the sink always seen, `sigmoid_score_mod`). Flex's output is then
    [Σ_j σ_ij v_j, Σ_j σ_ij·0 + 1] ÷ (1 + Σ_j σ_ij) row by row."""
    from torch.nn.attention.flex_attention import create_block_mask
    from attn_core.mechanisms.sigmoid import offsets
    (batch, key_heads, nk, d), nq = k.shape, q.shape[-2]
    k = torch.cat([k, k.new_zeros(batch, key_heads, 1, d)], 2)
    sink_row = torch.cat([v.new_zeros(batch, key_heads, 1, d), v.new_ones(batch, key_heads, 1, 1)], -1)
    v = torch.cat([torch.cat([v, v.new_zeros(batch, key_heads, nk, 1)], -1), sink_row], 2)
    pad = None if key_padding_mask is None else torch.nn.functional.pad(key_padding_mask, (0, 1), value=False)
    seen = Masking((masks.causal if causal else masks.full) | masks.Pattern("the sink", lambda i, j: j == nk), pad)
    block_mask = create_block_mask(seen.mask_mod(), None if pad is None else batch, None, nq, nk + 1,
                                   device=q.device)
    return k, v, block_mask, sigmoid_score_mod(offsets(nq, nk, causal, bias, q, key_padding_mask), nk)


def sigmoid_from_flex(out: torch.Tensor) -> torch.Tensor:
    """Sigmoid attention from Flex's output (B, H, Nq, D + 1) on `sigmoid_flex_inputs`: its first D columns ÷ its
    last, Σ_j σ_ij v_j. A query that sees no real key gets 0 (the sink alone: 0 ÷ 1)."""
    return out[..., :-1] / out[..., -1:]


def sigmoid_attention_flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                           bias: float = 0.0, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Our `sigmoid` mechanism, out_i = Σ_j σ(q_i·k_j/√D + b_i) v_j, run by compiled FlexAttention on
    `sigmoid_flex_inputs` (one more key, one more value column). q (B, H, n, D), k and v (B, Hk, n, D) →
    (B, H, n, D); forward only on CPU. Compiles for these sizes on its first call (seconds to a minute on CPU).
    (On CPU, torch 2.13's compiled Flex cannot return its log-sum-exp, the other way to the weights' sum.)"""
    if q.requires_grad and q.device.type == "cpu":
        raise ValueError(implementation_problem("flex", "softmax", "forward+backward", "cpu"))
    k, v, block_mask, score_mod = sigmoid_flex_inputs(q, k, v, causal=causal, bias=bias,
                                                      key_padding_mask=key_padding_mask)
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        out = first_call(lambda: _compiled(dynamic=False)(q, k, v, block_mask, k.shape[1] != q.shape[1],
                                                          score_mod))[0]
    return sigmoid_from_flex(out)


def forward_of(implementation: str, masking: Masking, nq: int, nk: int, batch: int, device: torch.device | str,
               score_mod: Callable[..., torch.Tensor] | None = None) -> tuple[Forward, float]:
    """(the forward call q, k, v → out under `masking`, seconds spent building its mask once). "flex": compiled
    flex_attention with the block mask of create_block_mask (128 × 128 blocks; blocks the predicate leaves empty
    are skipped, O(kept blocks · 128² · d) time, O(n·d) memory); "dense-mask": SDPA with the (B, 1, nq, nk)
    boolean mask (O(nq·nk·d) time, the mask O(nq·nk) memory). A query that sees no key outputs zeros in both.
    `score_mod` (flex only: `alibi_score_mod`, `softcap_score_mod`): applied to each scaled score before the mask."""
    if score_mod is not None and implementation != "flex":
        raise ValueError("a score_mod is Flex's; for ALiBi with our kernels or SDPA pass score_bias="
                         "positional.alibi_bias(...) to softmax or sdpa, or choose implementation 'flex'")
    began = time.perf_counter()
    if implementation == "flex":
        from torch.nn.attention.flex_attention import create_block_mask
        rows = None if masking.key_padding_mask is None else batch
        block_mask = create_block_mask(masking.mask_mod(), rows, None, nq, nk, device=device)
        took = time.perf_counter() - began
        chosen = [_compiled(dynamic=True)]

        def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                try:
                    return chosen[0](q, k, v, block_mask, k.shape[1] != q.shape[1], score_mod)
                except EagerFallback:
                    raise
                except Exception:  # noqa: BLE001 - see _compiled: compile this mask for its static sizes instead
                    if chosen[0] is _compiled(dynamic=False):
                        raise
                    chosen[0] = _compiled(dynamic=False)
                    return chosen[0](q, k, v, block_mask, k.shape[1] != q.shape[1], score_mod)
        return forward, took
    if implementation == "dense-mask":
        keep = masking.dense(nq, nk, device)
        dead = None if masking.key_padding_mask is None else ~keep.any(-1, keepdim=True)  # rows that see no key
        took = time.perf_counter() - began

        def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            out = shared_sdpa(q, k, v, attn_mask=keep)
            return out if dead is None else out.masked_fill(dead, 0.0)
        return forward, took
    raise ValueError(f"implementation {implementation!r} has no mask to build; choose 'flex' or 'dense-mask'")


def first_call(call: Callable[[], Any]) -> tuple[Any, OneTime]:
    """(the result of `call`'s first run, its time as the compile cost when Dynamo compiled a graph in it).
    FlexUnavailable with a sentence when the machine cannot compile (`missing_capability`); any other error as
    raised; EagerFallback when the call ran eagerly."""
    from torch._dynamo.utils import counters
    graphs = counters["stats"]["unique_graphs"]
    began = time.perf_counter()
    try:
        out = call()
    except EagerFallback:
        raise
    except Exception as e:  # noqa: BLE001 - only what the machine lacks becomes FlexUnavailable
        if not missing_capability(e):
            raise  # a wrong kernel or a code generator's bug is a failure, never "cannot run here"
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise FlexUnavailable(f"compiled FlexAttention cannot run here ({type(e).__name__}: {first}); choose "
                              "implementation 'ours' or 'dense-mask'") from e
    took = time.perf_counter() - began
    return out, OneTime(compile_s=took if counters["stats"]["unique_graphs"] > graphs else math.nan)


def missing_capability(e: BaseException) -> bool:
    """Whether a failed compile lacked something of the machine's: torch.compile unsupported on this platform or
    Python, no working C++ compiler, no Triton or a GPU too old for it. Looked for along the causes, as Dynamo
    and Inductor wrap the compiler's error (InductorError ← LoweringException ← InvalidCxxCompiler)."""
    import torch._dynamo
    from torch._inductor import exc

    if not torch._dynamo.is_dynamo_supported():
        return True
    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, (exc.InvalidCxxCompiler, exc.TritonMissing, exc.GPUTooOldForTriton)):
            return True
        seen.add(id(cause))
        cause = getattr(cause, "inner_exception", None) or cause.__cause__ or cause.__context__
    return False


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key: str, *, implementation: str = "ours",
                     causal: bool = False, key_padding_mask: torch.Tensor | None = None,
                     state: Mapping[str, Any] | None = None, **params: Any) -> torch.Tensor:
    """Mechanism `key` (one of MASKED) on q (B, H, n, D), k and v (B, Hk, n, D) → (B, H, n, D), run by
    `implementation`: our kernel, compiled Flex or SDPA with a dense mask, all under the spec's pattern. One call
    builds the mask (and compiles, the first time): time the `forward_of` call to leave those out."""
    spec = MECHANISMS[key]
    if why := implementation_problem(implementation, key, "forward+backward" if q.requires_grad else "forward",
                                     q.device.type):
        raise ValueError(why)
    if implementation == "ours":
        padding = {} if key_padding_mask is None else {"key_padding_mask": key_padding_mask}
        return spec.fn(q, k, v, causal=causal, **params, **(state or {}), **padding)
    forward, _ = forward_of(implementation, masking_of(key, causal, params, state, key_padding_mask),
                            q.shape[-2], k.shape[-2], q.shape[0], q.device)
    return first_call(lambda: forward(q, k, v))[0] if implementation == "flex" else forward(q, k, v)


def pattern_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: masks.Pattern, *,
                      implementation: str = "ours", key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Masked softmax under any pattern (a `masks.document` of packed sequences, a composition of your own): "ours"
    is the registry's materialized softmax with the dense mask, O(n²) memory; "flex" and "dense-mask" as above."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation {implementation!r} is unknown; choose {' or '.join(IMPLEMENTATIONS)}")
    if implementation == "flex" and q.requires_grad and q.device.type == "cpu":
        raise ValueError(implementation_problem("flex", "softmax", "forward+backward", "cpu"))
    masking = Masking(pattern, key_padding_mask)
    if implementation == "ours":
        return softmax_attention(q, k, v, mask=masking.dense(q.shape[-2], k.shape[-2], q.device),
                                 key_padding_mask=key_padding_mask)
    forward, _ = forward_of(implementation, masking, q.shape[-2], k.shape[-2], q.shape[0], q.device)
    return first_call(lambda: forward(q, k, v))[0] if implementation == "flex" else forward(q, k, v)


def _flex_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: Any, gqa: bool,
               score_mod: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
    # Traced by Dynamo, is_compiling() is True and this test vanishes from the graph; run by Python, the frame was
    # not compiled (recompile limit, a skipped frame) and flex_attention would take its unfused eager path.
    if not torch.compiler.is_compiling():
        raise EagerFallback("compiled FlexAttention fell back to eager execution (Dynamo's recompile limit was "
                            "reached or the frame was skipped); this point is not Flex's time: restart the process "
                            "or measure fewer masks in one process")
    from torch.nn.attention.flex_attention import flex_attention
    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa)


_COMPILED: dict[bool, Callable[..., torch.Tensor]] = {}


def _compiled(dynamic: bool) -> Callable[..., torch.Tensor]:
    """flex_attention compiled once per process, fullgraph=True (a graph break is an error, not a slow split).
    dynamic=True: q, k and v's length is symbolic (dynamic=False recompiles per n and meets Dynamo's default
    recompile limit within one sweep); on CPU (torch 2.13) the block mask's block counts still specialize, so each
    n of 128 tokens or more compiles once, a one-time cost measured as such. Inductor's dynamic-size CPU template
    fails to build some masks (torch 2.13: floor divisions, as in block-local, sparse and BigBird, raise a
    LoweringException; a causal window with key padding, a C++ compile error): those compile for their static sizes
    instead, through a frame of their own."""
    if dynamic not in _COMPILED:
        _keep_compiles_private()
        own_frame = _flex_call if dynamic else (lambda *args: _flex_call(*args))
        _COMPILED[dynamic] = torch.compile(own_frame, dynamic=dynamic, fullgraph=True)
    return _COMPILED[dynamic]


def _keep_compiles_private() -> None:
    """Inductor's settings for this process, set before Flex is first compiled (torch reads both at each compile):
    its libraries in our per-user cache, not the shared temporary folder (cache.inductor_folder), and no
    precompiled headers, which torch 2.13 keeps in that shared folder whatever the cache's variable says. Without
    them a first compile is faster (here, cold: 17 s against 23 s) and each later one slower (10 s against 8 s, a
    new length). Set once, not around each call: a patch of Inductor's config took 36 µs a call, a timed Flex call's
    share at short lengths."""
    import torch._inductor.config as inductor

    cache.inductor_folder()
    inductor.cpp_cache_precompile_headers = False

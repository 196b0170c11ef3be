"""What a mechanism is: its knobs, its support, and its theoretical cost (the single source for UI, tests and
guards)."""
from __future__ import annotations

import math
import numbers
from dataclasses import KW_ONLY, dataclass
from typing import Any, Callable, Mapping

import numpy as np
import torch

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def dtype_name(dtype: torch.dtype | str) -> str:
    """'float32' for torch.float32 or 'float32'; refuses dtypes the library does not run."""
    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise ValueError(f"dtype {name!r} is not supported; use one of {', '.join(DTYPE_BYTES)}")
    return name


@dataclass(frozen=True)
class Shape:
    """Problem size of one attention call: q (B, H, Nq, D), k and v (B, Hk, Nk, D). `Hk`: key/value heads, each
    shared by H / Hk consecutive query heads (grouped-query attention; 1: multi-query); None (or H): one per query
    head, multi-head attention as written in 2017. `device`: the device type it runs on ("cpu", "cuda", "mps"), by
    which the chunked kernels size a chunk (`mechanisms._common.workspace`)."""

    B: int
    H: int
    Nq: int
    Nk: int
    D: int
    _: KW_ONLY  # the five sizes in the tensors' order; what they hold and the mask by name
    dtype: str = "float32"
    causal: bool = False
    Hk: int | None = None
    device: str = "cpu"

    def __post_init__(self):
        if self.Hk == self.H:  # one spelling of multi-head attention, so equal shapes compare equal
            object.__setattr__(self, "Hk", None)

    @property
    def elem(self) -> int:
        return DTYPE_BYTES[dtype_name(self.dtype)]

    @property
    def bh(self) -> int:
        """B·H: the number of independent attention problems (H alone is `H`; "heads" means H everywhere else)."""
        return self.B * self.H

    @property
    def key_heads(self) -> int:
        """Key/value heads: Hk, or H when each query head has its own."""
        return self.H if self.Hk is None else self.Hk

    @property
    def group(self) -> int:
        """Query heads per key/value head: 1 in multi-head attention, H in multi-query attention."""
        return self.H // self.key_heads

    @property
    def bk(self) -> int:
        """B·Hk: the number of distinct key/value sequences (the keys' side of the cost: caches, key projections)."""
        return self.B * self.key_heads

    @property
    def input_bytes(self) -> int:
        return (self.bh * self.Nq + 2 * self.bk * self.Nk) * self.D * self.elem

    @property
    def output_bytes(self) -> int:
        return self.bh * self.Nq * self.D * self.elem

    @classmethod
    def of(cls, q: torch.Tensor, k: torch.Tensor, causal: bool = False) -> "Shape":
        B, H, Nq, D = q.shape
        return cls(B, H, Nq, k.shape[-2], D, dtype=dtype_name(q.dtype), causal=causal, Hk=k.shape[1],
                   device=q.device.type)


@dataclass(frozen=True)
class Param:
    """One knob of a mechanism. `at_most` names a Shape field the value may not exceed (e.g. rank ≤ Nk)."""

    name: str
    default: int | float
    low: int | float
    high: int | float
    help: str
    kind: type = int
    log: bool = False
    at_most: str | None = None
    # a value that shows the mechanism's structure on n tokens (the defaults are sized for thousands of tokens, where
    # a window of 256 covers a whole sentence); None: the default
    small: Callable[[int], int | float] | None = None
    tokens: bool = False  # counts tokens, so values past n change nothing: an accuracy sweep stops at n

    def small_value(self, n: int) -> int | float:
        return self.default if self.small is None else self.small(n)

    def check(self, value: Any, shape: Shape | None = None) -> None:
        """ValueError naming the knob, the value and the allowed range unless low ≤ value ≤ high, an integer for an
        integer knob (1000.0 or 1e3 is refused, not rounded: the kernel would get a float) and finite otherwise."""
        whole = self.kind is int
        number = isinstance(value, numbers.Integral if whole else numbers.Real) and not isinstance(value, bool)
        finite = number and (isinstance(value, numbers.Integral) or math.isfinite(value))  # a huge int has no float
        if not finite or not self.low <= value <= self.high:
            allowed = "an integer" if whole else "a finite number"
            hint = (f"; write {self.name}={int(value)}" if whole and isinstance(value, float) and value.is_integer()
                    else "")
            shown = value if number else repr(value)  # 1000.0, nan, inf as written; text quoted
            raise ValueError(f"{self.name} = {shown} is not allowed; choose {allowed} between {self.low} and "
                             f"{self.high}{hint}")
        if shape is not None and self.at_most is not None and value > getattr(shape, self.at_most):
            limit = getattr(shape, self.at_most)
            raise ValueError(
                f"{self.name} = {value} is larger than the sequence length {limit}; choose {self.name} ≤ {limit}"
            )


@dataclass(frozen=True)
class Generation:
    """How a mechanism generates token by token: causal self-attention, one new query at a time, against a cache.

    `remember(k, v, *, max_len=None, **params) -> cache`: what the next token needs of a prompt's keys and values
    (B, H, n, D): its key-value cache or its fixed-size state. `max_len`: the longest context the caller expects, to
    preallocate; a cache grows by doubling past it.
    `step(q, k, v, cache) -> (out, cache)`: the new token's query, key and value (B, H, 1, D) → its output
    (B, H, 1, D), the cache written in place (the same object; its tensors reallocated only when it doubles).
    `cache_bytes(shape, **params)`: the bytes a cache holds in use after shape.Nk tokens (its `used_bytes`; also its
    `nbytes` when preallocated for exactly that context).
    `prefill(q, k, v, *, max_len=None, **params) -> (out, cache)`: the causal outputs of the prompt and its cache;
    None: the mechanism's own causal forward beside `remember`. Set it when one pass serves both (Performer's φ(K)).
    `step_flops(shape, **params)`: FLOPs of one step after shape.Nk tokens; None: 2 per cached number for each
    query head that reads it, the cost of a key-value cache (q·k over each cached key, p·v over each cached value:
    4·B·H·L·d for L tokens, whatever Hk: under GQA each of a key/value head's H / Hk query heads reads it). A
    fixed-size state is read and updated in each step and gives its own.
    `step_big_o`, `cache_big_o`: a step's time and the cache's size in the context length n, for charts.
    `step_tokens(n, **params) -> {branch: tokens, ..., 'total': tokens}`: for a mechanism whose step reads a bounded
    part of its cache (NSA), the tokens a step at context n reads, branch by branch; `step_tokens_note`: how that
    count stands to the paper's, with its source. None: a key-value cache read whole, or a fixed-size state.
    `keep_first`: a windowed cache that can also keep the first S tokens (StreamingLLM, arXiv 2309.17453): its
    forward, `remember` and `cache_bytes` take `keep_first=S` (attn_core.mechanisms._streaming).
    """

    remember: Callable[..., Any]
    step: Callable[..., tuple[torch.Tensor, Any]]
    cache_bytes: Callable[..., float]
    prefill: Callable[..., tuple[torch.Tensor, Any]] | None = None
    step_flops: Callable[..., float] | None = None
    step_big_o: str = "O(cache)"
    cache_big_o: str = "O(cache)"
    step_tokens: Callable[..., dict[str, int]] | None = None
    step_tokens_note: str = ""
    keep_first: bool = False

    def flops(self, shape: Shape, **params: Any) -> float:
        """FLOPs of one step after shape.Nk tokens: `step_flops`, or 2 per number the cache holds times the query
        heads sharing it (shape.group = H / Hk)."""
        if self.step_flops is not None:
            return float(self.step_flops(shape, **params))
        return 2.0 * self.cache_bytes(shape, **params) / shape.elem * shape.group


@dataclass(frozen=True)
class Cost:
    """What one forward call costs, in theory: the single source for theory curves, the roofline and the memory guard.

    `flops(shape, **params)`: forward floating-point operations (multiply-adds count 2) of the pattern's useful work:
    the cells the pattern keeps, the real (unpadded) positions; what theory curves plot.
    `executed_flops(shape, **params)`: the forward FLOPs the kernel actually computes, ≥ `flops`: tiles padded to
    whole blocks, masked halves computed and then discarded, the masked half of chunk-internal causal products.
    Matmul-like work only (products of scores and values, matmul feature maps); elementwise ops are left out, unless
    they are the mechanism's work itself (additive attention's per-pair additions and tanh).
    None when the kernel computes exactly the useful work; read it through `executed(shape, **params)`.
    `elementwise_flops(shape, **params)`: the part of `executed_flops` that is elementwise work counted as the
    mechanism's own (additive attention's per-pair additions, tanh and products with w), which a matmul counter such
    as torch.utils.flop_counter does not see; None: executed FLOPs are all matmul-like.
    `memory_bytes(shape, **params)`: predicted peak bytes the forward call allocates above its inputs, the output
    included when it is alive at the peak; the figure a measured peak is compared against.
    `time_big_o`, `memory_big_o`: the same in the sequence length n and the parameters, for tables and charts.
    `biased_memory_bytes(shape, **params)`: the peak when the call is given a (H, Nq, Nk) `score_bias` (ALiBi), for a
    mechanism whose path changes with one; None: `memory_bytes` (the bias is added into scores it holds anyway).
    `sinks_memory_bytes(shape, **params)`: the peak when the call is given `sinks=` (Supports.sinks; its rows'
    log-sum-exp and weights, or another path); None: `memory_bytes`. `sink_flops(shape)`: the FLOPs sinks add.
    `keeps_threads(q=, k=, v=, causal=, **params)`: True where the CPU call with these tensors and parameters (the
    call's keywords: its knobs, `key_padding_mask`, `sinks` …) is a few long parallel regions (fused kernels) rather
    than many short operations: where other programs hold every core, `attention()` then keeps torch's thread count,
    each thread doing its share on a core it shares, instead of one thread (`_cpu.fitted`; fitting the count to the
    free cores pays where every short operation waits for the thread a busy core holds); `_cpu.ALWAYS` where its
    threads take blocks of work as they come free (`_cpu.run_blocks`): torch's count at any load; None: always
    fitted.
    """

    flops: Callable[..., float]
    memory_bytes: Callable[..., float]
    time_big_o: str
    memory_big_o: str
    executed_flops: Callable[..., float] | None = None
    elementwise_flops: Callable[..., float] | None = None
    biased_memory_bytes: Callable[..., float] | None = None
    sinks_memory_bytes: Callable[..., float] | None = None
    keeps_threads: Callable[..., bool | str] | None = None

    @staticmethod
    def sink_flops(shape: Shape) -> float:
        """FLOPs `sinks=` adds to a call (`Supports.sinks`): per head and query row, σ(ℓ − a) (a subtraction, an
        exponential, an addition and a division) and D multiplications scaling its output: B·H·Nq·(D + 4), O(n·H).
        The row's log-sum-exp ℓ comes with the kernel's softmax (or, materialized, one more pass over the scores,
        elementwise, which `executed_flops` leaves out as it does the softmax's)."""
        return float(shape.bh * shape.Nq * (shape.D + 4))

    @staticmethod
    def gate_flops(shape: Shape) -> float:
        """FLOPs `output_gate=` adds: σ(g) (an exponential, an addition, a division, a negation) and a product per
        output element: 5·B·H·Nq·D."""
        return 5.0 * shape.bh * shape.Nq * shape.D

    @staticmethod
    def qk_norm_flops(shape: Shape, weighted: bool = False) -> float:
        """FLOPs `qk_norm=` adds: per row of q and of k, D squares and sums, a root, D products (D more with a
        weight): (B·H·Nq + B·Hk·Nk)·((3 + weighted)·D + 2)."""
        return float((shape.bh * shape.Nq + shape.bk * shape.Nk) * ((3 + weighted) * shape.D + 2))

    def options_memory(self, shape: Shape, *, output_gate: bool = False, qk_norm: bool = False,
                       **params: Any) -> float:
        """Predicted peak bytes with the softmax family's options: the normalised q and k held through the call
        (`qk_norm`), and at the end σ(g) and the gated output beside the output (`output_gate`)."""
        peak = self.memory_bytes(shape, **params)
        if output_gate:
            peak = max(peak, 3.0 * shape.output_bytes)
        if qk_norm:
            peak += (shape.bh * shape.Nq + shape.bk * shape.Nk) * shape.D * shape.elem
        return float(peak)

    def sinks_memory(self, shape: Shape, **params: Any) -> float:
        """Predicted peak bytes of a call given `sinks=` (no padding, no score bias): `sinks_memory_bytes`, or
        `memory_bytes` where the sinks add nothing at the peak."""
        return (self.sinks_memory_bytes or self.memory_bytes)(shape, **params)

    def executed(self, shape: Shape, **params: Any) -> float:
        """Forward FLOPs the kernel computes for `shape`: `executed_flops`, or `flops` where they are the same."""
        return (self.executed_flops or self.flops)(shape, **params)


@dataclass(frozen=True)
class State:
    """Tensors a mechanism takes besides q, k, v and its parameters.

    `init(shape, device, dtype, *, seed, **params)`: random state built outside the kernel and passed in (Performer's
    projection, Linformer's E and F); None: the mechanism draws nothing.
    `keys`: the keyword tensors the function takes besides its parameters: that state, or tensors a caller may give
    (Longformer's global_positions).
    """

    init: Callable[..., dict] | None = None
    keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Operands:
    """What a mechanism attends over when it is not q, k and v of D values a head (multi-head latent attention reads
    a latent per token): the engine draws and passes these instead, and `attention` does not call it.

    `draw(shape, device, dtype, *, seed, **params) -> tuple`: seeded tensors of one call of `shape`, in the order
    `fn` takes them positionally. `queries`: how many of them come first from the queries; the rest are what a
    generation cache is remembered from (`Generation.remember(*rest, ...)`), and a step takes one new token of each
    (`Generation.step(*all, cache)`).
    `nbytes(shape, **params)`: their bytes (what q, k and v's are to the others: `Shape.input_bytes`).
    """

    queries: int
    draw: Callable[..., tuple[torch.Tensor, ...]]
    nbytes: Callable[..., float]


@dataclass(frozen=True)
class Supports:
    """What a mechanism can be asked to do; each "no_" sentence says why not where the capability is False.

    `causal`: query i sees only keys j ≤ i. `causal_only`: why it runs causal only, a sentence (a recurrence over
    positions); empty: it runs non-causal too. `cross`: Nq ≠ Nk (cross-attention).
    `padding`: the function takes `key_padding_mask=`, a boolean (B, Nk) tensor, True where a key is padding (the
    convention of torch.nn.MultiheadAttention): padded keys get no weight, as if the sequence ended before them, and a
    query that sees no unpadded key outputs zeros. None (the default) costs nothing.
    `generation`: how it generates token by token (a `Generation`); None: it cannot.
    `shared_qk`: the keys are the queries themselves (Reformer's shared query-key space): the function never reads
    k, and a MultiHeadAttention gives it no key projection.
    `shared_kv`: the function takes k and v with Hk heads dividing q's H, query head i reading key/value head
    ⌊i·Hk/H⌋ (grouped-query attention, Ainslie et al. 2023, arXiv 2305.13245; Hk = 1: multi-query attention, Shazeer
    2019, arXiv 1911.02150). `repeats_kv`: it does so by repeating each shared head for its query heads (the memory
    of multi-head attention); False: it reads the shared heads in place. `no_shared_kv`: why it cannot, when not.
    `score_bias`: the function takes `score_bias=`, a float tensor broadcastable to (B, H, Nq, Nk) added to the scaled
    scores before the softmax (ALiBi, relative positions: attn_core.positions.encodings); `no_score_bias`: why not, when not.
    `no_rope_relative`: why, given RoPE-rotated q and k, its output is not a function of the offsets i − j alone (a
    feature map or projection that does not commute with the rotation); empty: RoPE stays relative.
    `sinks`: the function takes `sinks=`, one float logit a_h per query head (H,), which joins each row's softmax
    denominator as a key with no value (gpt-oss, arXiv 2508.10925): out = Σ_j e^(s_ij) v_j / (Σ_j e^(s_ij) + e^(a_h)),
    in forward, backward, padding, shared key/value heads and its generation step (the softmax family, the banded
    and block-sparse patterns, top-k over its selection, NSA in each branch's softmax); `no_sinks`: why not, when not.
    `output_gate`: the function takes `output_gate=`, gate logits g of q's shape: out = attn(q, k, v) ⊙ σ(g) (Qiu et
    al. 2025, arXiv 2505.06708; Qwen3-Next's full-attention layers). `qk_norm`: it takes `qk_norm=` (True, or a (D,)
    weight): q and k RMS-normalised per head before the scores (Llama 4, Qwen3, Gemma 3).
    `checks_finite`: the function refuses NaN and ±inf in q, k and v itself (outside `validated()`), most cheaply
    from values it computes anyway, so `attn_core.attention` does not read the inputs once more to check them.
    """

    causal: bool
    cross: bool
    causal_only: str = ""
    padding: bool = False
    no_padding: str = ""
    generation: Generation | None = None
    no_generation: str = ""
    shared_qk: bool = False
    shared_kv: bool = False
    repeats_kv: bool = False
    no_shared_kv: str = ""
    score_bias: bool = False
    no_score_bias: str = ""
    no_rope_relative: str = ""
    checks_finite: bool = False
    sinks: bool = False
    no_sinks: str = ""
    output_gate: bool = False
    no_output_gate: str = ""
    qk_norm: bool = False
    no_qk_norm: str = ""


@dataclass(frozen=True)
class Insight:
    """What the Patterns and Accuracy pages draw of a mechanism.

    `pattern(causal, **params, **state)`: the mask predicate of the cells the mechanism scores one by one; for exact
    mechanisms, the mask the result must equal masked softmax under. It also takes the mechanism's state tensors
    (`State.keys`) when it depends on them (BigBird's random blocks), and effective.pattern_of hands them over.
    `effective(q, k, v, causal, state, **params) -> (weights, values)`: for a mechanism that is not masked softmax
    under a `pattern`, the attention it applies written out densely, out = weights @ values (the Patterns and
    Accuracy pages draw it; it takes precedence over the pattern's masked softmax).
    `projected`: the parameter counting the weights' columns when they are projected keys, not the n keys
    (Linformer's rank); `pull_back(weights, state)` then maps them back onto the n keys.
    `selected(q, k, causal, state, **params) -> (cells, extra)`: for a mechanism that selects from its inputs which
    cells it reads (top-k, NSA), those cells for batch element 0: `cells` (S, Nq, Nk + len(extra)) boolean, S = 1
    (one selection for every head) or H (one a query head); `extra` names the columns past the n keys that it also
    reads (NSA's compressed blocks), `extra_columns` says what they are ("compressed blocks").
    `reads(n, causal, **params) -> (cells, words)`: its count at n without inputs (the cells it reads, or at most
    reads where that depends on the inputs) and the words that say so, for effective.cells_computed.
    `regime`: for the Accuracy page, the inputs (accuracy.INPUTS) where it works as designed, the inputs that show
    its limit, and why; `accuracy_note`: a sentence shown beside its errors.
    """

    pattern: Callable[..., Any] | None = None
    effective: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None
    projected: str | None = None
    pull_back: Callable[[torch.Tensor, dict], torch.Tensor] | None = None
    selected: Callable[..., tuple[torch.Tensor, tuple[str, ...]]] | None = None
    extra_columns: str = ""
    reads: Callable[..., tuple[float, str]] | None = None
    regime: tuple[str, str, str] | None = None
    accuracy_note: str = ""


@dataclass(frozen=True, kw_only=True)
class MechanismSpec:
    """Declarative description of one attention mechanism: who it is (label, function, paper, exact or not), its
    knobs (`params`, `state`), what it costs (`cost`), what it supports (`supports`) and what the insight pages draw
    (`insight`). A new capability is one field in one group.

    `key`: the name the catalogue registers it under, stamped there (mechanisms.__init__); a mechanism's own file
    leaves it empty, so that a copy of the file registered under another name is that other mechanism throughout.
    """

    key: str = ""
    label: str
    fn: Callable[..., torch.Tensor]
    description: str
    paper: str
    exact: bool
    params: tuple[Param, ...]
    cost: Cost
    supports: Supports
    state: State = State()
    insight: Insight = Insight()
    operands: Operands | None = None  # None: q, k, v; see Operands

    @property
    def defaults(self) -> dict[str, int | float]:
        return {p.name: p.default for p in self.params}

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def check(self, shape: Shape, params: Mapping[str, Any]) -> None:
        """Raise ValueError with a sentence saying what to change when these settings cannot run."""
        self.check_causal(shape.causal)
        self.check_shared_kv(shape)
        if shape.Nq != shape.Nk and not self.supports.cross:
            raise ValueError(
                f"{self.label} supports self-attention only (Nq = Nk), got Nq = {shape.Nq}, Nk = {shape.Nk}"
            )
        if shape.causal and shape.Nq != shape.Nk:
            raise ValueError(f"causal attention needs Nq = Nk, got Nq = {shape.Nq}, Nk = {shape.Nk}")
        self.check_params(params, shape, extra=(*self.state.keys, "seed"))

    def check_causal(self, causal: bool) -> None:
        """ValueError unless `causal` is a real bool (numpy's too) that this mechanism supports: a string such as
        'false' is truthy and would silently compute causal attention."""
        if not isinstance(causal, (bool, np.bool_)):
            raise ValueError(f"causal must be True or False, got {causal!r} ({type(causal).__name__}); "
                             f"pass a bool, e.g. causal=False")
        if causal and not self.supports.causal:
            raise ValueError(f"{self.label} cannot be causal; untick causal or choose another mechanism")
        if not causal and self.supports.causal_only:
            raise ValueError(f"{self.label} runs causal only: {self.supports.causal_only}; pass causal=True (tick "
                             f"causal) or choose another mechanism")

    def check_shared_kv(self, shape: Shape) -> None:
        """ValueError with a sentence when k and v have fewer heads than q and this mechanism cannot share them."""
        if shape.key_heads == shape.H or self.supports.shared_kv:
            return
        why = self.supports.no_shared_kv or "It takes one key/value head per query head."
        raise ValueError(f"{self.label} cannot share key/value heads between query heads. {why} Give k and v as many "
                         f"heads as q ({shape.H}; k.repeat_interleave({shape.group}, dim=1) repeats each), or choose "
                         f"a mechanism that shares them")

    def check_params(self, params: Mapping[str, Any], shape: Shape | None = None, *, extra=()) -> None:
        """Unknown names (beyond the parameters and `extra`) and out-of-range values, defaults included: a default
        must fit the shape too (Linformer's rank 256 at n = 64 cannot run)."""
        unknown = set(params) - {p.name for p in self.params} - set(extra)
        if unknown:
            raise ValueError(
                f"{self.label} has no parameter {', '.join(sorted(unknown))}; its parameters are "
                f"{', '.join(p.name for p in self.params) or 'none'}"
            )
        for p in self.params:
            p.check(params.get(p.name, p.default), shape)

    def resolved(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The mechanism's own parameters, defaults filled in (state tensors and seed dropped)."""
        return {p.name: params.get(p.name, p.default) for p in self.params}

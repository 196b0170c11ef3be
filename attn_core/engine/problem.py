"""One measurement's problem, and how it is measured: the frozen `Problem` that travels from a widget, a link, the CLI
or a run file to the worker and comes back on its Measurement, and the `Settings` of the timing and the guard. Every
invalid state of either is refused here, with a sentence saying what to change."""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from . import env, positions as _positions
from attn_core.mechanisms.flex import IMPLEMENTATIONS, implementation_problem
from ..mechanisms import MEASURED
from ..mechanisms._common import divisors
from ..spec import DTYPE_BYTES, MechanismSpec, Shape

MODES = ("forward", "forward+backward", "generate")
MAX_COUNT = 2**40  # n, batch, heads, d_model, repeats: far above any run, far below int64
MAX_THREADS = 4 * (os.cpu_count() or 1)  # far more torch threads than cores only thrash; 10,000 crash the worker
MAX_SEED = 2**63 - 1  # torch's generator takes a 64-bit seed
# problem fields a series of a sweep may set for itself, beside its mechanism's params
SERIES_FIELDS = ("kv_heads", "sinks", "keep_first")


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One attention call to measure: `mechanism` with its `params` (as given; the spec fills in defaults) over
    q (batch, heads, n, head_dim) and k, v (batch, kv_heads, n_kv, head_dim) of `dtype` on `device`, drawn from
    `seed`. `kv_heads` None: one key/value head per query head; fewer: shared by groups of query heads. `n_kv` None:
    self-attention (n keys). `padding`: the last `padding` keys of every sequence are padding (key_padding_mask).
    `mode`: the forward pass, forward and backward, or "generate": one new token's step against the cache of n
    tokens (causal whatever `causal` says). `positions`: "none", "rope" (q and k turned inside the measured call)
    or "alibi" (its score bias passed to it): engine/positions.py. `sinks`: a (heads,) sink logit a query head drawn
    from the seed (`sink_logits`) and passed as `sinks=`, a key with no value in each row's softmax (gpt-oss, arXiv
    2508.10925). `keep_first` S (generate mode): the windowed cache keeps the first S tokens too (StreamingLLM,
    arXiv 2309.17453), passed to the generation's `remember`."""

    mechanism: str = "softmax"
    params: tuple[tuple[str, Any], ...] = ()
    batch: int = 1
    heads: int = 8
    kv_heads: int | None = None
    n: int = 1024
    n_kv: int | None = None
    d_model: int = 512
    dtype: str = "float32"
    device: str = "cpu"
    mode: str = "forward"
    causal: bool = False
    padding: int = 0
    seed: int = 0
    positions: str = "none"
    implementation: str = "ours"
    sinks: bool = False
    keep_first: int = 0

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def keys(self) -> int:
        """The key length: n_kv, or n in self-attention."""
        return self.n if self.n_kv is None else self.n_kv

    @property
    def key_heads(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def is_causal(self) -> bool:
        """Whether each token sees only those before it: `causal`, or generating (a new token has no future)."""
        return self.causal or self.mode == "generate"

    @property
    def shape(self) -> Shape:
        """The sizes the spec's cost model reads (generating: the context of n tokens)."""
        return Shape(self.batch, self.heads, self.n, self.keys, self.head_dim, dtype=self.dtype, causal=self.is_causal,
                     Hk=self.kv_heads, device=_resolved(self.device))

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.params)

    def at(self, mechanism: str, params: Mapping[str, Any], n: int) -> "Problem":
        """This problem for another mechanism and length (a sweep's point). A series may set the problem's own
        `SERIES_FIELDS` among its parameters (kv_heads: MHA, GQA-8 and MQA as three lines of one chart); they go to
        the problem's field, the rest to `params`; sinks given as 1 or 0 (the command line's numbers: `--mechanisms
        sliding_window:sinks=1`) is on or off."""
        own = {k: v for k, v in params.items() if k not in SERIES_FIELDS}
        fields = {k: v for k, v in params.items() if k in SERIES_FIELDS}
        if type(fields.get("sinks")) is int and fields["sinks"] in (0, 1):
            fields["sinks"] = bool(fields["sinks"])
        return dataclasses.replace(self, mechanism=mechanism, params=tuple(sorted(own.items())), n=n, **fields)

    def describe(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in self.params)
        heads = f", {sharing(self.heads, self.key_heads)}" if self.key_heads != self.heads else ""
        where = f" + {_positions.NAMES[self.positions]}" if self.positions in ("rope", "alibi") else ""
        by = f" by {self.implementation}" if self.implementation != "ours" else ""
        kept = (" with sinks" if self.sinks is True else "") + (f", keeping the first {self.keep_first}"
                                                               if self.keep_first else "")
        return f"{self.mechanism}{extra}{heads}{where}{kept}{by} at n = {self.n}"

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Seeded q (B, H, n, D), k and v (B, H_kv, n_kv, D) on the problem's device and dtype."""
        g = torch.Generator().manual_seed(self.seed)
        sizes = ((self.heads, self.n), (self.key_heads, self.keys), (self.key_heads, self.keys))
        dtype = getattr(torch, self.dtype)
        return tuple(torch.randn(self.batch, h, n, self.head_dim, generator=g).to(self.device, dtype)
                     for h, n in sizes)

    def sink_logits(self) -> torch.Tensor | None:
        """(heads,) standard-normal sink logits, one a query head, drawn from seed + 2 (seed + 1 draws a generated
        token) on the problem's device and dtype; None without sinks."""
        if not self.sinks:
            return None
        g = torch.Generator().manual_seed((self.seed + 2) % (MAX_SEED + 1))
        return torch.randn(self.heads, generator=g).to(self.device, getattr(torch, self.dtype))

    def key_padding_mask(self) -> torch.Tensor | None:
        """(B, n_kv) bool, True on the last `padding` keys of every sequence; None without padding."""
        if not self.padding:
            return None
        return (torch.arange(self.keys, device=self.device) >= self.keys - self.padding).expand(self.batch, -1)

    # -- validation: the one place --
    def problems(self, spec: MechanismSpec | None = None) -> list[str]:
        """Every reason this problem cannot be measured, each a sentence saying what to change; [] when it can.
        `spec`: the mechanism's, to check it supports the problem (its parameters, causal, cross, padding, shared
        key/value heads, generation); None checks the inputs alone."""
        found = [f"{name} must be a positive integer below 2**40, got {getattr(self, name)!r}"
                 for name in ("batch", "heads", "d_model") if not _is_count(getattr(self, name))]
        if not found and self.d_model % self.heads:
            found.append(f"d_model {self.d_model} is not divisible by {self.heads} heads; choose a multiple of "
                         f"{self.heads}")
        if self.mode not in MODES:
            found.append(f"mode {self.mode!r} is unknown; choose {' or '.join(MODES)}")
        found += self.size_problems()
        try:
            device = env.resolve_device(self.device)
        except ValueError as e:
            return found + [str(e)]
        if self.dtype not in DTYPE_BYTES or self.dtype not in env.supported_dtypes(device):
            choices = ", ".join(env.supported_dtypes(device))
            found.append(f"dtype {self.dtype!r} is not supported on {device}; choose {choices}")
        if not (_is_int(self.seed) and 0 <= self.seed <= MAX_SEED):
            found.append(f"seed must be an integer from 0 to 2**63 - 1, got {self.seed!r}")
        if why := _positions.field_problem(self.positions):
            found.append(why)
        if self.implementation not in IMPLEMENTATIONS:
            found.append(f"implementation {self.implementation!r} is unknown; choose {' or '.join(IMPLEMENTATIONS)}")
        if self.positions != "none" and self.implementation != "ours":
            found.append(f"positions ({self.positions}) are added to our own kernels only; choose the implementation "
                         "'ours', or no positions")
        if found or spec is None:
            return found
        return self.spec_problems(spec)

    def size_problems(self) -> list[str]:
        """The sizes this problem cannot have (lengths, key/value heads, padding) and the series fields it cannot take
        as given (sinks, keep_first), each a sentence; [] when all can."""
        found = []
        if not _is_count(self.n) or (self.n_kv is not None and not _is_count(self.n_kv)):
            found.append(f"sequence lengths must be positive integers below 2**40, got {self.n!r}"
                         + (f" and {self.n_kv!r}" if self.n_kv is not None else ""))
        if self.kv_heads is not None and not (_is_count(self.kv_heads) and _is_count(self.heads)
                                              and self.heads % self.kv_heads == 0):
            choices = f"; choose {divisors(self.heads)}" if _is_count(self.heads) else ""
            found.append(f"key/value heads must divide the {self.heads} query heads, got {self.kv_heads!r}{choices}")
        if not (_is_int(self.padding) and 0 <= self.padding < (self.keys if _is_count(self.keys) else 1)):
            found.append(f"padding must be a whole number of keys from 0 to n − 1, got {self.padding!r}")
        if not isinstance(self.sinks, bool):
            found.append(f"sinks must be true or false, got {self.sinks!r}")
        if not (_is_int(self.keep_first) and 0 <= self.keep_first < MAX_COUNT):
            found.append(f"keep_first must be a whole number of first tokens to keep, 0 or more (StreamingLLM keeps "
                         f"4), got {self.keep_first!r}")
        elif self.keep_first and self.mode != "generate":
            found.append(f"keep_first keeps the first tokens in a generation cache, so it needs the generate mode; "
                         f"choose the mode generate, or set keep_first to 0 (got mode {self.mode!r})")
        return found

    def spec_problems(self, spec: MechanismSpec) -> list[str]:
        """What `spec` cannot do of this problem, each a sentence starting with its label."""
        if self.mode == "generate" and (why := generation_problem(spec)):
            return [why]
        found = _series_problems(self, spec)
        if why := implementation_problem(self.implementation, spec.key, self.mode, _resolved(self.device)):
            found.append(why)
        if self.key_heads != self.heads and not spec.supports.shared_kv:
            why = spec.supports.no_shared_kv or "It takes one key/value head per query head."
            found.append(f"{spec.label} cannot share key/value heads between query heads. {why} Set key/value "
                         "heads equal to heads, or choose another mechanism.")
        if self.padding and not spec.supports.padding:
            why = spec.supports.no_padding or "It takes no key padding mask."
            found.append(f"{spec.label} cannot take padding. {why} Set padding to 0, or choose another mechanism.")
        if self.padding and self.mode == "generate":
            found.append("generating measures a context without padding; set padding to 0")
        if why := _positions.spec_problem(spec, self.positions, head_dim=self.head_dim,
                                          generating=self.mode == "generate"):
            found.append(why)
        try:
            # the shared heads refused above, in the words of a problem, not again in those of a call
            spec.check(self.shape if spec.supports.shared_kv else dataclasses.replace(self.shape, Hk=None),
                       self.kwargs)
        except ValueError as e:
            text = str(e)
            found.append(text if text.startswith(spec.label) else f"{spec.label}: {text}")
        return found


FIELDS = frozenset(f.name for f in dataclasses.fields(Problem))


@dataclass(frozen=True, kw_only=True)
class Settings:
    """How a point is measured. Timing: `warmup` untimed calls, then samples until `min_repeats` and `min_time_s` are
    both reached; a point that takes longer than `point_budget_s` ends its mechanism's sweep (larger n are skipped).
    Memory: a separate profiled call (`measure_memory`); a point whose predicted need × (1 + `memory_margin`)
    exceeds the free memory (capped at `memory_limit_bytes` when set) is skipped. `threads`: torch CPU threads
    (None: torch's default)."""

    warmup: int = 1
    min_repeats: int = 5
    min_time_s: float = 0.2
    point_budget_s: float = 30.0
    measure_memory: bool = True
    memory_margin: float = 0.2
    memory_limit_bytes: int | None = None
    threads: int | None = None

    def problems(self) -> list[str]:
        """Every setting that cannot be used, each a sentence saying what to change; [] when all can."""
        rules = (
            (_is_int(self.warmup) and self.warmup >= 1,
             f"warmup must be at least 1 (the first call is cold), got {self.warmup!r}"),
            (_is_int(self.min_repeats) and self.min_repeats >= 1,
             f"min_repeats must be at least 1, got {self.min_repeats!r}"),
            (_is_number(self.min_time_s) and self.min_time_s >= 0,
             f"min_time_s must be 0 or more seconds, got {self.min_time_s!r}"),
            (_is_number(self.point_budget_s) and self.point_budget_s > 0,
             f"point_budget_s must be a positive number of seconds, got {self.point_budget_s!r}"),
            (_is_number(self.memory_margin) and 0 <= self.memory_margin <= 10,
             f"memory_margin must be between 0 and 10 (a fraction: 0.2 = 20%), got {self.memory_margin!r}"),
            (self.threads is None or (_is_int(self.threads) and 1 <= self.threads <= MAX_THREADS),
             f"threads must be from 1 to {MAX_THREADS} (4 × this machine's {os.cpu_count() or 1} cores) or empty "
             f"for torch's default, got {self.threads!r}"),
            (self.memory_limit_bytes is None or (_is_int(self.memory_limit_bytes)
                                                 and 0 < self.memory_limit_bytes < 2**63),
             f"memory_limit_bytes must be a positive integer below 2**63 or empty, got {self.memory_limit_bytes!r}"),
        )
        return [message for ok, message in rules if not ok]


def sharing(heads: int, kv_heads: int | None) -> str:
    """The name of a key/value head count: 'MHA' (one per query head), 'MQA' (one for all), 'GQA-g' (g groups)."""
    if kv_heads is None or kv_heads == heads:
        return "MHA"
    return "MQA" if kv_heads == 1 else f"GQA-{kv_heads}"


def generation_problem(spec: MechanismSpec) -> str | None:
    """Why mechanism `spec` cannot be measured generating (a sentence saying what to change), or None when it can."""
    if spec.supports.generation is not None:
        return None
    why = spec.supports.no_generation or "Its spec gives no generation form."
    return f"{spec.label} cannot generate token by token. {why} Leave it out, or choose the forward mode."


def _series_problems(problem: Problem, spec: MechanismSpec) -> list[str]:
    """What `spec` cannot take of the problem's sinks and kept first tokens (a series may set them: checked with
    the spec), each a sentence saying what to change."""
    found = []
    if problem.sinks is True and problem.implementation != "ours":
        found.append("sinks are passed to our own kernels only; choose the implementation 'ours', or turn sinks off")
    if problem.sinks is True and problem.positions != "none" and problem.mode != "generate":
        found.append(f"sinks with positions ({problem.positions}) have no predicted peak here (their path with "
                     "turned or biased scores is not modelled); set positions to none, or turn sinks off")
    if problem.sinks is True and not spec.supports.sinks:
        why = spec.supports.no_sinks or "Its spec takes no sink logits."
        takers = ", ".join(s.label for s in MEASURED.values() if s.supports.sinks)
        found.append(f"{spec.label} cannot take attention sinks. {why} Turn sinks off, or choose a mechanism that "
                     f"takes them: {takers}.")
    gen = spec.supports.generation
    if _is_int(problem.keep_first) and problem.keep_first > 0 and (gen is None or not gen.keep_first):
        takers = ", ".join(s.label for s in MEASURED.values()
                           if s.supports.generation is not None and s.supports.generation.keep_first)
        found.append(f"{spec.label} cannot keep the first tokens (StreamingLLM): its cache is not a window the first "
                     f"tokens fall out of. Set keep_first to 0, or choose {takers}.")
    return found


def _resolved(device: str) -> str:
    """The device "auto" stands for here; a device that cannot be resolved as given (refused elsewhere)."""
    try:
        return env.resolve_device(device)
    except ValueError:
        return device


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_count(x: Any) -> bool:
    return _is_int(x) and 1 <= x < MAX_COUNT


def _is_number(x: Any) -> bool:
    """A finite int or float (not a bool): infinity or NaN as a time or margin would never end or never compare."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

"""One distributed computation, as a frozen and checked Task, its seeded inputs and the positions each rank
holds; and the Result a run gives back."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

SCHEMES = ("ring", "ulysses", "state")
# causal forms with a running state `state` passes on
STATE_MECHANISMS = ("linear", "mamba2", "gated_deltanet", "kda")


@dataclass(frozen=True)
class Task:
    """One distributed computation: `scheme` over `procs` ranks of mechanism `mechanism` with its `params`, on seeded
    q, k, v (batch, heads, n, head_dim) float32 (or float64)."""

    scheme: str
    mechanism: str = "softmax"
    procs: int = 2
    n: int = 256
    causal: bool = False
    batch: int = 1
    heads: int = 4
    head_dim: int = 16
    dtype: str = "float32"
    seed: int = 0
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def elem(self) -> int:
        return torch.empty((), dtype=getattr(torch, self.dtype)).element_size()

    def check(self) -> "Task":
        """This task, or a ValueError whose sentence says what to change."""
        from attn_core.api import check_seed
        from attn_core.mechanisms import MECHANISMS

        if self.scheme not in SCHEMES:
            raise ValueError(f"scheme {self.scheme!r} is unknown; choose one of {', '.join(SCHEMES)}")
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"unknown mechanism {self.mechanism!r}; choose one of {', '.join(MECHANISMS)}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype {self.dtype!r}: distributed runs take float32 or float64")
        if not 2 <= self.procs <= 64:
            raise ValueError(f"procs = {self.procs}: give 2 to 64 processes")
        if min(self.batch, self.heads, self.head_dim, self.n) < 1:
            raise ValueError("batch, heads, head_dim and n must each be at least 1")
        spec = MECHANISMS[self.mechanism]
        spec.check_params(dict(self.params))  # before any process starts: a bad name or value is this sentence
        check_seed(self.seed)
        if self.causal and not spec.supports.causal:
            raise ValueError(f"{self.mechanism} has no causal form; drop --causal or choose another mechanism")
        blocks = 2 * self.procs if self.scheme == "ring" and self.causal else self.procs
        if self.n % blocks:
            why = " (causal ring: two zig-zag blocks a rank)" if blocks > self.procs else ""
            raise ValueError(f"n = {self.n} is not a multiple of {blocks}{why}; choose n = "
                             f"{max(blocks, self.n // blocks * blocks)} (no padding is added)")
        if self.scheme == "ring" and self.mechanism != "softmax":
            raise ValueError(f"ring attention combines partial softmaxes: it computes softmax, not {self.mechanism}; "
                             "give --mechanism softmax, or --scheme ulysses for another mechanism")
        if self.scheme == "ulysses":
            if self.heads % self.procs:
                raise ValueError(f"Ulysses splits the heads: {self.heads} heads do not divide among {self.procs} "
                                 f"processes; give heads a multiple of {self.procs}")
            if spec.state.init is not None or spec.operands is not None:
                raise ValueError(f"{self.mechanism} draws random state or operands of its own, which differ with the "
                                 "heads a process holds; choose a mechanism over plain q, k, v")
        if self.scheme == "state":
            if self.mechanism not in STATE_MECHANISMS:
                raise ValueError(f"state passing is built for {', '.join(STATE_MECHANISMS)}, not {self.mechanism}")
            if not self.causal:
                raise ValueError("state passing is the causal form (a prefix of states); add --causal (a non-causal "
                                 "layer needs one all-reduce of the state instead)")
        return self


@dataclass(frozen=True)
class Result:
    """What one distributed run measured, per rank: time, time waiting on communication, peak bytes, bytes sent,
    beside the cost model's bytes; `max_abs_diff` against the single-process mechanism on the same inputs."""

    task: Task
    backend: str
    device: str
    max_abs_diff: float | None
    time_s: tuple[float, ...]
    comm_s: tuple[float, ...]
    peak_bytes: tuple[int | None, ...]
    memory_method: str
    bytes_sent: tuple[int, ...]
    bytes_predicted: tuple[int, ...]
    output: torch.Tensor | None = field(default=None, repr=False, compare=False)
    status: str = "ok"  # or "skipped": the memory guard's reason in `reason`, nothing run
    reason: str = ""

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("task", "output")}
        return {**dataclasses.asdict(self.task), **out, "params": dict(self.task.params)}


def small_case(procs: int = 2, n: int = 1024, heads: int = 8, head_dim: int = 64) -> tuple[Task, ...]:
    """The three schemes of one causal layer, small enough to run on any machine in seconds: ring and Ulysses over
    softmax, state passing over linear attention; float32, seed 0."""
    shape = dict(procs=procs, n=n, causal=True, heads=heads, head_dim=head_dim)
    return Task("ring", "softmax", **shape), Task("ulysses", "softmax", **shape), Task("state", "linear", **shape)


def positions(task: Task, rank: int) -> torch.Tensor:
    """The sequence positions rank `rank` holds: contiguous n/P, or for causal ring attention the zig-zag blocks r and
    2P − 1 − r of n/(2P) each, so every rank has as many unmasked (query, key) pairs as every other."""
    P, n = task.procs, task.n
    if task.scheme == "ring" and task.causal:
        c = n // (2 * P)
        mirror = 2 * P - 1 - rank
        return torch.cat([torch.arange(rank * c, (rank + 1) * c), torch.arange(mirror * c, (mirror + 1) * c)])
    return torch.arange(rank * n // P, (rank + 1) * n // P)


def inputs(task: Task, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded q, k, v (B, H, n, D): the same in every process and in the single-process reference."""
    g = torch.Generator().manual_seed(task.seed)
    qkv = torch.randn(3, task.batch, task.heads, task.n, task.head_dim, generator=g, dtype=getattr(torch, task.dtype))
    return tuple(t.to(device) for t in qkv.unbind(0))


def mechanism_state(task: Task, device: str = "cpu") -> dict:
    """The mechanism's seeded state over the whole sequence (mamba2's dt and A, Gated DeltaNet's and KDA's gates),
    from the task's seed: every rank draws it whole and takes its positions, the reference takes it all."""
    from attn_core.api import make_state
    from attn_core.spec import Shape

    shape = Shape(task.batch, task.heads, task.n, task.n, task.head_dim, causal=task.causal)
    return make_state(task.mechanism, shape, device, getattr(torch, task.dtype), seed=task.seed, **dict(task.params))

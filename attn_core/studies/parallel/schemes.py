"""Sequence parallelism across processes on torch.distributed: ring attention (Liu, Zaharia, Abbeel 2023, arXiv
2310.01889), the head all-to-all of DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv 2309.14509) and state passing for
linear attention (Katharopoulos et al. 2020, arXiv 2006.16236, eq. 8–9), with the bytes each process sends counted
at the calls and a cost model that predicts them.

One launch starts P worker processes on this machine (gloo on CPU, NCCL on CUDA with a GPU a process), each a rank
of one process group whose every collective carries a timeout. It is guarded as a sweep is: a task refused with a
sentence, one whose predicted memory would not fit skipped with the reason, the machine's sweep lock held while it
runs, and a stop (`cancel`, Ctrl-C, SIGTERM) that ends every rank within seconds. A rank that dies or stalls ends the
run with a `DistributedError`, and no process outlives the launch, nor a launcher killed outright (SIGKILL, the OOM
killer): its ranks and their forkserver end with it (`_lifeline`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import multiprocessing
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

SCHEMES = ("ring", "ulysses", "state")
STATE_MECHANISMS = ("linear", "mamba2", "gated_deltanet")  # causal forms with a running state `state` passes on
BLOCK = 64  # positions per block of the chunked causal linear form inside one rank's chunk
DEFAULT_TIMEOUT_S = 60.0
STOP_GRACE_S = 2.0  # a rank that has not ended this long after SIGTERM is killed
PR_SET_PDEATHSIG = 1  # Linux's prctl option: a signal for this process when its parent ends (<linux/prctl.h>)
ORPHANED = 70  # the exit code of a rank that outlived its launcher (EX_SOFTWARE); nobody is left to read it


class DistributedError(RuntimeError):
    """A distributed run that could not finish: a rank died, raised or outlived the timeout, another sweep held the
    machine, or it was stopped (the sentence says which)."""


class Cancelled(DistributedError):
    """The run was stopped by its caller (`cancel`); every rank was ended."""


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


# -- the cost model -------------------------------------------------------------------------------------------------

def bytes_predicted(scheme: str, shape: tuple[int, int, int, int], procs: int, causal: bool = False,
                    elem: int = 4, mechanism: str = "linear") -> tuple[int, ...]:
    """Bytes each rank sends for one layer's forward, shape (B, H, n, D), elements of `elem` bytes.

    ring: P − 1 steps, each passing one K and one V block of n/P positions on: 2·(P − 1)·B·H·(n/P)·D·elem, causal or
    not (zig-zag keeps the work even, not the traffic smaller). ulysses: four all-to-alls (q, k, v in, the output
    back), each keeping 1/P of its buffer at home: 4·(P − 1)·B·(H/P)·(n/P)·D·elem ≈ 4·n·H·D/P values. state: rank r
    < P − 1 sends the prefix of states in max(elem, 4) bytes, independent of n: B·H·(D·D + D) numbers for linear
    (the state and its normaliser), B·H·D·D for mamba2 and gated_deltanet (multi-head: Hk = H); the last sends
    nothing."""
    B, H, n, D = shape
    if scheme == "ring":
        return (2 * (procs - 1) * B * H * (n // procs) * D * elem,) * procs
    if scheme == "ulysses":
        return (4 * (procs - 1) * B * (H // procs) * (n // procs) * D * elem,) * procs
    if scheme == "state":
        per_head = {"linear": D * D + D, "mamba2": D * D, "gated_deltanet": D * D}[mechanism]
        return (B * H * per_head * max(elem, 4),) * (procs - 1) + (0,)
    raise ValueError(f"scheme {scheme!r} is unknown; choose one of {', '.join(SCHEMES)}")


def memory_predicted(scheme: str, shape: tuple[int, int, int, int], procs: int, elem: int = 4) -> int:
    """Bytes one device holds for a layer's attention activations, with a fused (flash) kernel on each block, so no
    score matrix is kept: ring: its q, k, v and output of n/P positions and the K, V block arriving, 6·B·H·(n/P)·D;
    ulysses: its shards of q, k, v, output and the same of H/P heads over the whole sequence, 8·B·H·(n/P)·D; state:
    q, k, v, output of n/P positions and the D × D state (+ D). This module's own blocks materialize their scores
    besides: (n/P)² a head for the ring's block pair (two of n/(2P) causal), n² a head for Ulysses over softmax."""
    B, H, n, D = shape
    local = B * H * (n // procs) * D
    if scheme == "ring":
        return elem * 6 * local
    if scheme == "ulysses":
        return elem * 8 * local
    if scheme == "state":
        return elem * 4 * local + max(elem, 4) * B * H * (D * D + D)
    raise ValueError(f"scheme {scheme!r} is unknown; choose one of {', '.join(SCHEMES)}")


def required_bytes(task: Task) -> tuple[int, int]:
    """(bytes one rank needs, bytes the launcher needs), for the memory guard, in the task's element size e with
    whole = B·H·n·D and local = whole/P. A rank: q, k, v drawn whole (3·whole: every rank draws the seeded inputs,
    then keeps its positions), its shards, output and the copy it sends back (5·local), and its scheme's work —
    ring: the K, V block held and the one arriving (4·local) and a block pair's scores, their exponentials and the
    masked copy, 3·B·H·c² for blocks of c = n/P positions (n/(2P) causal); ulysses: the mechanism's own need (its
    spec's memory model) over H/P heads of the whole sequence and the exchange back (2·local); state: the
    mechanism's own need over the n/P positions of its chunk and the (D + 1)-wide state. The launcher: the
    single-process mechanism it compares with (its spec's need over the whole problem) and the gathered output."""
    from attn_core.engine.measure import required_bytes as needed
    from attn_core.engine.problem import Problem
    from attn_core.mechanisms import MECHANISMS

    B, H, n, D, P, e = task.batch, task.heads, task.n, task.head_dim, task.procs, task.elem
    whole, local = B * H * n * D, B * H * n * D // P
    spec = MECHANISMS[task.mechanism]

    def problem(heads: int, length: int) -> Problem:
        return Problem(mechanism=task.mechanism, params=task.params, batch=B, heads=heads, n=length,
                       d_model=heads * D, dtype=task.dtype, causal=task.causal)

    rank = e * (3 * whole + 5 * local)
    if task.scheme == "ring":
        c = n // (2 * P) if task.causal else n // P
        rank += e * (4 * local + 3 * B * H * c * c)
    elif task.scheme == "ulysses":
        rank += int(needed(spec, problem(H // P, n))) + e * 2 * local
    else:
        rank += int(needed(spec, problem(H, n // P))) + max(e, 4) * B * H * (D * D + D)
    return rank, int(needed(spec, problem(H, n))) + e * 2 * whole


def memory_guard(task: Task, device: str, margin: float = 0.2, limit: int | None = None) -> str | None:
    """A reason to skip `task` when its need (required_bytes) × (1 + margin) exceeds the free memory, capped at
    `limit`: on the CPU the P ranks and the launcher share the machine's memory; on CUDA each rank has a GPU of its
    own and the launcher's reference stays on the CPU. None when it fits."""
    from attn_core.engine import env
    from attn_core.engine.measure import format_bytes

    rank, launcher = required_bytes(task)
    checks = ([(task.procs * rank + launcher, "cpu", f"{task.procs} processes × {format_bytes(rank)} and "
                                                    f"{format_bytes(launcher)} for the single-process reference")]
              if device == "cpu" else
              [(rank, device, f"{format_bytes(rank)} on each process's GPU"),
               (launcher, "cpu", f"{format_bytes(launcher)} for the single-process reference on the CPU")])
    for need, where, what in checks:
        free = env.free_memory_bytes(where)
        capped = limit is not None and limit < free
        free = limit if capped else free
        if need * (1 + margin) > free:
            note = " under the memory limit set" if capped else ""
            return (f"would need {format_bytes(need * (1 + margin))} ({what}, with a {margin:.0%} safety margin), "
                    f"{format_bytes(free)} free{note}; choose a smaller n, fewer heads or a smaller batch")
    return None


def overlap_block(flops_per_s: float, link_bytes_per_s: float, elem: int = 2) -> float:
    """Ring attention hides the transfer when a step's compute, 4·c²·H·D FLOPs for a block of c positions, outlasts
    passing one K, V block, 2·c·H·D·elem bytes: c ≥ flops_per_s·elem / (2·link_bytes_per_s) positions a rank.
    Causal (zig-zag) steps do half that compute: twice the block."""
    return flops_per_s * elem / (2.0 * link_bytes_per_s)


# Link bandwidths a direction, each from its source (what one process can send while it receives as much).
LINKS = {
    "PCIe 4.0 x16": (32e9, "PCI-SIG PCIe 4.0: 16 GT/s × 16 lanes, 128b/130b coding, about 32 GB/s a direction"),
    "NVLink 4 (H100 SXM)": (450e9, "NVIDIA H100 datasheet: 900 GB/s NVLink a GPU in all, 450 GB/s a direction"),
    "InfiniBand NDR": (50e9, "NVIDIA Quantum-2 / ConnectX-7 InfiniBand NDR: 400 Gb/s a port, 50 GB/s a direction"),
}


def schemes_table(n: int, heads: int, head_dim: int, procs: int, *, batch: int = 1, elem: int = 2,
                  link_bytes_per_s: float = LINKS["NVLink 4 (H100 SXM)"][0], flops_per_s: float = 1e12,
                  kv_heads: int | None = None, layers: int = 1):
    """The three schemes for one attention layer of context n split over `procs` devices, from the cost model: bytes
    each device holds and sends, the transfer's time at the link's rate, the compute time a device at `flops_per_s`
    (causal softmax 2·B·H·n²·D/P; linear attention's state 4·B·H·(n/P)·D²), and for the ring the block it needs to
    hide the transfer behind compute (`overlap_block`) beside the block it has (n/P). `kv_heads` (None: one a query
    head) shrink what the ring passes and Ulysses exchanges of K and V by kv_heads/heads (state passing keeps a state
    a query head); `bytes_sent_all_layers` is a layer's bytes × `layers`. One row a scheme (pandas); a scheme that
    cannot split this shape has its reason instead of figures."""
    import pandas as pd

    shape = (batch, heads, n, head_dim)
    kv = heads if kv_heads is None else kv_heads
    flops = 2.0 * batch * heads * n * n * head_dim  # causal softmax: Q Kᵀ and P V over the kept half
    linear_flops = 4.0 * batch * heads * n * head_dim ** 2  # linear attention: its states built, then read
    rows = []
    for scheme, what in (("ring", "softmax, key/value blocks around the ring"),
                         ("ulysses", "any mechanism, heads exchanged by all-to-all"),
                         ("state", "linear attention, the prefix state passed on (causal)")):
        row = {"scheme": scheme, "what": what}
        if scheme == "ulysses" and (heads % procs or kv % procs):
            which = f"{heads} heads" if heads % procs else f"{kv} key/value heads"
            rows.append({**row, "reason": f"{which} do not divide among {procs} devices"})
            continue
        sent, held = max(bytes_predicted(scheme, shape, procs, True, elem)), memory_predicted(scheme, shape, procs,
                                                                                             elem)
        if kv != heads and scheme != "state":  # K and V carry kv heads: the ring's whole traffic, half Ulysses'
            local = batch * (n // procs) * head_dim * elem
            sent = sent * kv // heads if scheme == "ring" else sent // 2 + sent // 2 * kv // heads
            held -= 4 * (heads - kv) * local  # k and v, and the ring's block arriving or Ulysses' exchanged pair
        row.update(memory_per_device_bytes=held, bytes_sent_per_layer=sent, layers=layers,
                   bytes_sent_all_layers=sent * layers, transfer_s=sent / link_bytes_per_s, reason="",
                   compute_s=(linear_flops if scheme == "state" else flops) / procs / flops_per_s)
        if scheme == "ring":
            row.update(block=n // procs, block_to_hide_transfer=overlap_block(flops_per_s, link_bytes_per_s, elem))
        rows.append(row)
    return pd.DataFrame(rows)


def attention_shape(model) -> dict:
    """The attention layers of a planner model (attn_core.studies.planner.model.Model) as schemes_table takes them: the query
    heads, key/value heads and head dim of its most numerous kind of layer that is not a state mechanism (every kind
    where all are), and the count of its layers of that shape. E.g. Llama-3-8B: 32 layers of 32 heads, 8 key/value
    heads of 128."""
    kinds = [layer for layer in model.layers if layer.mechanism not in STATE_MECHANISMS] or list(model.layers)
    shape_of = lambda layer: (layer.heads, layer.kv_heads, layer.head_dim)  # noqa: E731
    counts: dict = {}
    for layer in kinds:
        counts[shape_of(layer)] = counts.get(shape_of(layer), 0) + layer.count
    (heads, kv_heads, head_dim), layers = max(counts.items(), key=lambda item: item[1])
    return dict(heads=heads, kv_heads=kv_heads, head_dim=head_dim, layers=layers)


def small_case(procs: int = 2, n: int = 1024, heads: int = 8, head_dim: int = 64) -> tuple[Task, ...]:
    """The three schemes of one causal layer, small enough to run on any machine in seconds: ring and Ulysses over
    softmax, state passing over linear attention; float32, seed 0."""
    shape = dict(procs=procs, n=n, causal=True, heads=heads, head_dim=head_dim)
    return Task("ring", "softmax", **shape), Task("ulysses", "softmax", **shape), Task("state", "linear", **shape)


def measured_beside_model(results: Sequence[Result], flops_per_s: float):
    """One row a result (pandas): the bytes a process sent, counted at the calls, beside the cost model's (the most
    of any rank); the slower rank's seconds and its seconds waiting on transfers, beside the model's compute time for
    the layer (schemes_table's FLOPs at `flops_per_s`, this machine's matmul rate, which its P processes share: each
    computes at flops_per_s / P), and the share of its time it waited (a transfer hidden behind compute costs no
    wait; the wait includes the other rank's lag). A skipped result has its reason instead."""
    import pandas as pd

    rows = []
    for r in results:
        t = r.task
        row = {"scheme": t.scheme, "mechanism": t.mechanism, "n": t.n, "processes": t.procs, "backend": r.backend}
        if r.status != "ok":
            rows.append({**row, "reason": r.reason})
            continue
        model = schemes_table(t.n, t.heads, t.head_dim, t.procs, batch=t.batch, elem=t.elem,
                              flops_per_s=flops_per_s / t.procs).set_index("scheme").loc[t.scheme]
        slow = max(range(t.procs), key=lambda rank: r.time_s[rank])
        rows.append({**row, "bytes_sent": max(r.bytes_sent), "bytes_predicted": max(r.bytes_predicted),
                     "time_ms": r.time_s[slow] * 1e3, "waiting_ms": r.comm_s[slow] * 1e3,
                     "model_compute_ms": float(model["compute_s"]) * 1e3,
                     "waiting_share": r.comm_s[slow] / r.time_s[slow],
                     "max_abs_diff": r.max_abs_diff, "reason": ""})
    return pd.DataFrame(rows)


# -- counted communication ------------------------------------------------------------------------------------------

class Link:
    """This rank's side of the process group: every transfer goes through here, which counts the bytes it sends to
    other ranks and the seconds spent waiting, and waits at most `timeout` on each."""

    def __init__(self, rank: int, procs: int, timeout: datetime.timedelta, die_at: int | None = None,
                 failure: str = "exit"):
        self.rank, self.procs, self.timeout = rank, procs, timeout
        self.bytes_sent, self.comm_s, self.calls = 0, 0.0, 0
        self.die_at, self.failure = die_at, failure  # test hook: at that call this rank exits, or stalls

    def _enter(self) -> None:
        self.calls += 1
        if self.die_at is not None and self.calls >= self.die_at:
            if self.failure == "stall":
                time.sleep(10 * self.timeout.total_seconds())  # alive but silent: the others' timeouts must end it
            os._exit(17)

    def start_exchange(self, send: Sequence[torch.Tensor], to: int, recv: Sequence[torch.Tensor], frm: int) -> list:
        """Start sending `send` to rank `to` and receiving into `recv` from rank `frm`; `wait` on what it returns."""
        self._enter()
        ops = [dist.P2POp(dist.isend, t, to) for t in send] + [dist.P2POp(dist.irecv, t, frm) for t in recv]
        self.bytes_sent += sum(t.numel() * t.element_size() for t in send)
        return dist.batch_isend_irecv(ops)

    def send(self, t: torch.Tensor, to: int) -> list:
        self._enter()
        self.bytes_sent += t.numel() * t.element_size()
        return [dist.isend(t, to)]

    def recv(self, t: torch.Tensor, frm: int) -> torch.Tensor:
        self._enter()
        self.wait([dist.irecv(t, frm)])
        return t

    def wait(self, works: list) -> None:
        start = time.perf_counter()
        for w in works:
            w.wait(self.timeout)
        self.comm_s += time.perf_counter() - start

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        """x (P, …) → (P, …): block j goes to rank j, block j of the result came from rank j."""
        self._enter()
        x = x.contiguous()
        out = torch.empty_like(x)
        self.bytes_sent += (x.numel() - x[self.rank].numel()) * x.element_size()  # a block to itself is not sent
        start = time.perf_counter()
        dist.all_to_all_single(out, x, async_op=True).wait(self.timeout)
        self.comm_s += time.perf_counter() - start
        return out


# -- positions and inputs -------------------------------------------------------------------------------------------

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
    """The mechanism's seeded state over the whole sequence (mamba2's dt and A, Gated DeltaNet's gates), from the
    task's seed: every rank draws it whole and takes its positions, the reference takes it all."""
    from attn_core.api import make_state
    from attn_core.spec import Shape

    shape = Shape(task.batch, task.heads, task.n, task.n, task.head_dim, causal=task.causal)
    return make_state(task.mechanism, shape, device, getattr(torch, task.dtype), seed=task.seed, **dict(task.params))


# -- the three schemes, one rank's side -----------------------------------------------------------------------------

def _partial(q, k, v, qpos, kpos, causal: bool, acc, top, total) -> None:
    """Fold one key/value block into the running softmax of q, in place: scores s = q·kᵀ/√D (causal: −∞ where the
    key's position is after the query's), top' = max(top, max s), acc' = acc·e^(top − top') + e^(s − top')·v,
    total' = total·e^(top − top') + Σ e^(s − top')."""
    s = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)
    if causal:
        s.masked_fill_(qpos[:, None] < kpos[None, :], float("-inf"))
    new = torch.maximum(top, s.amax(-1, keepdim=True))
    keep = (top - new).exp()
    p = (s - new).exp()
    acc.mul_(keep).add_(p @ v)
    total.mul_(keep).add_(p.sum(-1, keepdim=True))
    top.copy_(new)


def ring_attention(q, k, v, qpos: torch.Tensor, link: Link, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact softmax attention of this rank's queries over all keys: at step s the rank holds the K, V block of rank
    (r − s) mod P, sends it to r + 1 while folding it into the online softmax (a block pair wholly in the future of
    its queries is skipped), receives the next from r − 1. q, k, v (B, H, n/P, D) → (output, log-sum-exp (B, H,
    n/P, 1)). Time O(n²·D/P) a rank, memory O((n/P)·D + (n/P)²): never the whole sequence's keys."""
    P, r = link.procs, link.rank
    acc, total = torch.zeros_like(q), q.new_zeros(*q.shape[:-1], 1)
    top = torch.full_like(total, float("-inf"))
    kv, kpos = torch.stack([k, v]), qpos
    for step in range(P):
        works = []
        if step < P - 1:
            incoming = torch.empty_like(kv)
            works = link.start_exchange([kv], (r + 1) % P, [incoming], (r - 1) % P)
        for qs in _halves(qpos, causal):  # zig-zag: each query block against each key block not wholly after it
            for ks in _halves(kpos, causal):
                if not causal or kpos[ks].min() <= qpos[qs].max():
                    _partial(q[:, :, qs], kv[0][:, :, ks], kv[1][:, :, ks], qpos[qs], kpos[ks], causal, acc[:, :, qs],
                             top[:, :, qs], total[:, :, qs])
        link.wait(works)
        if step < P - 1:
            kv, kpos = incoming, positions_of(kpos, P, causal, r - step - 1)
    return acc / total, top + total.log()


def _halves(pos: torch.Tensor, causal: bool) -> list[slice]:
    """The two zig-zag blocks of a causal rank's positions; all of them as one otherwise."""
    half = len(pos) // 2
    return [slice(0, half), slice(half, None)] if causal else [slice(None)]


def positions_of(kpos: torch.Tensor, procs: int, causal: bool, owner: int) -> torch.Tensor:
    """The positions of the block first held by rank `owner` (mod P), as `positions` gives them."""
    n = len(kpos) * procs
    task = Task("ring", procs=procs, n=n, causal=causal)
    return positions(task, owner % procs)


def ulysses(q, k, v, link: Link, mechanism: str, causal: bool, params: dict) -> torch.Tensor:
    """Sequence-sharded q, k, v (B, H, n/P, D) → all-to-all → head-sharded (B, H/P, n, D) → the mechanism over the
    whole sequence → all-to-all back → (B, H, n/P, D). Four all-to-alls of (P − 1)/P of a shard each."""
    from attn_core.api import attention

    B, H, nl, D = q.shape
    P = link.procs

    def to_heads(x):  # (B, H, nl, D) → (P, B, H/P, nl, D) → exchange → (B, H/P, P·nl, D)
        y = link.all_to_all(x.view(B, P, H // P, nl, D).transpose(0, 1))
        return y.permute(1, 2, 0, 3, 4).reshape(B, H // P, P * nl, D)

    out = attention(mechanism, to_heads(q), to_heads(k), to_heads(v), causal=causal, **params)
    back = link.all_to_all(out.view(B, H // P, P, nl, D).permute(2, 0, 1, 3, 4))  # block j: rank j's heads
    return back.transpose(0, 1).reshape(B, H, nl, D)


def linear_state_passing(q, k, v, link: Link) -> torch.Tensor:
    """Causal linear attention of this rank's chunk: its own state S_r = Σ φ(k_j) v_jᵀ, z_r = Σ φ(k_j) over the
    chunk; the prefix (S, z) of ranks before it arrives from r − 1 and (prefix + own) goes on to r + 1; then out_i =
    φ(q_i)ᵀ(S + Σ_{j ≤ i in chunk} φ(k_j) v_jᵀ) / φ(q_i)ᵀ(z + Σ φ(k_j)), by blocks of BLOCK positions. q, k, v (B,
    H, n/P, D); O((n/P)·D²) time a rank, O(D²) sent, whatever n."""
    from attn_core.mechanisms.linear import feature_map

    fq, fk = feature_map(q), feature_map(k)
    own = torch.cat([fk.transpose(-2, -1) @ v, fk.sum(-2).unsqueeze(-1)], dim=-1)  # (B, H, D, D + 1): [S | z]
    prefix = _passed_on(own, lambda p: p + own, link)
    v1 = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)  # [V, 1]: numerator and normaliser in one product
    out = torch.empty_like(v)
    state = prefix
    for s in range(0, q.shape[2], BLOCK):
        a = (fq[:, :, s:s + BLOCK] @ fk[:, :, s:s + BLOCK].transpose(-2, -1)).tril_()
        num = fq[:, :, s:s + BLOCK] @ state + a @ v1[:, :, s:s + BLOCK]
        out[:, :, s:s + BLOCK] = num[..., :-1] / num[..., -1:]
        state = state + fk[:, :, s:s + BLOCK].transpose(-2, -1) @ v1[:, :, s:s + BLOCK]
    return out


def _passed_on(like: torch.Tensor, carried, link: Link) -> torch.Tensor:
    """The prefix state P_r of the ranks before this one: received from r − 1 (zeros on rank 0), and
    `carried(P_r)` = the state after this rank's chunk sent on to r + 1 (not by the last rank)."""
    prefix = torch.zeros_like(like)
    if link.rank > 0:
        link.recv(prefix, link.rank - 1)
    if link.rank < link.procs - 1:
        link.wait(link.send(carried(prefix).contiguous(), link.rank + 1))
    return prefix


def mamba2_state_passing(q, k, v, link: Link, dt, A, chunk: int = 64) -> torch.Tensor:
    """Mamba-2's SSM (Dao and Gu 2024, arXiv 2405.21060) over this rank's chunk: the state after it from zero,
    S_r = Σ_s exp(A·Σ_{s<t≤end} dt_t)·dt_s·k_s v_sᵀ, and its decay g_r = exp(A·Σ dt); the prefix P_r arrives from
    r − 1, g_r·P_r + S_r goes on; then the product's own chunked kernel runs from P_r. dt (B, H, n/P), A (H,);
    (B, H, D, D) sent, whatever n."""
    from attn_core.mechanisms.mamba2 import ssd, ssd_state

    own = ssd_state(k, v, dt, A, chunk, q.shape[1])
    decay = (dt.sum(-1) * A).exp()[..., None, None]  # (B, H, 1, 1)
    prefix = _passed_on(own, lambda p: decay * p + own, link)
    return ssd(q, k, v, dt, A, chunk, h=prefix)[0]


def deltanet_state_passing(q, k, v, link: Link, alpha, beta, chunk: int = 32) -> torch.Tensor:
    """Gated DeltaNet (Yang, Kautz, Hatamizadeh 2024, arXiv 2412.06464) over this rank's chunk: the update Sᵀ ←
    α(I − β k̂k̂ᵀ)Sᵀ + β k̂vᵀ is affine in S, so the chunk maps a state before it to M_r·P + S_r, with M_r (d_k × d_k)
    the chunk's run from the identity with v = 0 and S_r its run from zero; the prefix P_r arrives from r − 1,
    M_r·P_r + S_r goes on; then the chunked kernel runs from P_r. (B·Hk, D, D) sent, M_r stays home."""
    log_alpha = alpha.log()
    B, Hk, _, d = k.shape
    eye = torch.eye(d, dtype=v.dtype, device=v.device).expand(B * Hk, d, d).contiguous()
    through = _deltanet_run(None, k, torch.zeros_like(k), log_alpha, beta, chunk, eye)[1]  # M_r
    own = _deltanet_run(None, k, v, log_alpha, beta, chunk, torch.zeros_like(eye))[1]
    prefix = _passed_on(own, lambda p: through @ p + own, link)
    return _deltanet_run(q, k, v, log_alpha, beta, chunk, prefix)[0]


def _deltanet_run(q, k, v, log_alpha, beta, chunk: int, S):
    """gated_deltanet's chunked form from the state S (B·Hk, d_k, d_v) instead of zeros: (out or None, S after)."""
    from attn_core.mechanisms import gated_deltanet as gdn
    from attn_core.mechanisms._linear_core import causal_chunks

    B, Hk, n, d = k.shape
    out = None if q is None else torch.empty(*q.shape[:3], v.shape[-1], dtype=v.dtype, device=v.device)
    for s, e, c in causal_chunks(n, gdn.segment_rows(B * Hk, d, chunk, k.device.type), chunk):
        S = gdn._segment(q, k, v, log_alpha, beta, S, out, s, e, c)
    return out, S


def _compute(task: Task, link: Link, q, k, v) -> torch.Tensor:
    pos = positions(task, link.rank).to(q.device)
    ql, kl, vl = (x[:, :, pos].contiguous() for x in (q, k, v))
    if task.scheme == "ring":
        return ring_attention(ql, kl, vl, pos, link, task.causal)[0]
    if task.scheme == "ulysses":
        return ulysses(ql, kl, vl, link, task.mechanism, task.causal, dict(task.params))
    if task.mechanism == "linear":
        return linear_state_passing(ql, kl, vl, link)
    state = {key: t[:, :, pos] if t.dim() == 3 else t for key, t in mechanism_state(task, q.device).items()}
    if task.mechanism == "mamba2":
        return mamba2_state_passing(ql, kl, vl, link, **state, **dict(task.params))
    return deltanet_state_passing(ql, kl, vl, link, **state, **dict(task.params))


# -- the worker and the launcher ------------------------------------------------------------------------------------

def _worker(rank: int, tasks: tuple[Task, ...], procs: int, port: int, timeout_s: float, device: str,
            warmup: int, memory: bool, fail_rank: int | None, failure: str, results, parent: int) -> None:
    """One rank: join the group, run each task (after `warmup` untimed calls), report shards and counts. Ctrl-C
    and a hangup reach the whole process group: they are the launcher's to handle (it stops every rank). It dies
    with its parent process `parent` and with the launcher (`_lifeline`)."""
    _lifeline(parent)
    for name in ("SIGINT", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    try:
        backend = "nccl" if device == "cuda" else "gloo"
        if device == "cuda":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=procs,
                                timeout=timeout)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // procs))
        for index, task in enumerate(tasks):
            results.put(("done", rank, index, *_measured(task, rank, timeout, device, warmup, memory,
                                                       1 if rank == fail_rank else None, failure)))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as e:  # reported to the launcher, which ends the run with this sentence
        results.put(("error", rank, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}",
                     traceback.format_exc(limit=3)))
        raise SystemExit(1)


def _measured(task: Task, rank: int, timeout, device: str, warmup: int, memory: bool, die_at: int | None,
              failure: str):
    from attn_core.engine.env import peak_memory_probe

    q, k, v = inputs(task, device)
    link = Link(rank, task.procs, timeout)
    for _ in range(warmup):
        _compute(task, link, q, k, v)
    link = Link(rank, task.procs, timeout, die_at, failure)  # counts of the timed call only
    dist.barrier()
    start = time.perf_counter()
    out = _compute(task, link, q, k, v)
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    peak = None
    if memory:
        dist.barrier()
        peak = peak_memory_probe(device)[1](lambda: _compute(task, Link(rank, task.procs, timeout), q, k, v))
    return out.cpu().numpy(), elapsed, link.comm_s, peak, link.bytes_sent


def _probe_worker(rank: int, procs: int, port: int, timeout_s: float, results, parent: int) -> None:
    """One bare rank of `check_launch`: join a gloo group on localhost and all-reduce a one, nothing else."""
    _lifeline(parent)
    for name in ("SIGINT", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=procs,
                                timeout=datetime.timedelta(seconds=timeout_s))
        one = torch.ones(1)
        dist.all_reduce(one)
        dist.destroy_process_group()
        results.put(("done", rank, float(one)))
    except BaseException as e:  # reported to check_launch, which raises it as a sentence
        results.put(("error", rank, f"{type(e).__name__}: {str(e).strip()[:200]}"))
        raise SystemExit(1)


def check_launch(procs: int = 2, timeout_s: float = 20.0) -> None:
    """Start `procs` bare ranks (the launch's start method) that meet on localhost over gloo and all-reduce a one:
    returns when they did, raises DistributedError with the cause where this machine cannot (no loopback
    networking, no second process, no rendezvous within `timeout_s`). Runs none of the schemes; every rank ends."""
    try:
        port = free_port()
        ctx = _context()
        results = ctx.Queue()
    except OSError as e:
        raise DistributedError(f"{procs} processes cannot start and meet on localhost here ({e})") from None
    workers = [ctx.Process(target=_probe_worker, args=(r, procs, port, timeout_s, results, _parent_of_ranks(ctx)),
                           daemon=True) for r in range(procs)]
    try:
        try:
            with _bare_main(), _stops_held():
                for w in workers:
                    w.start()
        except OSError as e:
            raise DistributedError(f"{procs} processes cannot start here ({e})") from None
        sums = []
        for message in _messages(results, workers, procs, time.monotonic() + timeout_s + 30, timeout_s):
            if message[0] == "error":  # the start (imports), then the rendezvous
                raise DistributedError(f"rank {message[1]} could not join a gloo group on localhost: {message[2]}")
            sums.append(message[2])
        if sums != [float(procs)] * procs:
            raise DistributedError(f"the {procs} ranks' all-reduce of ones gave {sums}, not {procs}")
    finally:
        _stop(workers)
        results.close()


def free_port() -> int:
    """A TCP port free on localhost now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(scheme: str, mechanism: str = "softmax", procs: int = 2, n: int = 256, **kwargs) -> Result:
    """One distributed run (see `run_tasks`): Task(scheme, mechanism, procs, n, **task fields), and the launcher's
    options by name."""
    options = {key: kwargs.pop(key) for key in LAUNCH_OPTIONS if key in kwargs}
    params = tuple(sorted((kwargs.pop("params", None) or {}).items()))
    return run_tasks([Task(scheme, mechanism, procs, n, params=params, **kwargs)], **options)[0]


LAUNCH_OPTIONS = ("timeout_s", "device", "warmup", "memory", "cancel", "lock_wait_s", "memory_margin",
                  "memory_limit_bytes", "fail_rank", "failure")


def default_device(procs: int) -> str:
    """cuda (NCCL) where there is a GPU for each of the `procs` processes, else cpu (gloo)."""
    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= procs else "cpu"


def run_tasks(tasks: Sequence[Task], *, timeout_s: float = DEFAULT_TIMEOUT_S, device: str | None = None,
              warmup: int = 1, memory: bool = True, cancel: Callable[[], bool] | threading.Event | None = None,
              lock_wait_s: float | None = None, memory_margin: float = 0.2, memory_limit_bytes: int | None = None,
              fail_rank: int | None = None, failure: str = "exit") -> list[Result]:
    """Start P processes (one process group for all `tasks`, which share P), run each task on them and compare the
    gathered output with the single-process mechanism on the same seeded inputs; guarded as a sweep is.

    Guards, before anything starts: a task or option that cannot run is refused (ValueError, a sentence); a task
    whose predicted memory × (1 + memory_margin) exceeds the free memory (or `memory_limit_bytes`) comes back
    `skipped` with the reason (memory_guard); the machine's sweep lock is held while the ranks run (waiting up to
    `lock_wait_s`, default the sweep's, then DistributedError saying who holds it). `timeout_s` bounds every
    collective and the launch's wait for each result. Stop: `cancel()` (or a set Event) turning true, Ctrl-C or
    another exception in the caller ends every rank within seconds (Cancelled for `cancel`); every process is
    joined or killed before this returns or raises. `fail_rank` is a test hook: that rank exits abruptly at its
    first transfer of the timed call (`failure` "exit"), or stalls there, alive and silent ("stall")."""
    from attn_core.engine.lock import LOCK_WAIT_S, SweepBusyError, SweepLockError, sweep_lock

    tasks = [t.check() for t in tasks]
    if not tasks:
        raise ValueError("no task is given; give at least one")
    if failure not in ("exit", "stall"):
        raise ValueError(f"failure {failure!r}: the test hook's failures are 'exit' and 'stall'")
    if len({t.procs for t in tasks}) != 1:
        raise ValueError("tasks of one launch share their number of processes; launch each number apart")
    if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s <= 86400):
        raise ValueError(f"timeout_s = {timeout_s!r}: give a number of seconds above 0 (at most a day)")
    if not (isinstance(warmup, int) and 0 <= warmup <= 100):
        raise ValueError(f"warmup = {warmup!r}: give 0 to 100 untimed calls")
    if not (isinstance(memory_margin, (int, float)) and 0 <= memory_margin <= 10):
        raise ValueError(f"memory_margin = {memory_margin!r}: give a fraction from 0 to 10 (0.2 = 20%)")
    if memory_limit_bytes is not None and not (isinstance(memory_limit_bytes, int) and memory_limit_bytes > 0):
        raise ValueError(f"memory_limit_bytes = {memory_limit_bytes!r}: give a positive number of bytes, or None")
    procs = tasks[0].procs
    device = device or default_device(procs)
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: distributed runs take cpu (gloo) or cuda (NCCL)")
    if device == "cuda" and procs > torch.cuda.device_count():
        raise ValueError(f"NCCL takes one GPU a process: {procs} processes, {torch.cuda.device_count()} GPU(s) here; "
                         "give fewer processes or device='cpu' (gloo)")
    if not dist.is_available() or not (dist.is_nccl_available() if device == "cuda" else dist.is_gloo_available()):
        raise DistributedError(f"torch.distributed with the {'nccl' if device == 'cuda' else 'gloo'} backend is not "
                               "available in this torch build")
    skipped = {i: why for i, t in enumerate(tasks)
               if (why := memory_guard(t, device, memory_margin, memory_limit_bytes))}
    runnable = [t for i, t in enumerate(tasks) if i not in skipped]
    stopped = cancel.is_set if isinstance(cancel, threading.Event) else cancel or (lambda: False)
    shards: dict = {}
    if runnable:
        try:
            with sweep_lock(LOCK_WAIT_S if lock_wait_s is None else lock_wait_s, stopped):
                if stopped():
                    raise Cancelled("the run was cancelled before it started")
                shards = _launch(runnable, procs, timeout_s, device, warmup, memory, fail_rank, failure, stopped)
        except (SweepBusyError, SweepLockError) as e:
            if stopped():
                raise Cancelled("the run was cancelled while it waited for another sweep") from None
            raise DistributedError(f"{e} (a distributed run takes the machine as a sweep does)") from None
    references: dict[Task, torch.Tensor] = {}  # a task repeated (timing rounds) is compared with one reference
    results, index = [], 0
    for i, task in enumerate(tasks):
        if i in skipped:
            results.append(_skipped(task, device, skipped[i]))
            continue
        results.append(_result(task, device, [shards[(r, index)] for r in range(procs)], references))
        index += 1
    return results


def _context():
    """forkserver where the platform has it: one server process imports torch and this module once (the preload)
    and every launch forks its ranks from it in milliseconds, where spawn has each rank import torch afresh
    (seconds, P at once on the same cores). spawn elsewhere (Windows). The server lives as long as the caller. It
    starts with Ctrl-C and hangups ignored (a disposition kept through exec, which Python honours): they reach the
    whole process group but are the launcher's to handle, and one during its seconds of imports would otherwise end
    it with a traceback."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return torch.multiprocessing.get_context("spawn")
    from multiprocessing import forkserver

    ctx = torch.multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    main = threading.current_thread() is threading.main_thread()  # elsewhere Python cannot set handlers
    quiet = [getattr(signal, name) for name in ("SIGINT", "SIGHUP") if hasattr(signal, name)] if main else []
    held = {signum: signal.signal(signum, signal.SIG_IGN) for signum in quiet}  # for the fork and exec alone
    try:
        with _bare_main():
            forkserver.ensure_running()
    finally:
        for signum, handler in held.items():
            signal.signal(signum, handler)
    return ctx


def _launch(tasks, procs, timeout_s, device, warmup, memory, fail_rank, failure, stopped) -> dict:
    ctx = _context()
    results = ctx.Queue()
    port = free_port()
    workers = [ctx.Process(target=_worker, args=(r, tuple(tasks), procs, port, timeout_s, device, warmup, memory,
                                                 fail_rank, failure, results, _parent_of_ranks(ctx)), daemon=True)
               for r in range(procs)]
    got: dict = {}
    try:
        with _bare_main(), _stops_held():
            for w in workers:
                if stopped():
                    break
                w.start()
        deadline = time.monotonic() + timeout_s * (1 + len(tasks)) + 30  # the start (imports) and each task
        for message in _messages(results, workers, procs * len(tasks), deadline, timeout_s, stopped):
            if message[0] == "error":
                raise DistributedError(_failure(workers, message[1], message[2]))
            got[(message[1], message[2])] = message[3:]
        for w in workers:
            w.join(timeout_s)
            if w.exitcode not in (0, None):
                raise DistributedError(f"rank {workers.index(w)} ended with exit code {w.exitcode} after its work")
        return got
    finally:
        _stop(workers)
        results.close()


def _messages(results, workers, count: int, deadline: float, timeout_s: float, stopped=lambda: False):
    """The ranks' first `count` messages as they arrive ("error" ones end the count: the caller raises), polled in
    turns of 0.2 s, between which a stop (`stopped()`: Cancelled), a rank found dead or the `deadline` passed
    (DistributedError) ends the wait."""
    received = 0
    while received < count:
        if stopped():
            raise Cancelled(f"the run was cancelled; its {len(workers)} processes were stopped")
        try:
            message = results.get(timeout=0.2)
        except queue.Empty:
            _check_alive(workers, deadline, timeout_s)
            continue
        received += 1
        yield message


def _parent_of_ranks(ctx) -> int:
    """The pid of the process the ranks of context `ctx` are forked from: the forkserver (`_context` started it),
    or this one (spawn); 0 where unknown, which a rank does not check."""
    if ctx.get_start_method() != "forkserver":
        return os.getpid()
    from multiprocessing import forkserver

    return forkserver._forkserver._forkserver_pid or 0  # CPython's one forkserver client (private, no accessor)


def _lifeline(parent: int) -> None:
    """Tie this rank's life to the launcher's, so that a launcher killed outright (SIGKILL, the OOM killer), whose
    `finally` never runs, leaves no rank behind holding its memory, nor the forkserver behind them: (1) the
    forkserver's 'alive' pipe, whose write end every client inherits, is closed here, so that the server ends as
    soon as the launcher does (it reads EOF once no process holds that end; a rank holding it kept the server
    alive as long as the rank); (2) on Linux the kernel kills this rank when its parent, the forkserver, ends
    (`_die_with_parent`); (3) everywhere, a thread watches the pipe the launcher holds open for this rank
    (multiprocessing's parent sentinel) and ends the process at its EOF: the launcher is gone."""
    from multiprocessing import parent_process

    server = getattr(sys.modules.get("multiprocessing.forkserver"), "_forkserver", None)  # a forkserver's child
    if server is not None and server._forkserver_alive_fd is not None:  # CPython's client state (private)
        with contextlib.suppress(OSError):
            os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
    _die_with_parent(parent)
    launcher = parent_process()
    if launcher is not None and launcher.sentinel is not None:
        threading.Thread(target=_end_with, args=(launcher.sentinel,), daemon=True, name="launcher-watch").start()


def _end_with(sentinel) -> None:
    """Wait for the launcher's pipe to this rank to close (its end is held until the launcher ends), then end."""
    from multiprocessing import connection

    connection.wait([sentinel])
    os._exit(ORPHANED)


def _die_with_parent(parent: int) -> None:
    """Linux: ask the kernel for SIGKILL when the parent ends (prctl PR_SET_PDEATHSIG; the parent is the thread
    that forked this process: the forkserver's only thread, or the launch's, which waits for its ranks), then end
    at once if `parent` (0: unknown) has ended already, before the request was in place (this process was then
    handed to another). A no-op elsewhere, where the launcher's pipe alone tells."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes, prctl.restype = [ctypes.c_int] + [ctypes.c_ulong] * 4, ctypes.c_int
    if prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0 and parent and os.getppid() != parent:
        os._exit(ORPHANED)


@contextlib.contextmanager
def _stops_held():
    """Ctrl-C, SIGTERM and hangups noted, not acted on, while the ranks start, then raised again once they have (to
    the handlers that were there): a stop that interrupted a start could leave a rank started but unrecorded, or a
    start request queued at the forkserver (the first launch waits there for its imports) to run on unstopped. A
    second stop acts at once (a start that never ends). In the main thread only, where Python runs its handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []

    def note(signum: int, frame) -> None:
        noted.append(signum)
        if len(noted) > 1:
            raise KeyboardInterrupt(signal.Signals(signum).name)

    held = [getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)]
    before = {signum: signal.signal(signum, note) for signum in held}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
        if len(noted) == 1:
            signal.raise_signal(noted[0])


@contextlib.contextmanager
def _bare_main():
    """The caller's __main__ hidden while workers start: a spawned process re-runs the parent's main module before
    its target (multiprocessing's spawn), which in a script without a `__name__ == "__main__"` guard, or under
    Streamlit (whose script runner leaves the page it ran as __main__), starts it over. The workers need nothing of
    it: their target lives in this module."""
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = saved


def _failure(workers, rank: int, text: str) -> str:
    """The sentence for rank `rank` raising `text`: a rank found dead within a second is named first, as the cause."""
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        dead = [r for r, w in enumerate(workers) if r != rank and w.exitcode not in (None, 0, 1)]
        if dead:
            return (f"rank {dead[0]} died (exit code {workers[dead[0]].exitcode}) mid-run, and rank {rank} then failed "
                    f"({text[:160]}); the run was stopped")
        time.sleep(0.05)
    return f"rank {rank} failed: {text[:300]}; the run was stopped"


def _check_alive(workers, deadline: float, timeout_s: float) -> None:
    for rank, w in enumerate(workers):
        if w.exitcode not in (None, 0):
            raise DistributedError(f"rank {rank} died (exit code {w.exitcode}) before it finished; the other ranks "
                                   "were stopped")
    if time.monotonic() > deadline:
        raise DistributedError(f"no result within the timeout ({timeout_s:g} s a collective); the ranks were stopped")


def _stop(workers) -> None:
    """Terminate (SIGTERM) every worker still alive, kill (SIGKILL) any left after STOP_GRACE_S, and reap them
    all: no stray process."""
    workers = [w for w in workers if w.pid is not None]  # started ones
    for w in workers:
        if w.is_alive():
            w.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))
    for w in workers:
        if w.is_alive():
            w.kill()
            w.join(5)


def _skipped(task: Task, device: str, reason: str) -> Result:
    from attn_core.engine.env import peak_memory_probe

    shape = (task.batch, task.heads, task.n, task.head_dim)
    return Result(task=task, backend="nccl" if device == "cuda" else "gloo", device=device, max_abs_diff=None,
                  time_s=(), comm_s=(), peak_bytes=(), memory_method=peak_memory_probe(device)[0], bytes_sent=(),
                  bytes_predicted=bytes_predicted(task.scheme, shape, task.procs, task.causal, task.elem,
                                                  task.mechanism), status="skipped", reason=reason)


def _result(task: Task, device: str, shards: list, references: dict) -> Result:
    from attn_core.api import attention
    from attn_core.engine.env import peak_memory_probe

    if task not in references:
        with torch.inference_mode():
            state = mechanism_state(task) if task.scheme == "state" else {}
            references[task] = attention(task.mechanism, *inputs(task), causal=task.causal, **dict(task.params),
                                         **state)
    reference = references[task]
    output = torch.empty_like(reference)
    for rank, (shard, *_rest) in enumerate(shards):
        output[:, :, positions(task, rank)] = torch.from_numpy(shard)
    shape = (task.batch, task.heads, task.n, task.head_dim)
    return Result(
        task=task, backend="nccl" if device == "cuda" else "gloo", device=device,
        max_abs_diff=float((output - reference).abs().max()),
        time_s=tuple(s[1] for s in shards), comm_s=tuple(s[2] for s in shards),
        peak_bytes=tuple(s[3] for s in shards), memory_method=peak_memory_probe(device)[0] + " (each rank)",
        bytes_sent=tuple(int(s[4]) for s in shards),
        bytes_predicted=bytes_predicted(task.scheme, shape, task.procs, task.causal, task.elem, task.mechanism),
        output=output)

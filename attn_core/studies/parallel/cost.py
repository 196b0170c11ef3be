"""The cost model of the three schemes: the bytes each process sends and the memory it holds for one layer, the
memory guard of a launch, the schemes side by side for a model at a context, and a run's counts beside the model."""
from __future__ import annotations

from typing import Sequence

from attn_core.studies.parallel.task import SCHEMES, STATE_MECHANISMS, Result, Task


def bytes_predicted(scheme: str, shape: tuple[int, int, int, int], procs: int, causal: bool = False,
                    elem: int = 4, mechanism: str = "linear") -> tuple[int, ...]:
    """Bytes each rank sends for one layer's forward, shape (B, H, n, D), elements of `elem` bytes.

    ring: P − 1 steps, each passing one K and one V block of n/P positions on: 2·(P − 1)·B·H·(n/P)·D·elem, causal or
    not (zig-zag keeps the work even, not the traffic smaller). ulysses: four all-to-alls (q, k, v in, the output
    back), each keeping 1/P of its buffer at home: 4·(P − 1)·B·(H/P)·(n/P)·D·elem ≈ 4·n·H·D/P values. state: rank r
    < P − 1 sends the prefix of states in max(elem, 4) bytes, independent of n: B·H·(D·D + D) numbers for linear
    (the state and its normaliser), B·H·D·D for mamba2, gated_deltanet and kda (multi-head: Hk = H); the last sends
    nothing."""
    B, H, n, D = shape
    if scheme == "ring":
        return (2 * (procs - 1) * B * H * (n // procs) * D * elem,) * procs
    if scheme == "ulysses":
        return (4 * (procs - 1) * B * (H // procs) * (n // procs) * D * elem,) * procs
    if scheme == "state":
        per_head = {"linear": D * D + D, "mamba2": D * D, "gated_deltanet": D * D, "kda": D * D}[mechanism]
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
    """The attention layers of a planner model (attn_core.studies.planner.model.Model) as schemes_table takes them:
    the query heads, key/value heads and head dim of its most numerous kind of layer that is not a state mechanism
    (every kind where all are), and the count of its layers of that shape. E.g. Llama-3-8B: 32 layers of 32 heads, 8
    key/value heads of 128."""
    kinds = [layer for layer in model.layers if layer.mechanism not in STATE_MECHANISMS] or list(model.layers)
    shape_of = lambda layer: (layer.heads, layer.kv_heads, layer.head_dim)  # noqa: E731
    counts: dict = {}
    for layer in kinds:
        counts[shape_of(layer)] = counts.get(shape_of(layer), 0) + layer.count
    (heads, kv_heads, head_dim), layers = max(counts.items(), key=lambda item: item[1])
    return dict(heads=heads, kv_heads=kv_heads, head_dim=head_dim, layers=layers)


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

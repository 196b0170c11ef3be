"""The roofline checked here: a scaled-down stack of a model's layer kinds, each layer beside an MLP of the model's
shape (its width ratio, gated or not, the width a token runs through), run for real on this machine (a causal
prefill, then one decode step through every layer), against what the planner's roofline predicts for the same stack
on this machine as measured (devices.this_machine: a 256 MiB copy's bandwidth, square matmuls' FLOP/s). Reported as
predicted ÷ measured: a roofline is a bound, so below 1 says how far the kernels run from the machine's peaks.

    got = check_roofline(find("llama-3-8b"), budget_s=6)
    got.decode_ratio, got.prefill_ratio   # predicted ÷ measured
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from attn_core.engine import env, measure
from attn_core.engine.measurement import median_iqr
from attn_core.mechanisms import MEASURED
from attn_core.mechanisms._common import validated
from attn_core.studies.planner import builtin
from attn_core.studies.planner.devices import Device, this_machine
from attn_core.studies.planner.hf_config import read
from attn_core.studies.planner.model import Model, plan
from attn_core.studies.planner.predict import stack_order
from attn_core.studies.planner.roofline import decode_attention_flops
from attn_core.studies.planner.timing import GUARD, MEASURED_HEADS, STACK_LAYERS, _call, problem_of, scaled
from attn_core.studies.planner.weights import _experts, _mlp_layers

DTYPE = "float32"  # what every kernel runs fast in on a CPU, and the dtype this_machine's FLOP/s are taken in
LLAMA_RATIO = 14336 / 4096  # Llama 3 8B's config.json: intermediate_size over hidden_size, for a model without one


@dataclass(frozen=True)
class MlpShape:
    """The MLP beside each layer: `hidden` wide, `width` the intermediate width one token runs through (a mixture of
    experts: the experts it takes and the shared ones), `gated` (SwiGLU: 3 matrices; else 2), in `count` layers."""

    hidden: int
    width: int
    gated: bool
    count: int
    source: str

    @property
    def params(self) -> int:
        """Parameters of one MLP a token multiplies by: (3 or 2) · hidden · width."""
        return (3 if self.gated else 2) * self.hidden * self.width


def mlp_shape(model: Model, config: dict | None = None) -> MlpShape:
    """The MLP of `model`: from its Hugging Face `config` (hidden_size; each layer's dense width or the experts a token
    takes, averaged over the layers that have an MLP); without one, a built-in model's (builtin.MLPS), or a
    Llama-3-like gated MLP of 3.5 × the first kind's heads × head_dim in every layer. ValueError naming a config
    field that cannot be used."""
    if config is None and model == builtin.MODELS.get(model.name.lower()) and model.name.lower() in builtin.MLPS:
        hidden, width, gated, count = builtin.MLPS[model.name.lower()]
        return MlpShape(hidden, width, gated, count, f"{model.name}'s published sizes (builtin.MLPS)")
    if config is None:
        first = model.layers[0]
        hidden = first.heads * first.head_dim
        return MlpShape(hidden, round(LLAMA_RATIO * hidden), True, model.layer_count,
                        f"no config: a gated MLP of {LLAMA_RATIO:g} × {hidden:,} (Llama 3 8B's ratio) a layer")
    reading = read(config)
    f = reading.fields
    f.notes = []  # the defaults taken are the reader's; not repeated here
    e = _experts(f, reading)
    kinds = [k for k in _mlp_layers(f, reading, e) if k is not None]
    per_token = {"dense": e.dense, "moe": e.per_token * e.size + e.shared}
    width = round(sum(per_token[k] for k in kinds) / len(kinds)) if kinds else 0
    return MlpShape(f.whole("hidden_size"), width, e.gated, len(kinds),
                    f"config: {len(kinds)} MLP layers, {width:,} wide a token on average")


def scaled_stack(model: Model, mlp: MlpShape, heads: int = MEASURED_HEADS,
                 layers: int = STACK_LAYERS) -> tuple[Model, MlpShape]:
    """`model` scaled down as the measured planner times it: each kind on about `heads` query heads (`scaled`), the
    counts in proportion to about `layers` (one at least; no more than the model's), in float32; the MLP narrowed
    by the first kind's factor (its hidden and width both, so its ratio stays) in as many of the stack's layers as
    its share of the model's."""
    layers = min(layers, model.layer_count)  # a model of fewer layers is run whole
    kinds = tuple(dataclasses.replace(scaled(k, heads), count=max(1, round(k.count * layers / model.layer_count)))
                  for k in model.layers)
    stack = dataclasses.replace(model, name=f"{model.name[:50]}, scaled down", layers=kinds, dtype=DTYPE)
    factor = kinds[0].heads / model.layers[0].heads
    hidden = max(16, round(mlp.hidden * factor))
    width = round(mlp.width * hidden / mlp.hidden) if mlp.hidden else 0
    count = min(stack.layer_count, max(1, round(mlp.count * stack.layer_count / model.layer_count))) if width else 0
    return stack, dataclasses.replace(mlp, hidden=hidden, width=width, count=count)


@dataclass(frozen=True)
class RooflineCheck:
    """The scaled-down `stack` with its `mlp` on `device`: seconds predicted by the roofline and measured (median),
    for a causal prefill of `prefill_n` tokens and a decode step at `decode_n`, with the bound each prediction
    names."""

    stack: Model
    mlp: MlpShape
    device: Device
    prefill_n: int
    decode_n: int
    prefill_predicted_s: float
    prefill_measured_s: float
    prefill_bound: str
    decode_predicted_s: float
    decode_measured_s: float
    decode_bound: str
    notes: tuple[str, ...] = ()

    @property
    def prefill_ratio(self) -> float:
        """Predicted ÷ measured: 1 is the machine's peak reached; a roofline is a bound, so mostly below 1."""
        return self.prefill_predicted_s / self.prefill_measured_s

    @property
    def decode_ratio(self) -> float:
        return self.decode_predicted_s / self.decode_measured_s

    def as_dict(self) -> dict[str, Any]:
        return {"stack": self.stack.name, "layers": self.stack.layer_count, "mlp_layers": self.mlp.count,
                "mlp_hidden": self.mlp.hidden, "mlp_width": self.mlp.width, "device": self.device.name,
                "prefill_n": self.prefill_n, "decode_n": self.decode_n,
                "prefill_predicted_s": self.prefill_predicted_s, "prefill_measured_s": self.prefill_measured_s,
                "prefill_predicted_over_measured": self.prefill_ratio, "prefill_bound": self.prefill_bound,
                "decode_predicted_s": self.decode_predicted_s, "decode_measured_s": self.decode_measured_s,
                "decode_predicted_over_measured": self.decode_ratio, "decode_bound": self.decode_bound,
                "notes": list(self.notes)}


def predicted(stack: Model, mlp: MlpShape, device: Device, mode: str, n: int) -> tuple[float, str]:
    """(seconds, bound) of the roofline for the stack and its MLPs on `device`: a decode step at n reads every MLP's
    weights and each cache, and does 2 FLOPs a weight and the attention step's (decode_attention_flops); a prefill of
    n tokens reads the weights once, writes the cache, and does 2 · n FLOPs a weight and plan's prefill FLOPs."""
    made = plan(stack, n, dtype=DTYPE)
    weights = mlp.count * mlp.params
    if mode == "decode":
        nbytes, flops = weights * 4 + made.decode_bytes, 2 * weights + decode_attention_flops(stack, n)
    else:
        nbytes, flops = weights * 4 + made.total_bytes, 2 * weights * n + made.prefill_flops
    memory, compute = nbytes / device.bandwidth_bytes_per_s, flops / device.flops_per_s
    return (memory, "memory-bound: bytes") if memory >= compute else (compute, "compute-bound: FLOPs")


def _mlp_call(mlp: MlpShape, tokens: int, seed: int) -> Callable[[], Any]:
    """One MLP on `tokens` rows: x W₁ (gate and up together where gated), SiLU(gate) · up, then W₂; own weights."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, mlp.hidden, generator=g)
    w1 = torch.randn(mlp.hidden, (2 if mlp.gated else 1) * mlp.width, generator=g) / math.sqrt(mlp.hidden)
    w2 = torch.randn(mlp.width, mlp.hidden, generator=g) / math.sqrt(mlp.width)

    def run() -> torch.Tensor:
        h = x @ w1
        if mlp.gated:
            gate, up = h.chunk(2, dim=-1)
            h = torch.nn.functional.silu(gate) * up
        else:
            h = torch.relu(h).square()  # Nemotron-H's squared ReLU
        return h @ w2
    return run


def _measured(stack: Model, mlp: MlpShape, mode: str, n: int, repeats: int, share_s: float) -> tuple[float, float]:
    """Median seconds of the stack's `mode` at n run for real: each layer's attention (the engine's own call on its
    seeded inputs), then its MLP where it has one, layer after layer in stack_order; one warm-up call, then up to
    `repeats` samples while `share_s` seconds last (one at least): (the median, the warm-up call's seconds).
    RuntimeError past free memory."""
    order = stack_order(stack)
    problems = [problem_of(layer, mode, n, dtype=DTYPE, seed=i) for i, layer in enumerate(order)]
    need = sum(measure.required_bytes(MEASURED[p.mechanism], p) for p in problems)
    need += mlp.count * (mlp.params + 4 * n * mlp.width) * 4
    if need * (1 + GUARD.memory_margin) > env.free_memory_bytes("cpu"):
        raise RuntimeError(f"the scaled-down stack would need {measure.format_bytes(need)}, more than this machine "
                           "has free; check at shorter lengths")
    with torch.inference_mode(), validated():
        ordered, given = [], 0
        for i, p in enumerate(problems):
            ordered.append(_call(MEASURED[p.mechanism], p))
            if (i + 1) * mlp.count // len(problems) > given:  # mlp.count MLPs spread evenly through the layers
                ordered.append(_mlp_call(mlp, 1 if mode == "decode" else n, seed=1000 + i))
                given += 1

        def run() -> None:
            for call in ordered:
                call()
        clock, began = env.device_timer("cpu"), time.perf_counter()
        first = clock(run, 1)
        times = max(1, min(50, math.ceil(1e-3 / max(first, 1e-9))))
        samples = [clock(run, times) / times]
        while len(samples) < repeats and time.perf_counter() - began + first * times < share_s:
            samples.append(clock(run, times) / times)
    env.release_cached_memory("cpu")
    return median_iqr(samples)[0], first


def check_roofline(model: Model, *, config: dict | None = None, prefill_n: int | None = None,
                   decode_n: int | None = None, budget_s: float = 10.0, threads: int | None = 1,
                   repeats: int = 3) -> RooflineCheck:
    """`model` scaled down with its MLP (`mlp_shape`, `scaled_stack`) run here on the CPU in float32 and predicted by
    the roofline on this machine as measured with the same threads. None lengths: 1,024 prefill tokens and a 16,384
    context (2,048 where a kind keeps a recurrent state), halved while one call, at 4 × the roofline's time (about
    what the kernels reach here), or the warm-up call itself, would overrun budget_s / (2 · (repeats + 1)) (64 at
    least); each mode's samples stop at half the budget (one taken at least).
    ValueError with a sentence for bad arguments; RuntimeError when the stack cannot fit in memory."""
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not 0 < budget_s <= 600:
        raise ValueError(f"budget_s must be a number of seconds above 0 and at most 600, got {budget_s!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= 100:
        raise ValueError(f"repeats must be a whole number from 1 to 100, got {repeats!r}")
    if found := model.problems():
        raise ValueError("; ".join(found))
    stack, mlp = scaled_stack(model, mlp_shape(model, config))
    call_s = budget_s / (2 * (repeats + 1)) / 4
    with env.cpu_threads(threads):
        device = this_machine("cpu", DTYPE)
        lengths = {}
        # a recurrent kind's decode step needs its state made by a prefill of the context: a shorter one keeps that
        # setup short (the state's step costs the same at any context)
        recurrent = any(k.kind == "state" for k in plan(stack, 64, dtype=DTYPE).kinds)
        figures = {}
        for mode, given, start in (("prefill", prefill_n, 1024), ("decode", decode_n, 2048 if recurrent else 16384)):
            n = given or start
            while not given and n > 64 and predicted(stack, mlp, device, mode, n)[0] > call_s:
                n //= 2
            while True:  # halved again while the warm-up call itself overruns its share (recurrent kernels here)
                seconds, first = _measured(stack, mlp, mode, n, repeats, budget_s / 2)
                if given or n <= 64 or first <= budget_s / (2 * (repeats + 1)):
                    break
                n //= 2
            lengths[mode], figures[mode] = n, (*predicted(stack, mlp, device, mode, n), seconds)
    note = (f"{stack.layer_count} layers ({', '.join(f'{k.count} × {k.name}' for k in stack.layers)}) and "
            f"{mlp.count} MLPs of {mlp.hidden:,} × {mlp.width:,} ({'gated' if mlp.gated else 'not gated'}; "
            f"{mlp.source}) on {device.name} ({torch.get_num_threads() if threads is None else threads} "
            "thread(s)) in float32; attention cores and MLPs, the attention's projections and the norms left out "
            "of both the run and the prediction")
    (p_s, p_bound, p_m), (d_s, d_bound, d_m) = figures["prefill"], figures["decode"]
    return RooflineCheck(stack, mlp, device, lengths["prefill"], lengths["decode"], p_s, p_m, p_bound, d_s, d_m,
                         d_bound, (note, device.source))

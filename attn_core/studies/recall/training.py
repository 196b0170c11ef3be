"""Recall trained live: a Setup validated once, its memory priced before anything is allocated, one model trained a
learning rate and the best held-out accuracy kept, beside the cache or state the mechanism holds."""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch
from torch import nn

from attn_core.api import get
from attn_core.engine import env
from attn_core.engine.untrusted import clipped
from attn_core.nn import generation
from attn_core.spec import Shape
from attn_core.studies.recall.model import RecallModel
from attn_core.studies.recall.task import BOUNDS, IGNORE, Task, is_whole, mqar

# the page's and the CLI's mechanisms: softmax, a window narrower than the default task's 8 tokens of pairs, a state
DEFAULT_MECHANISMS = (("softmax", {}), ("sliding_window", {"window": 4}), ("linear", {}), ("gated_deltanet", {}))
EVAL_ROWS = 256  # held-out sequences read at once, at least (a mechanism without random state; see `accuracy`)
MEMORY_MARGIN = 0.2  # the memory guard's safety margin, as a sweep's default
EVAL_SEED_OFFSET = 7919  # held-out sequences come from seed + this, a stream the training batches never draw


@dataclass(frozen=True)
class Setup:
    """One recall experiment, validated once: the task, the model's size, the training budget, the learning rates
    swept (the best one's run is reported, as Zoology reports the best of its sweep) and the seed."""

    task: Task = Task()
    d_model: int = 32
    layers: int = 2
    heads: int = 2
    steps: int = 300
    batch: int = 16
    lrs: tuple[float, ...] = (3e-3, 1e-2)
    eval_sequences: int = 256
    eval_every: int = 25
    seed: int = 0
    device: str = "cpu"
    threads: int | None = 1  # torch CPU threads while training (None: torch's own); see `env.cpu_threads`

    def problems(self) -> list[str]:
        """What is wrong with these settings, one sentence each naming the setting to change; empty when they can
        run (the memory they need together is `memory_problem`'s, per mechanism)."""
        from attn_core.engine.problem import MAX_THREADS

        found = self.task.problems()
        for name in ("d_model", "layers", "heads", "batch", "eval_sequences", "eval_every", "seed"):
            value, (low, high) = getattr(self, name), BOUNDS[name]
            if not is_whole(value, low, high):
                found.append(f"{name} must be a whole number from {low} to {high:,}, got {value!r}")
        if self.threads is not None and not is_whole(self.threads, 1, MAX_THREADS):
            found.append(f"threads must be a whole number from 1 to {MAX_THREADS} (4 a core here), or None for "
                         f"torch's own, got {self.threads!r}")
        if not is_whole(self.steps, *BOUNDS["steps"]):
            found.append(f"steps must be a whole number from 1 to {BOUNDS['steps'][1]:,}, got {self.steps!r}: a model "
                         "trained for no step recalls nothing; give at least 1 step")
        if not found and self.d_model % self.heads:
            found.append(f"d_model {self.d_model} is not divisible by {self.heads} heads; choose a multiple of "
                         f"{self.heads}")
        if not isinstance(self.lrs, (tuple, list)) or not 1 <= len(self.lrs) <= BOUNDS["lrs"][1] or not all(
                isinstance(lr, (int, float)) and not isinstance(lr, bool) and 0 < lr < 1 and math.isfinite(lr)
                for lr in self.lrs):
            found.append(f"learning rates must be 1 to {BOUNDS['lrs'][1]} numbers between 0 and 1, got "
                         f"{clipped(repr(self.lrs), 80)}")
        if why := _device_problem(self.device):
            found.append(why)
        return found

    def check(self) -> "Setup":
        if found := self.problems():
            raise ValueError(found[0])
        return self


def _device_problem(device: Any) -> str:
    """'' for a device this machine has, else the sentence (one without CUDA asked for cuda; meta, which holds no
    numbers to train)."""
    found = env.available_devices()
    if device in found:
        return ""
    what = "is not available on this machine" if device in env.DEVICES else "is not a device recall trains on"
    return f"device {clipped(repr(device), 40)} {what}; choose {' or '.join(found)}"


def with_setup(setup: Setup, **changes: Any) -> Setup:
    """A copy of `setup` with some fields changed, the task's (vocab, seq, pairs) among them; validated."""
    task = replace(setup.task, **{k: changes.pop(k) for k in ("vocab", "seq", "pairs") if k in changes})
    return replace(setup, task=task, **changes).check()


@dataclass(frozen=True)
class Point:
    """One step of one learning rate's run: the training batch's loss and answer accuracy."""

    lr: float
    step: int
    loss: float
    accuracy: float


@dataclass
class Result:
    """A mechanism's recall: held-out `accuracy` of the best learning rate's model, every run's accuracy in
    `by_lr`, its curve, the cache or state bytes one layer holds for one sequence (NaN with `state_note` for a
    mechanism without a generation form) and the seconds all of its training took. `stopped`: cut short."""

    key: str
    params: dict
    accuracy: float = math.nan
    best_lr: float = math.nan
    by_lr: dict = field(default_factory=dict)
    curve: list = field(default_factory=list)
    state_bytes: float = math.nan
    state_note: str = ""
    train_s: float = 0.0
    stopped: bool = False

    @property
    def name(self) -> str:
        """'softmax', 'sliding_window:window=8': the key and its parameters as the CLI writes them."""
        return ":".join([self.key, *(f"{k}={v}" for k, v in self.params.items())])

    def as_dict(self) -> dict:
        """The CLI's object; NaN (no generation form, nothing trained) as None, which JSON can hold."""
        return {"mechanism": self.name, "accuracy": _number(self.accuracy), "state_bytes": _number(self.state_bytes),
                "train_s": self.train_s, "best_lr": self.best_lr, "stopped": self.stopped,
                **({"state_note": self.state_note} if self.state_note else {})}


def _number(x: float) -> float | None:
    return None if math.isnan(x) else x


def check_mechanism(key: str, params: dict, setup: Setup | None = None) -> dict:
    """The mechanism's parameters with defaults; ValueError with a sentence for an unknown key, bad parameters, a
    mechanism that cannot run causal (recall is learned autoregressively: an answer may see only earlier tokens) or,
    given a setup, one that cannot run at its shape (a block longer than the sequence, key/value heads that do not
    divide the heads) or whose training would not fit in the device's free memory (`memory_problem`)."""
    spec = get(key)
    kv_heads = params.get("kv_heads")
    rest = {k: v for k, v in params.items() if k != "kv_heads"}
    if not spec.supports.causal:
        raise ValueError(f"{spec.label} cannot be causal, and recall is learned autoregressively (an answer may see "
                         f"only the tokens before it); choose another mechanism")
    spec.check_params(rest)
    if setup is not None:
        heads = setup.heads
        if kv_heads is not None and (isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads < 1
                                     or heads % kv_heads):
            raise ValueError(f"kv_heads = {kv_heads!r} does not divide the {heads} heads; choose a divisor of {heads}")
        spec.check(Shape(setup.batch, heads, setup.task.seq, setup.task.seq, setup.d_model // heads, dtype="float32",
                         causal=True, Hk=kv_heads), spec.resolved(rest))
        if why := memory_problem(key, {**spec.resolved(rest), "kv_heads": kv_heads}, setup):
            raise ValueError(why)
    return {**spec.resolved(rest), **({"kv_heads": kv_heads} if kv_heads is not None else {})}


def state_bytes(key: str, params: dict, setup: Setup) -> tuple[float, str]:
    """Bytes one layer's cache or state holds after one sequence of setup.task.seq tokens in float32
    (generation.cache_bytes: softmax's keys and values, a window's last w + 1, a recurrent state's fixed size), and
    '' ; (NaN, why) for a mechanism that cannot generate token by token."""
    ok, why = generation.can_generate(key)
    if not ok:
        return math.nan, why
    kv_heads = params.get("kv_heads")
    rest = {k: v for k, v in params.items() if k != "kv_heads"}
    n = setup.task.seq
    shape = Shape(1, setup.heads, n, n, setup.d_model // setup.heads, dtype="float32", causal=True, Hk=kv_heads)
    return float(generation.cache_bytes(key, shape, **rest)), ""


def required_bytes(key: str, params: dict, setup: Setup) -> dict[str, float]:
    """Bytes training mechanism `key` at `setup` holds at its peak, by part, in float32: the memory guard's estimate
    from the settings alone, before anything is allocated. With d = d_model, n = seq, V = vocab, B = batch:
    'model and optimizer': weights, gradients and AdamW's two moments, 16 bytes a parameter, at most
    (2V + n)·d + (d + 1)·V + layers·(8d² + 11d) + 2d parameters. 'held-out sequences': inputs and targets (int64)
    and their draw's keys and values (float32 draws and their int64 order over the vocabulary), kept throughout.
    'training step': one batch's forward and backward: each layer's attention as the engine's memory guard prices a
    forward+backward point (`engine.measure.required_bytes` over (B, heads, n, d/heads)); the blocks' other
    activations kept for the backward (12·B·n·d values a layer: norms, projections, the MLP's 2d-wide hidden layer)
    and one layer's gradients of them; the embeddings (3·B·n·d); the logits, their log-softmax and its gradient
    (3·B·n·V). 'evaluation pass': the forward of `eval_rows` sequences without gradients, its attention priced as a
    forward point, the blocks' other activations (8·rows·n·d) and the logits (rows·n·V). Their peak: `peak_bytes`."""
    from attn_core.engine.measure import required_bytes as point_bytes
    from attn_core.engine.problem import Problem

    d, n, V, B = setup.d_model, setup.task.seq, setup.task.vocab, setup.batch
    kv_heads = params.get("kv_heads")
    rest = tuple(sorted((k, v) for k, v in params.items() if k != "kv_heads"))
    weights = (2 * V + n) * d + (d + 1) * V + setup.layers * (8 * d * d + 11 * d) + 2 * d

    def attention(batch: int, mode: str) -> float:
        problem = Problem(mechanism=key, params=rest, batch=batch, heads=setup.heads, kv_heads=kv_heads, n=n,
                          d_model=d, dtype="float32", device=setup.device, mode=mode, causal=True)
        return float(point_bytes(get(key), problem))

    rows = eval_rows(key, setup)
    count = held_out_count(setup)
    return {"model and optimizer": 16.0 * weights,
            "held-out sequences": count * (16.0 * n + 12.0 * V),
            "training step": setup.layers * attention(B, "forward+backward") + 4 * 12 * B * n * d * (setup.layers + 1)
            + 4 * B * n * (3 * V + 3 * d) + 12.0 * B * V,
            "evaluation pass": attention(rows, "forward") + 4 * rows * n * (V + 8 * d)}


def peak_bytes(parts: dict[str, float]) -> float:
    """The peak of `required_bytes`' parts: the model and the held-out sequences stay while training, then
    evaluating, each in turn, runs."""
    return parts["model and optimizer"] + parts["held-out sequences"] + max(parts["training step"],
                                                                            parts["evaluation pass"])


MEMORY_ADVICE = {"model and optimizer": "a smaller vocab or d_model, or fewer layers",
                 "held-out sequences": "fewer held-out sequences (eval) or a smaller vocab",
                 "training step": "a smaller batch, seq or d_model, or fewer layers",
                 "evaluation pass": "a smaller seq, vocab or batch"}


def memory_problem(key: str, params: dict, setup: Setup, *, margin: float = MEMORY_MARGIN,
                   limit: int | None = None) -> str:
    """'' when training `key` fits: its need (`required_bytes`) × (1 + margin) within the free memory of the setup's
    device (capped at `limit`), as the engine's memory guard decides for a sweep's point; else the sentence, naming
    the part that needs the most and the settings that shrink it."""
    from attn_core.engine.measure import format_bytes

    parts = required_bytes(key, params, setup)
    need = peak_bytes(parts) * (1 + margin)
    free = env.free_memory_bytes(setup.device)
    capped = limit is not None and limit < free
    free = limit if capped else free
    if need <= free:
        return ""
    part = max(parts, key=parts.get)
    return (f"training {get(key).label} at these settings would need {format_bytes(need)} (the {part} "
            f"{format_bytes(parts[part])} of it, with a {margin:.0%} safety margin), {format_bytes(free)} free on "
            f"{setup.device}{' under the limit set' if capped else ''}; choose {MEMORY_ADVICE[part]}")


def held_out_count(setup: Setup) -> int:
    """The held-out sequences drawn: eval_sequences rounded up to whole batches."""
    return -(-setup.eval_sequences // setup.batch) * setup.batch


def eval_rows(key: str, setup: Setup) -> int:
    """Held-out sequences read at once: the training batch for a mechanism with random state (its gates are drawn
    per batch row, and the model learned with those), else at least EVAL_ROWS, at most all of them."""
    count = held_out_count(setup)
    return setup.batch if get(key).state.init else min(count, max(setup.batch, EVAL_ROWS))


def accuracy(model: RecallModel, inputs: torch.Tensor, targets: torch.Tensor, batch: int) -> float:
    """Share of the answer positions where the model's most likely token is the value, read `batch` sequences at a
    time (for a mechanism with random state, the training batch: Gated DeltaNet's and Mamba-2's seeded gates are
    drawn per batch row, and the model learned with those)."""
    right = total = 0
    with torch.no_grad():
        for start in range(0, len(inputs), batch):
            x, y = inputs[start:start + batch], targets[start:start + batch]
            answer = y != IGNORE
            right += int((model(x).argmax(-1)[answer] == y[answer]).sum())
            total += int(answer.sum())
    return right / max(total, 1)


def train(key: str, params: dict | None = None, setup: Setup = Setup(),
          progress: Callable[[Point], Any] | None = None, stop: Callable[[], bool] | None = None) -> Result:
    """Train mechanism `key` (with `params`, `kv_heads` among them for shared key/value heads) on MQAR once per
    learning rate of the setup, from the same seed and batches; the result keeps the best held-out accuracy.
    `progress(point)` every setup.eval_every steps; `stop()` is asked before each step, and True ends training
    with the curve so far (the held-out accuracy is then of the model as it stands). ValueError with a sentence for
    bad settings or a mechanism that cannot be causal. Time O(len(lrs)·steps·batch·layers·cost of the mechanism)."""
    setup.check()
    params = check_mechanism(key, dict(params or {}), setup)
    result = Result(key, dict(params))
    result.state_bytes, result.state_note = state_bytes(key, params, setup)
    held_out = [t.to(setup.device) for t in mqar(setup.task, held_out_count(setup), setup.seed + EVAL_SEED_OFFSET)]
    _warm_optimizer()
    start = time.perf_counter()
    best_curve: list = []
    for lr in setup.lrs:
        curve: list = []
        with env.cpu_threads(setup.threads):
            model, stopped = _run(key, params, setup, lr, progress, stop, curve)
        model.eval()
        result.by_lr[lr] = accuracy(model, *held_out, eval_rows(key, setup))
        if not result.by_lr[lr] <= result.accuracy:  # the first, and any better one (NaN compares False)
            result.accuracy, result.best_lr, best_curve = result.by_lr[lr], lr, curve
        if stopped:
            result.stopped = True
            break
    result.train_s, result.curve = time.perf_counter() - start, best_curve
    return result


def _run(key: str, params: dict, setup: Setup, lr: float, progress, stop, curve: list) -> tuple[RecallModel, bool]:
    """Train one model at one learning rate (AdamW, cosine decay to zero over the steps); True when stopped."""
    kv_heads, rest = params.get("kv_heads"), {k: v for k, v in params.items() if k != "kv_heads"}
    model = RecallModel(key, setup.task.vocab, setup.task.seq, d_model=setup.d_model, layers=setup.layers,
                        heads=setup.heads, kv_heads=kv_heads, params=rest, seed=setup.seed).to(setup.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * s / setup.steps)))
    for step in range(1, setup.steps + 1):
        if stop is not None and stop():
            return model, True
        x, y = (t.to(setup.device) for t in mqar(setup.task, setup.batch, setup.seed * 1_000_003 + step))
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if not torch.isfinite(nn.utils.clip_grad_norm_(model.parameters(), 1.0)):
            return model, False  # diverged: kept as it stands, and held-out accuracy says what it recalls
        optimizer.step()
        schedule.step()
        if step % setup.eval_every == 0 or step == setup.steps:
            answer = y != IGNORE
            point = Point(lr, step, loss.item(), float((logits.argmax(-1)[answer] == y[answer]).float().mean()))
            curve.append(point)
            if progress is not None:
                progress(point)
    return model, False


@functools.cache
def _warm_optimizer() -> None:
    """One throwaway AdamW step: the first step in a process imports seconds of modules (torch's compiler stack),
    which would otherwise be counted in the first mechanism's train time."""
    weight = nn.Parameter(torch.zeros(1))
    weight.grad = torch.ones(1)
    torch.optim.AdamW([weight]).step()

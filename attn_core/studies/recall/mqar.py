"""Multi-query associative recall (MQAR), trained live: what a mechanism can still learn, beside what it costs
(Zoology, Arora et al. 2023, 'Zoology: Measuring and Improving Recall in Efficient Language Models', arXiv 2312.04927).

A sequence holds `pairs` key–value pairs, then queries of earlier keys; a tiny causal model of any mechanism of the
catalogue must output each queried key's value. Softmax attention recalls at any length; a fixed-size state or a
window recalls only what it holds."""
from __future__ import annotations

import contextlib
import functools
import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import torch
from torch import nn

from attn_core.nn import generation
from attn_core.api import get
from attn_core.mechanisms import MECHANISMS
from attn_core.nn.layers import MultiHeadAttention
from attn_core.spec import Shape
from attn_core.engine.untrusted import clipped, printable

# the page's and the CLI's mechanisms: softmax, a window narrower than the default task's 8 tokens of pairs, a state
DEFAULT_MECHANISMS = (("softmax", {}), ("sliding_window", {"window": 4}), ("linear", {}), ("gated_deltanet", {}))
# each setting's range: far above what a tiny model of this study needs, far below what ends in an allocation
# failure before the memory guard (`memory_problem`) has read the sizes together
BOUNDS = {"vocab": (4, 1 << 20), "seq": (4, 1 << 16), "d_model": (1, 1 << 14), "layers": (1, 64), "heads": (1, 1024),
          "batch": (1, 1 << 16), "steps": (1, 1_000_000), "eval_sequences": (1, 1 << 20), "eval_every": (1, 1_000_000),
          "seed": (0, (1 << 32) - 1), "lrs": (1, 16), "pairs": (1, 1 << 14)}
MAX_SEQUENCES = 1 << 21  # sequences one `mqar` call draws: the held-out set's most, rounded up to whole batches
MAX_DRAW_SEED = (1 << 63) - 1  # torch's generator takes a 64-bit seed (a step's is seed·1,000,003 + step)
EVAL_ROWS = 256  # held-out sequences read at once, at least (a mechanism without random state; see `accuracy`)
MEMORY_MARGIN = 0.2  # the memory guard's safety margin, as a sweep's default
IGNORE = -100  # the target of every position that is not an answer: no loss, no accuracy (torch's ignore_index)
EVAL_SEED_OFFSET = 7919  # held-out sequences come from seed + this, a stream the training batches never draw


@dataclass(frozen=True)
class Task:
    """The MQAR task: sequences of `seq` tokens over a vocabulary of `vocab` tokens, each with `pairs` key–value pairs.

    Token 0 fills the gaps; keys are drawn from [1, vocab/2) and values from [vocab/2, vocab), disjoint halves as in
    Zoology, each without repeats within a sequence. The pairs come first (k₁ v₁ … k_K v_K); after them every key is
    queried once, in random order, at a random even offset of the rest (uniform; Zoology draws the gaps from a power
    law): the query's key at position p, its value at p + 1 (the input of the next step), the answer target at p.
    Needs 4·pairs ≤ seq and pairs < vocab/2."""

    vocab: int = 32
    seq: int = 32
    pairs: int = 4

    def problems(self) -> list[str]:
        """What is wrong with these settings, one sentence each; empty when the task can be drawn."""
        found = [f"{name} must be a whole number from {BOUNDS[name][0]} to {BOUNDS[name][1]:,}, got {value!r}"
                 for name, value in (("vocab", self.vocab), ("seq", self.seq), ("pairs", self.pairs))
                 if not _whole(value, *BOUNDS[name])]
        if found:
            return found
        if 4 * self.pairs > self.seq:
            found.append(f"{self.pairs} pairs and their {self.pairs} queries take {4 * self.pairs} tokens, more than "
                         f"the sequence's {self.seq}; choose at most {self.seq // 4} pairs or a sequence of at least "
                         f"{4 * self.pairs} tokens")
        if min(self.vocab // 2 - 1, self.vocab - self.vocab // 2) < self.pairs:
            found.append(f"a vocabulary of {self.vocab} tokens holds {self.vocab // 2 - 1} distinct keys (half of "
                         f"it, less the filler token), too few for {self.pairs} pairs; choose a vocabulary of at "
                         f"least {2 * self.pairs + 2} tokens or at most {self.vocab // 2 - 1} pairs")
        return found

    def check(self) -> "Task":
        if found := self.problems():
            raise ValueError(found[0])
        return self

    @property
    def chance(self) -> float:
        """Accuracy of a guess among the values: 1 / (vocab − vocab/2)."""
        return 1.0 / (self.vocab - self.vocab // 2)


def mqar(task: Task, count: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` sequences of the task, drawn from `seed`: inputs (count, seq) int64 and targets (count, seq) int64,
    the queried key's value at each query position and IGNORE elsewhere. O(count·(seq + vocab)) time and memory
    (each sequence draws its keys and values as orders of the vocabulary's halves)."""
    task.check()
    if not _whole(count, 1, MAX_SEQUENCES):
        raise ValueError(f"count must be a whole number of sequences from 1 to {MAX_SEQUENCES:,}, got {count!r}")
    if not _whole(seed, 0, MAX_DRAW_SEED):
        raise ValueError(f"seed must be a whole number from 0 to 2**63 - 1, got {seed!r}")
    g = torch.Generator().manual_seed(seed)
    K, half = task.pairs, task.vocab // 2
    keys = torch.rand(count, half - 1, generator=g).argsort(-1)[:, :K] + 1  # K distinct keys of [1, half)
    values = torch.rand(count, task.vocab - half, generator=g).argsort(-1)[:, :K] + half  # K distinct values
    inputs = torch.zeros(count, task.seq, dtype=torch.int64)
    targets = torch.full((count, task.seq), IGNORE, dtype=torch.int64)
    inputs[:, 0:2 * K:2], inputs[:, 1:2 * K:2] = keys, values
    slots = (task.seq - 2 * K) // 2  # even offsets after the pairs that have room for a key and its value
    where = 2 * K + 2 * torch.rand(count, slots, generator=g).argsort(-1)[:, :K]  # (count, K) query positions
    order = torch.rand(count, K, generator=g).argsort(-1)  # which pair each query asks about
    rows = torch.arange(count)[:, None]
    asked, answer = keys.gather(1, order), values.gather(1, order)
    inputs[rows, where], inputs[rows, where + 1], targets[rows, where] = asked, answer, answer
    return inputs, targets


class Block(nn.Module):
    """x + attention(norm(x)), then x + MLP(norm(x)) (pre-norm, as GPT-2): (B, n, d) → (B, n, d)."""

    def __init__(self, d_model: int, heads: int, mechanism: str, params: dict, kv_heads: int | None, seed: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attention = MultiHeadAttention(d_model, heads, mechanism, True, kv_heads=kv_heads, seed=seed, **params)
        self.mlp = nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.GELU(), nn.Linear(2 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class RecallModel(nn.Module):
    """Token and learned position embeddings, `layers` causal Blocks of mechanism `key`, a norm and an output head:
    tokens (B, n) int64 → logits (B, n, vocab). Position embeddings because attention alone cannot tell which key
    came just before a value (Zoology's attention baselines carry them too). Weights drawn from `seed`."""

    def __init__(self, key: str, vocab: int, seq: int, *, d_model: int = 64, layers: int = 2, heads: int = 2,
                 kv_heads: int | None = None, params: dict | None = None, seed: int = 0):
        super().__init__()
        with torch.random.fork_rng(devices=[]):  # the weights depend on `seed` alone, never on the caller's RNG
            torch.manual_seed(seed)
            self.embed, self.position = nn.Embedding(vocab, d_model), nn.Embedding(seq, d_model)
            self.previous = nn.Embedding(vocab, d_model)  # the token before, a width-2 causal convolution
            self.blocks = nn.ModuleList(Block(d_model, heads, key, dict(params or {}), kv_heads, seed + i)
                                        for i in range(layers))
            self.norm, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        x = x + nn.functional.pad(self.previous(tokens[:, :-1]), (0, 0, 1, 0))  # position 0 has no token before
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


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
    threads: int | None = 1  # torch CPU threads while training (None: torch's own); see `_threads`

    def problems(self) -> list[str]:
        """What is wrong with these settings, one sentence each naming the setting to change; empty when they can
        run (the memory they need together is `memory_problem`'s, per mechanism)."""
        from attn_core.engine.problem import MAX_THREADS

        found = self.task.problems()
        for name in ("d_model", "layers", "heads", "batch", "eval_sequences", "eval_every", "seed"):
            value, (low, high) = getattr(self, name), BOUNDS[name]
            if not _whole(value, low, high):
                found.append(f"{name} must be a whole number from {low} to {high:,}, got {value!r}")
        if self.threads is not None and not _whole(self.threads, 1, MAX_THREADS):
            found.append(f"threads must be a whole number from 1 to {MAX_THREADS} (4 a core here), or None for "
                         f"torch's own, got {self.threads!r}")
        if not _whole(self.steps, *BOUNDS["steps"]):
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


def _whole(value: Any, low: int, high: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and low <= value <= high


def _device_problem(device: Any) -> str:
    """'' for a device this machine has, else the sentence (one without CUDA asked for cuda; meta, which holds no
    numbers to train)."""
    from attn_core.engine import env

    found = env.available_devices()
    if device in found:
        return ""
    what = "is not available on this machine" if device in env.DEVICES else "is not a device recall trains on"
    return f"device {clipped(repr(device), 40)} {what}; choose {' or '.join(found)}"


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
    from attn_core.engine import env
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
        with _threads(setup.threads):
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


@functools.cache
def _warm_optimizer() -> None:
    """One throwaway AdamW step: the first step in a process imports seconds of modules (torch's compiler stack),
    which would otherwise be counted in the first mechanism's train time."""
    weight = nn.Parameter(torch.zeros(1))
    weight.grad = torch.ones(1)
    torch.optim.AdamW([weight]).step()


@contextlib.contextmanager
def _threads(count: int | None):
    """torch's CPU threads set to `count` inside, as they were after. One by default: matrices this small gain
    nothing from a second thread, and on a shared machine a second OpenMP thread waits for a busy core (a step took
    fifteen times as long with two threads as with one on a 2-core machine another program kept busy)."""
    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def with_setup(setup: Setup, **changes: Any) -> Setup:
    """A copy of `setup` with some fields changed, the task's (vocab, seq, pairs) among them; validated."""
    task = replace(setup.task, **{k: changes.pop(k) for k in ("vocab", "seq", "pairs") if k in changes})
    return replace(setup, task=task, **changes).check()


def frame(rows: list) -> pd.DataFrame:
    """One row per result (a Result, or its as_dict() as the CLI and the reference file hold it): mechanism (its name
    with parameters), key, label, accuracy, state_bytes, train_s, best_lr, stopped (what the scatter charts read)."""
    rows = [r.as_dict() if isinstance(r, Result) else r for r in rows]
    columns = ["mechanism", "accuracy", "state_bytes", "train_s", "best_lr", "stopped"]
    table = pd.DataFrame([{c: r.get(c) for c in columns} for r in rows], columns=columns)
    for c in ("accuracy", "state_bytes", "train_s", "best_lr"):
        table[c] = pd.to_numeric(table[c], errors="coerce")  # None (no generation form) → NaN
    table.insert(1, "key", table["mechanism"].str.split(":").str[0])
    table.insert(2, "label", [get(k).label if k in MECHANISMS else k for k in table["key"]])
    return table


def curves(points: list) -> pd.DataFrame:
    """One row per recorded step (Points, or dicts of a Point's fields with the mechanism's name and key):
    mechanism, key, lr, step, loss, accuracy, the frame curves_chart reads."""
    columns = ["mechanism", "key", "lr", "step", "loss", "accuracy"]
    return pd.DataFrame([p if isinstance(p, dict) else vars(p) for p in points], columns=columns)


def provenance(results: list[Result], setup: Setup, *, command: str, stamp: dict, note: str = "") -> dict:
    """The reference file's content: the command that made it, the machine and versions (from an environment()
    stamp), the setup, the chance level and each result's as_dict()."""
    machine = (f"{stamp.get('device_name', '?')}, {stamp.get('cpu_count', '?')} cores, {stamp.get('threads', '?')} "
               f"thread(s) used, load average {stamp.get('load_average', '?')} at the end")
    return {"command": command, "machine": machine, "timestamp": stamp.get("timestamp", ""),
            "versions": {"torch": stamp.get("torch", "?"), "python": stamp.get("python", "?")}, "note": note,
            "setup": {"vocab": setup.task.vocab, "seq": setup.task.seq, "pairs": setup.task.pairs,
                      "d_model": setup.d_model, "layers": setup.layers, "heads": setup.heads, "steps": setup.steps,
                      "batch": setup.batch, "lrs": list(setup.lrs), "eval_sequences": setup.eval_sequences,
                      "seed": setup.seed, "chance": setup.task.chance},
            "results": [r.as_dict() for r in results]}


def command_line(names: list[str], setup: Setup) -> str:
    """The `python -m attn_core recall` command that trains `names` (as Result.name writes them) with `setup`: what
    a run made elsewhere (the page) saves as its command, so that it can be made again."""
    flags = {"--mechanisms": ",".join(names), "--seq": setup.task.seq, "--pairs": setup.task.pairs,
             "--vocab": setup.task.vocab, "--d-model": setup.d_model, "--layers": setup.layers,
             "--heads": setup.heads, "--steps": setup.steps, "--batch": setup.batch,
             "--lrs": ",".join(map(str, setup.lrs)), "--eval": setup.eval_sequences, "--seed": setup.seed}
    threads = [] if setup.threads is None else [f"--threads {setup.threads}"]
    return " ".join(["python -m attn_core recall", *(f"{k} {v}" for k, v in flags.items()), *threads,
                     f"--device {setup.device}"])


SAVED_LIMITS = {"accuracy": (0.0, 1.0), "state_bytes": (0.0, 1e18), "train_s": (0.0, 1e7), "best_lr": (0.0, 1.0)}
SETUP_KEYS = ("vocab", "seq", "pairs", "d_model", "layers", "heads", "steps", "batch", "eval_sequences", "seed")
MAX_SAVED = 64  # results a saved file may hold


def read_saved(text: str) -> dict:
    """A results file as `recall --out` writes it (the reference's form; a 'remark' may be added by hand after), from
    outside the program: checked and cleaned (texts cut short, numbers in range, at most MAX_SAVED results).
    ValueError with a sentence otherwise."""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("results"), list) \
            or not isinstance(data.get("setup"), dict):
        raise ValueError("this is not a recall results file: it must be JSON with 'setup' and 'results', as "
                         "python -m attn_core recall --out writes")
    rows = [_saved_row(i, r) for i, r in enumerate(data["results"][:MAX_SAVED])]
    setup = {}
    for name in SETUP_KEYS:
        value = data["setup"].get(name)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1 << 30:
            raise ValueError(f"the file's setup has {name} = {clipped(repr(value), 40)}, not a whole number from 0 "
                             f"to 2^30; open a file that recall --out wrote")
        setup[name] = value
    setup["chance"] = 1.0 / max(setup["vocab"] - setup["vocab"] // 2, 1)
    versions = data.get("versions") if isinstance(data.get("versions"), dict) else {}
    return {"command": _text(data.get("command", ""), 400), "machine": _text(data.get("machine", ""), 200),
            "note": _text(data.get("note", ""), 600), "remark": _text(data.get("remark", ""), 600),
            "setup": setup, "results": rows,
            "versions": {_text(k, 20): _text(v, 40) for k, v in list(versions.items())[:8]}}


def _text(value: Any, limit: int) -> str:
    """A text from the file as text: control characters and lone surrogates written as escapes, cut to `limit`."""
    return clipped(printable(str(value)), limit)


def _saved_row(i: int, r: Any) -> dict:
    if not isinstance(r, dict) or not isinstance(r.get("mechanism"), str):
        raise ValueError(f"result {i + 1} of the file names no mechanism; open a file that recall --out wrote")
    row = {"mechanism": _text(r["mechanism"], 80)}
    for name, (low, high) in SAVED_LIMITS.items():
        value = r.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not low <= value <= high):
            raise ValueError(f"result {i + 1} of the file has {name} = {clipped(repr(value), 40)}, outside {low:g} to "
                             f"{high:g}; open a file that recall --out wrote")
        row[name] = None if value is None else float(value)
    return row


def reference() -> dict:
    """The reference table shipped with the package (reference.json beside this file): {'command', 'machine',
    'versions', 'note', 'setup', 'results': [Result.as_dict(), ...]}, computed with the CLI on a larger budget."""
    return read_saved((Path(__file__).parent / "reference.json").read_text("utf-8"))

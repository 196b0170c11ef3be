"""The multi-query associative recall (MQAR) task and its seeded sequences (Zoology, Arora et al. 2023, 'Zoology:
Measuring and Improving Recall in Efficient Language Models', arXiv 2312.04927)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# each setting's range: far above what a tiny model of this study needs, far below what ends in an allocation
# failure before the memory guard (`memory_problem`) has read the sizes together
BOUNDS = {"vocab": (4, 1 << 20), "seq": (4, 1 << 16), "d_model": (1, 1 << 14), "layers": (1, 64), "heads": (1, 1024),
          "batch": (1, 1 << 16), "steps": (1, 1_000_000), "eval_sequences": (1, 1 << 20), "eval_every": (1, 1_000_000),
          "seed": (0, (1 << 32) - 1), "lrs": (1, 16), "pairs": (1, 1 << 14)}
MAX_SEQUENCES = 1 << 21  # sequences one `mqar` call draws: the held-out set's most, rounded up to whole batches
MAX_DRAW_SEED = (1 << 63) - 1  # torch's generator takes a 64-bit seed (a step's is seed·1,000,003 + step)
IGNORE = -100  # the target of every position that is not an answer: no loss, no accuracy (torch's ignore_index)


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
                 if not is_whole(value, *BOUNDS[name])]
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
    if not is_whole(count, 1, MAX_SEQUENCES):
        raise ValueError(f"count must be a whole number of sequences from 1 to {MAX_SEQUENCES:,}, got {count!r}")
    if not is_whole(seed, 0, MAX_DRAW_SEED):
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


def is_whole(value: Any, low: int, high: int) -> bool:
    """An int (not a bool) from `low` to `high`."""
    return not isinstance(value, bool) and isinstance(value, int) and low <= value <= high

"""Attention patterns as tiny predicates on (query index, key index); compose with & and |."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

Predicate = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Pattern:
    """A named boolean predicate: pattern(i, j) is True where query i may attend to key j (broadcasting)."""

    name: str
    fn: Predicate

    def __call__(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        return self.fn(i, j)

    def __and__(self, other: "Pattern") -> "Pattern":
        return Pattern(f"{self.name} and {other.name}", lambda i, j: self.fn(i, j) & other.fn(i, j))

    def __or__(self, other: "Pattern") -> "Pattern":
        return Pattern(f"{self.name} or {other.name}", lambda i, j: self.fn(i, j) | other.fn(i, j))


full = Pattern("full", lambda i, j: (i - j) == (i - j))
causal = Pattern("causal: j ≤ i", lambda i, j: j <= i)


def sliding_window(window: int) -> Pattern:
    """Query i sees key j iff |i − j| ≤ window."""
    return Pattern(f"sliding window: |i − j| ≤ {window}", lambda i, j: (i - j).abs() <= window)


def block_local(block: int, lookback: int = 0, lookahead: int = 0) -> Pattern:
    """Query i sees key j iff −lookback ≤ ⌊j/block⌋ − ⌊i/block⌋ ≤ lookahead."""
    def pred(i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        offset = torch.div(j, block, rounding_mode="floor") - torch.div(i, block, rounding_mode="floor")
        return (offset >= -lookback) & (offset <= lookahead)

    return Pattern(f"block-local: block {block}, {lookback} back, {lookahead} ahead", pred)


def chunked(chunk: int) -> Pattern:
    """Llama 4's chunked attention: query i sees key j iff both lie in the same chunk of `chunk` tokens and j ≤ i
    (⌊i/chunk⌋ = ⌊j/chunk⌋, causal). Block-local with no blocks before or after, causal: `local` computes it
    (block = chunk, lookback = lookahead = 0), and its generation cache holds at most `chunk` tokens."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a whole number of tokens, at least 1, got {chunk!r}; Llama 4 uses 8192")
    return Pattern(f"chunked: chunks of {chunk}, causal", (block_local(chunk) & causal).fn)


def strided(stride: int) -> Pattern:
    """Sparse Transformer 'fixed': j in i's block of size stride, or j a summary key (j mod stride = stride − 1)."""
    def pred(i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        same_block = torch.div(i, stride, rounding_mode="floor") == torch.div(j, stride, rounding_mode="floor")
        return same_block | (j % stride == stride - 1)

    return Pattern(f"strided: stride {stride}", pred)


def global_tokens(positions: int | torch.Tensor) -> Pattern:
    """Query i sees key j iff i or j is a global position: the first `positions` tokens (an int), or those listed
    (a 1-D integer tensor). Global tokens attend to every key and every query attends to them."""
    if isinstance(positions, int):
        first = positions
        return Pattern(f"global: the first {first}", lambda i, j: (i < first) | (j < first))

    def pred(i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        listed = positions.to(i.device)
        return torch.isin(i, listed) | torch.isin(j, listed)

    return Pattern(f"global: positions {positions.tolist()}", pred)


def random_blocks(block: int, table: torch.Tensor) -> Pattern:
    """Query i sees key j iff ⌊j/block⌋ is listed in row ⌊i/block⌋ of `table` (n_blocks, r), an entry −1 listing
    nothing: BigBird's random blocks, drawn outside the pattern."""
    def pred(i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        rows = table.to(i.device)[torch.div(i, block, rounding_mode="floor")]  # (..., r)
        return (rows == torch.div(j, block, rounding_mode="floor").unsqueeze(-1)).any(-1)

    return Pattern(f"random blocks: block {block}, {table.shape[-1]} per query block", pred)


def document(lengths: Sequence[int]) -> Pattern:
    """Packed sequences: documents of `lengths` tokens laid end to end; query i sees key j iff both lie in the same
    document. Defined on the sum(lengths) positions the documents cover."""
    if not lengths or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in lengths):
        raise ValueError(f"document lengths must be positive integers, got {list(lengths)!r}; give e.g. [300, 200]")
    ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))  # (sum,) document of each token

    def pred(i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        of = ids.to(i.device)
        return of[i] == of[j]

    return Pattern(f"documents: lengths {list(lengths)}", pred)


def dense_mask(pattern: Pattern, nq: int, nk: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The (nq, nk) boolean matrix of a pattern. O(nq·nk) memory: for references and heatmaps only."""
    i = torch.arange(nq, device=device)[:, None]
    j = torch.arange(nk, device=device)[None, :]
    return pattern(i, j).expand(nq, nk)


def density(pattern: Pattern, nq: int, nk: int, rows: int = 1024) -> float:
    """Fraction of the nq·nk cells the pattern keeps, counted in row slabs so any n fits in memory."""
    kept = 0
    j = torch.arange(nk)[None, :]
    for start in range(0, nq, rows):
        i = torch.arange(start, min(start + rows, nq))[:, None]
        kept += int(pattern(i, j).expand(i.shape[0], nk).sum())
    return kept / (nq * nk)

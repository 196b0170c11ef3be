"""One attention layer, step by step, on a short sentence: what a teacher shows before the measurements.

X (n × d_model) → per head h: Q = X W_Qʰ, K = X_src W_Kʰ, V = X_src W_Vʰ (n × d_k) → scores S = Q Kᵀ (n × m) →
scaled S / √d_k → masked (−∞ where a query may not look) → weights A = softmax(row) → output A V (n × d_k) → the
heads concatenated (n × h·d_k) → projected by W_O (n × d_model). Additive (Bahdanau) scores replace Q Kᵀ with
vᵀ tanh(q W_a + k U_a). The scaled dot-product output comes from the softmax mechanism the Benchmark page measures
(`MECHANISMS["softmax"].fn`, its mask included), and is checked against the step-by-step product here.

Weights are small and seeded; a word's embedding depends only on the word and the seed, so "the" is the same
vector wherever it stands (no position encoding: attention alone does not know order).
"""
from __future__ import annotations

import hashlib
import json
import math
import zlib
from dataclasses import dataclass

import torch

from ..mechanisms import MECHANISMS
from ..spec import DTYPE_BYTES, Shape

MAX_WORDS = 12  # a heatmap a class can read
PAD = "<pad>"
SCORES = ("dot-product", "additive")
COST_NS = (1024, 32768, 1048576)  # the lengths the cost table adds to the sentence's own


@dataclass(frozen=True)
class Setup:
    """What a teacher sets: d_k per head, heads (d_model = heads · d_k), the scale, the masks, the source of the keys
    and values (None: self-attention), the kind of score, padding tokens appended to the source, and the seed."""

    d_k: int = 4
    heads: int = 1
    scaled: bool = True
    causal: bool = False
    pad: int = 0
    score: str = "dot-product"
    seed: int = 0

    @property
    def d_model(self) -> int:
        return self.heads * self.d_k


@dataclass(frozen=True)
class Walk:
    """Every step's tensor, heads first: q (H, n, d_k), k and v (H, m, d_k), raw (H, n, m) scores before scaling,
    scores (H, n, m) as scaled (or not), masked (H, n, m) with −∞ where not allowed, weights (H, n, m) rows summing
    to 1, heads_out (H, n, d_k), concat (n, H·d_k), output (n, d_model); x (n, d_model) and source (m, d_model) the
    embeddings; queries and keys the tokens labelling rows and columns."""

    setup: Setup
    cross: bool  # keys and values from a second sentence
    queries: list[str]
    keys: list[str]
    x: torch.Tensor
    source: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    raw: torch.Tensor
    scores: torch.Tensor
    masked: torch.Tensor
    weights: torch.Tensor
    heads_out: torch.Tensor
    concat: torch.Tensor
    w_o: torch.Tensor
    output: torch.Tensor

    @property
    def allowed(self) -> torch.Tensor:
        """(n, m) True where a query may look at a key."""
        return torch.isfinite(self.masked[0])

    def readout(self) -> dict[str, float]:
        """The numbers that make saturation visible: the standard deviation of the raw (Q·K) and the shown scores
        over the allowed cells of every head, and the largest softmax weight among rows that choose between two keys
        or more (`max_weight`, NaN where none does): a row that sees one key (the first word under the causal mask)
        gives it weight 1 whatever the scores, which says nothing of saturation. `rows_counted` is how many rows the
        largest weight was taken over (every head's); `max_row_keys` how many keys the row holding it sees (an even
        split gives each 1 / max_row_keys); `q_std`, `k_std` the standard deviations of Q's and K's entries."""
        allowed = self.allowed.expand_as(self.raw)
        keys = self.allowed.sum(-1)  # (n,) keys each row sees
        choosing = keys >= 2  # rows with a choice to make
        chosen = self.weights[..., choosing, :]  # (H, r, m)
        row = int(chosen.amax(dim=(0, 2)).argmax()) if chosen.numel() else -1
        return {"raw_std": float(self.raw[allowed].std(unbiased=False)),
                "scores_std": float(self.scores[allowed].std(unbiased=False)),
                "max_weight": float(chosen.max()) if chosen.numel() else float("nan"),
                "rows_counted": int(choosing.sum()) * int(self.weights.shape[0]),
                "max_row_keys": int(keys[choosing][row]) if row >= 0 else 0,
                "q_std": float(self.q.std(unbiased=False)), "k_std": float(self.k.std(unbiased=False))}


def words(sentence: str, what: str = "the sentence") -> list[str]:
    """The sentence's words, numbered so repeats stay distinct ("0 the", "4 the"); ValueError with a sentence."""
    found = sentence.split()
    if not found:
        raise ValueError(f"{what} is empty; type a few words")
    if len(found) > MAX_WORDS:
        raise ValueError(f"{what} has {len(found)} words; use at most {MAX_WORDS}, so every cell stays readable")
    return [f"{i} {w}" for i, w in enumerate(found)]


def embed(tokens: list[str], d_model: int, seed: int) -> torch.Tensor:
    """(n, d_model) float64 with N(0, 1) entries, one vector per distinct word (its number stripped) and seed."""
    rows = []
    for token in tokens:
        word = token.split(" ", 1)[-1]
        g = torch.Generator().manual_seed(zlib.crc32(word.encode()) * 1_000_003 + seed)
        rows.append(torch.randn(d_model, generator=g, dtype=torch.float64))
    return torch.stack(rows)


def weights(setup: Setup) -> dict[str, torch.Tensor]:
    """The layer's seeded weights: w_q, w_k, w_v (H, d_model, d_k) and w_o (H·d_k, d_model) with N(0, 1/fan-in)
    entries, so q, k and v have unit-variance entries and q·k has variance d_k (the reason for the √d_k); w_a and
    u_a (H, d_k, d_k) and v_a (H, d_k) for additive scores."""
    g = torch.Generator().manual_seed(setup.seed + 7919)
    h, d, dk = setup.heads, setup.d_model, setup.d_k

    def normal(*size: int, fan_in: int) -> torch.Tensor:
        return torch.randn(*size, generator=g, dtype=torch.float64) / math.sqrt(fan_in)

    return {"w_q": normal(h, d, dk, fan_in=d), "w_k": normal(h, d, dk, fan_in=d), "w_v": normal(h, d, dk, fan_in=d),
            "w_o": normal(h * dk, d, fan_in=h * dk), "w_a": normal(h, dk, dk, fan_in=dk),
            "u_a": normal(h, dk, dk, fan_in=dk), "v_a": normal(h, dk, fan_in=dk)}


def problems(setup: Setup) -> list[str]:
    """Sentences saying what to change; [] when the setup can be walked."""
    found = []
    if not (isinstance(setup.d_k, int) and 1 <= setup.d_k <= 1024):
        found.append(f"d_k = {setup.d_k} is not allowed; choose a whole number from 1 to 1,024")
    if not (isinstance(setup.heads, int) and 1 <= setup.heads <= 8):
        found.append(f"heads = {setup.heads} is not allowed; choose 1 to 8")
    if not (isinstance(setup.pad, int) and 0 <= setup.pad <= 4):
        found.append(f"padding = {setup.pad} is not allowed; choose 0 to 4 tokens")
    if setup.score not in SCORES:
        found.append(f"score {setup.score!r} is not one of {', '.join(SCORES)}")
    return found


def walk(sentence: str, setup: Setup = Setup(), source: str | None = None) -> Walk:
    """Walk `sentence` (queries) through one attention layer over `source` (keys and values; None: the sentence
    itself), with setup.pad padding tokens appended to the source and masked out as keys."""
    problem = problems(setup)
    if problem:
        raise ValueError(problem[0])
    queries = words(sentence)
    keys = (words(source, "the source sentence") if source is not None else list(queries))
    keys += [f"{len(keys) + i} {PAD}" for i in range(setup.pad)]
    cross = source is not None
    if setup.causal and cross:
        raise ValueError("a causal mask needs self-attention (a query's position among the keys); turn one off")
    w = weights(setup)
    x = embed(queries, setup.d_model, setup.seed)
    src = embed(keys, setup.d_model, setup.seed) if cross or setup.pad else x
    q = torch.einsum("nd,hde->hne", x, w["w_q"])
    k = torch.einsum("md,hde->hme", src, w["w_k"])
    v = torch.einsum("md,hde->hme", src, w["w_v"])
    if setup.score == "additive":  # Bahdanau et al. 2015 (arXiv 1409.0473): vᵀ tanh(q W_a + k U_a)
        raw = torch.einsum("hnme,he->hnm", torch.tanh((q @ w["w_a"])[:, :, None, :] + (k @ w["u_a"])[:, None, :, :]),
                           w["v_a"])
        scores = raw
    else:
        raw = q @ k.transpose(-2, -1)
        scores = raw / math.sqrt(setup.d_k) if setup.scaled else raw
    allowed = torch.ones(len(queries), len(keys), dtype=torch.bool)
    allowed[:, [i for i, key in enumerate(keys) if key.endswith(" " + PAD)]] = False
    if setup.causal:
        allowed &= torch.ones_like(allowed).tril()
    masked = scores.masked_fill(~allowed, float("-inf"))
    attn = torch.softmax(masked, dim=-1)
    heads_out = attn @ v
    if setup.score == "dot-product":  # the benchmarked kernel on the same q, k, v: it scales by 1/√d_k itself
        kernel_q = q if setup.scaled else q * math.sqrt(setup.d_k)
        measured = MECHANISMS["softmax"].fn(kernel_q[None], k[None], v[None], mask=allowed[None, None])[0]
        if not torch.allclose(measured, heads_out, rtol=1e-9, atol=1e-12):
            raise AssertionError("the softmax mechanism and the step-by-step product disagree")
        heads_out = measured
    concat = heads_out.transpose(0, 1).reshape(len(queries), setup.heads * setup.d_k)
    return Walk(setup, cross, queries, keys, x, src, q, k, v, raw, scores, masked, attn, heads_out, concat, w["w_o"],
                concat @ w["w_o"])


def cost(n: int, setup: Setup, dtype: str = "float32") -> dict[str, float]:
    """What self-attention over n tokens stores at this setup: the score cells (heads · n²), their bytes in
    `dtype`, and the softmax mechanism's predicted peak for one forward call (scores and weights both held)."""
    cells = float(setup.heads) * n * n
    shape = Shape(1, setup.heads, n, n, setup.d_k, dtype=dtype, causal=setup.causal)
    return {"n": n, "cells": cells, "bytes": cells * DTYPE_BYTES[dtype],
            "peak_bytes": float(MECHANISMS["softmax"].cost.memory_bytes(shape))}


@dataclass(frozen=True)
class Step:
    """One figure of the walk: its title, the formula and one sentence, the shape written out, and the matrix
    (H, R, C) with its row and column labels. `masked` marks −∞ cells (scores after the mask). `panels` names the
    H panels when they are not heads (layers, before and after); empty: "head 1" …"""

    key: str
    title: str
    says: str
    shape: str
    matrix: torch.Tensor
    rows: list[str]
    columns: list[str]
    value: str = "value"
    panels: tuple[str, ...] = ()


def step_digest(step: Step) -> str:
    """A digest of everything a step's figure shows (its texts, labels and the matrix's numbers, shape and
    type): two steps with the same digest draw the same chart."""
    matrix = step.matrix.detach().to("cpu").contiguous()
    texts = json.dumps([step.key, step.title, step.says, step.shape, step.rows, step.columns, step.value,
                        list(step.panels), list(matrix.shape), str(matrix.dtype)])
    return hashlib.sha256(texts.encode("utf-8") + matrix.view(torch.uint8).numpy().tobytes()).hexdigest()


SHOWN_DIMS = 16  # columns of a Q, K, V or embedding matrix drawn; the rest are said to be left out
# A heatmap's room on the Learn page: the main column at 1280 px with the sidebar open (about 820 px; talk mode folds
# the sidebar, ~1,190 px), less what is not cells: the words down the left and the colour legend (~170 px, ×1.4 in
# talk mode's type) and the gap between two heads' panels (20 px).
COLUMN_PX = {False: 800, True: 1150}
AROUND_PX = {False: 170, True: 240}
PANEL_GAP_PX, MIN_CELL_PX = 20, 12


def cell_px(panels: int, rows: int, columns: int, *, talk: bool = False) -> int:
    """A heatmap cell's side in pixels such that `panels` panels of rows × columns cells, their labels and legend fit
    the page's column (a padded key is the last column: a heatmap wider than the column cut it off first); at most
    64 (talk) or 48 px, a cell that holds its number, and no panel taller than ~640 px; MIN_CELL_PX at the least,
    so the widest walks (four heads of 12 words and 4 padding keys) still spill past a column of 800 px."""
    room = COLUMN_PX[talk] - AROUND_PX[talk] - PANEL_GAP_PX * (panels - 1)
    biggest = 64 if talk else 48
    return max(MIN_CELL_PX, min(biggest, room // (panels * columns), 640 // rows))


def _spread_word(read: dict[str, float]) -> str:
    """What the spread does to the weights, in this walk's numbers: the largest weight of a row that chooses, beside
    an even split of that row's keys; '' when no row chooses."""
    if read["max_row_keys"] < 2:
        return ""
    return (f"The largest weight of a row with a choice is {read['max_weight']:.3f}, where an even split of its "
            f"{read['max_row_keys']} keys gives {1 / read['max_row_keys']:.3f}.")


def _dims(count: int, name: str) -> list[str]:
    return [f"{name}{i}" for i in range(count)]


def steps(w: Walk) -> list[Step]:
    """The walk as the figures a class is shown, in order (the masked step only when a mask is on; the
    concatenation and W_O always, since even one head is projected)."""
    s, n, m = w.setup, len(w.queries), len(w.keys)
    dk, d = s.d_k, s.d_model
    heads = f" per head ({s.heads} heads)" if s.heads > 1 else ""
    cut = (lambda c: f" (the first {SHOWN_DIMS} of {c} columns drawn)" if c > SHOWN_DIMS else "")
    additive = s.score == "additive"
    read = w.readout()  # the captions state the walk's own numbers
    found = [
        Step("x", "Embeddings X", "One vector per word, seeded by the word: no position, so attention alone does not "
             "know word order." + cut(d), f"X: {n} × {d} = n × d_model", w.x[None, :, :SHOWN_DIMS], w.queries,
             _dims(min(d, SHOWN_DIMS), "x")),
        Step("q", "Queries Q = X W_Q", f"What each word looks for{heads}." + cut(dk),
             f"Q: {n} × {dk} = n × d_k", w.q[..., :SHOWN_DIMS], w.queries, _dims(min(dk, SHOWN_DIMS), "q")),
        Step("k", "Keys K = X_source W_K" if w.cross else "Keys K = X W_K",
             f"What each word offers to the queries{heads}." + cut(dk), f"K: {m} × {dk} = m × d_k",
             w.k[..., :SHOWN_DIMS], w.keys, _dims(min(dk, SHOWN_DIMS), "k")),
        Step("v", "Values V = X_source W_V" if w.cross else "Values V = X W_V",
             f"What each word passes on when it is attended to{heads}." + cut(dk), f"V: {m} × {dk} = m × d_k",
             w.v[..., :SHOWN_DIMS], w.keys, _dims(min(dk, SHOWN_DIMS), "v")),
        Step("raw", "Scores e = vᵀ tanh(q W_a + k U_a)" if additive else "Scores S = Q Kᵀ",
             ("A small network scores each (query, key) pair (Bahdanau et al. 2015): bounded by ‖v‖, no scaling "
              "needed." if additive else f"One dot product per (query, key) pair. Here the scores spread with a standard "
              f"deviation of {read['raw_std']:.3g} (Q's entries {read['q_std']:.3g}, K's {read['k_std']:.3g}); for "
              f"q and k of entries with standard deviation 1 it would be about √d_k = {math.sqrt(dk):.3g}."),
             f"S: {n} × {m} = n × m", w.raw, w.queries, w.keys, "score"),
    ]
    if not additive:
        found.append(Step("scaled", "Scaled S / √d_k" if s.scaled else "Not scaled: S as it is",
                          (f"Divided by √d_k = {math.sqrt(dk):.3g}: the spread goes from {read['raw_std']:.3g} to "
                           f"{read['scores_std']:.3g}. {_spread_word(read)}".rstrip() if s.scaled
                           else f"Without the √d_k the scores keep their spread of {read['raw_std']:.3g}, which "
                                "grows with d_k: the wider it is, the nearer the largest weight comes to 1 and the "
                                "rest to 0 (the softmax saturates)."), f"S: {n} × {m}", w.scores, w.queries, w.keys, "score"))
    if not bool(w.allowed.all()):
        why = " and ".join(x for x in ("future words (causal)" if s.causal else "",
                                       "padding keys" if s.pad else "") if x)
        found.append(Step("masked", "Masked: −∞ before the softmax", f"−∞ where a query may not look: {why}; "
                          "exp(−∞) = 0, so those weights are exactly 0.", f"S: {n} × {m}", w.masked, w.queries,
                          w.keys, "score"))
    found += [
        Step("weights", "Weights A = softmax(each row)", "Every row sums to 1: how much each query takes from each "
             "key.", f"A: {n} × {m} = n × m", w.weights, w.queries, w.keys, "weight"),
        Step("heads_out", "Output per head: A V", "Each word's weighted mix of the values." + cut(dk),
             f"A V: {n} × {dk} = n × d_k", w.heads_out[..., :SHOWN_DIMS], w.queries, _dims(min(dk, SHOWN_DIMS), "o")),
        Step("concat", "Heads concatenated", f"The {s.heads} heads' outputs side by side." +
             cut(s.heads * dk), f"concat: {n} × {s.heads * dk} = n × h·d_k", w.concat[None, :, :SHOWN_DIMS],
             w.queries, _dims(min(s.heads * dk, SHOWN_DIMS), "c")),
        Step("output", "Output = concat · W_O", "Projected back to d_model: the layer's output, one vector per "
             "word." + cut(d), f"output: {n} × {d} = n × d_model", w.output[None, :, :SHOWN_DIMS], w.queries,
             _dims(min(d, SHOWN_DIMS), "y")),
    ]
    return found

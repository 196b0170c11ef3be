"""The rest of the lesson, on the Learn page's own layer: where positions come in, attention as a soft lookup, and
what attention weights do and do not explain.

Positions: Vaswani et al. 2017 (arXiv 1706.03762), Shaw et al. 2018 (arXiv 1803.02155), Su et al. 2021 (arXiv
2104.09864), Press et al. 2021 (arXiv 2108.12409); see attn_core.positions.encodings. Lookup: Ramsauer et al. 2020, 'Hopfield
Networks is All You Need' (arXiv 2008.02217). Explanations: attention rollout, Abnar and Zuidema 2020 (arXiv
2005.00928); 'Attention is not Explanation', Jain and Wallace 2019 (arXiv 1902.10186).

Every figure is a lesson.Step (H, R, C); the layer is lesson.weights' multi-head layer, self-attention over the
sentence without a mask (a causal mask is itself a position), its heads computed by the softmax mechanism.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from attn_core.positions import encodings as positional
from ..mechanisms import MECHANISMS
from .lesson import Setup, Step, Walk, embed, weights, words

ENCODINGS = ("none", "sinusoidal", "learned", "relative", "RoPE", "ALiBi")
PERMUTATIONS = ("rotated by one", "reversed", "first and last swapped")
RELATIVE_CLIP = 2  # Shaw et al.'s k: offsets beyond ±2 share one value
ALIBI_HEADS = 8  # the head count of the paper's worked slopes (1/2 … 1/256)
ABSOLUTE = (0, 1, 10, 100, 1000)  # where the key stands in the RoPE figure
LAYERS = (2, 3)


def permutation(n: int, kind: str) -> list[int]:
    """Position i of the permuted sentence holds word perm[i] of the original."""
    if kind not in PERMUTATIONS:
        raise ValueError(f"permutation {kind!r} is not one of {', '.join(PERMUTATIONS)}")
    order = list(range(n))
    if kind == "reversed":
        return order[::-1]
    if kind == "rotated by one":
        return order[1:] + order[:1]
    order[0], order[-1] = order[-1], order[0]
    return order


def _turn(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """RoPE on the even part of the last dimension (an odd last feature stays unturned: RoPE turns pairs)."""
    even = x.shape[-1] - x.shape[-1] % 2
    if even == 0:
        return x
    return torch.cat((positional.rope(x[..., :even], positions), x[..., even:]), dim=-1)


def attend(x: torch.Tensor, w: dict, setup: Setup, *, encoding: str = "none", hidden: torch.Tensor | None = None,
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The page's layer on x (n, d_model), or a batch (B, n, d_model), with a positional `encoding` at positions
    0 … n − 1: (output like x, weights (H, n, n) or (B, H, n, n)). `hidden` (n,) or (B, n) bool: keys no query may
    see (erasure). The heads' outputs come from the softmax mechanism, given ALiBi's and the relative bias as
    `score_bias=`; the weights are the same softmax written out. O(B·n·d_model·H·d_k + B·H·n²·d_k)."""
    batched = x.dim() == 3
    x = x if batched else x[None]
    B, n, d = x.shape
    heads = setup.heads
    if encoding == "sinusoidal":  # an odd d_model takes the first d_model columns of the next even width
        x = x + positional.sinusoidal(n, d + d % 2, dtype=x.dtype)[:, :d]
    elif encoding == "learned":
        x = x + positional.learned(n, d, setup.seed, dtype=x.dtype)
    elif encoding not in ENCODINGS:
        raise ValueError(f"encoding {encoding!r} is not one of {', '.join(ENCODINGS)}")
    q, k, v = (torch.einsum("bnd,hde->bhne", x, w[name]) for name in ("w_q", "w_k", "w_v"))
    if encoding == "RoPE":
        q, k = _turn(q, torch.arange(n)), _turn(k, torch.arange(n))
    bias = {"relative": lambda: positional.relative_bias(n, n, RELATIVE_CLIP, heads=heads, seed=setup.seed,
                                                         dtype=x.dtype),
            "ALiBi": lambda: positional.alibi_bias(heads, n, n, dtype=x.dtype)}.get(encoding, lambda: None)()
    if not setup.scaled:  # the mechanism divides by √d_k itself
        q = q * math.sqrt(setup.d_k)
    hidden = torch.zeros(B, n, dtype=torch.bool) if hidden is None else hidden.expand(B, n)
    allowed = ~hidden[:, None, None, :].expand(B, 1, n, n)
    out = MECHANISMS["softmax"].fn(q, k, v, mask=allowed, score_bias=bias)  # (B, H, n, d_k)
    scores = q @ k.transpose(-2, -1) / math.sqrt(setup.d_k) + (0 if bias is None else bias)
    attn = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    y = out.transpose(1, 2).reshape(B, n, heads * setup.d_k) @ w["w_o"]
    return (y, attn) if batched else (y[0], attn[0])


# ---- positions ----

def permutation_step(sentence: str, setup: Setup, kind: str = "rotated by one") -> Step:
    """(1, encodings, n): for each encoding, how far the layer's outputs for the permuted sentence are from the
    original outputs permuted the same way, ‖y(πX)_i − y(X)_π(i)‖ / ‖y(X)_π(i)‖ per word i. Zero everywhere
    without positions (permutation equivariance); above zero once an encoding tells positions apart."""
    tokens = words(sentence)
    perm = permutation(len(tokens), kind)
    x, w = embed(tokens, setup.d_model, setup.seed), weights(setup)
    rows = []
    for encoding in ENCODINGS:
        moved, original = attend(torch.stack((x[perm], x)), w, setup, encoding=encoding)[0]
        expected = original[perm]
        rows.append((moved - expected).norm(dim=-1) / expected.norm(dim=-1).clamp_min(1e-300))
    permuted = [f"{i} {tokens[p].split(' ', 1)[1]}" for i, p in enumerate(perm)]
    odd = (" With d_k = 1 RoPE has no pair to turn, so its row stays at zero." if setup.d_k == 1 else
           " With an odd d_k RoPE turns all features but the last." if setup.d_k % 2 else "")
    return Step("permutation", f"Permuted ({kind}): the outputs follow until positions are added",
                "Each cell: how far a word's output in the permuted sentence is from its output in the original "
                "(relative). Without positions every cell is 0: attention alone sees a set, not a sequence. "
                "ALiBi with few heads has gentle slopes (1/256 for one head), so its cells stay small; reversed, a "
                "sentence keeps every distance |i − j|, so ALiBi's symmetric penalty cannot tell it from its mirror "
                "image (causal models apply it to j ≤ i only)." + odd,
                f"{len(ENCODINGS)} encodings × {len(tokens)} words; layer: n × d_model = {len(tokens)} × "
                f"{setup.d_model}", torch.stack(rows)[None], list(ENCODINGS), permuted, "change")


def sinusoidal_step(n: int = 24, d: int = 16) -> Step:
    """(1, n, d) the sinusoidal table: fast pairs on the left, slow on the right."""
    return Step("sinusoidal", "Sinusoidal positions PE[p, 2i] = sin(p/10000^(2i/d)), PE[p, 2i+1] = cos(…)",
                "One row per position, added to the embeddings: bounded in [−1, 1], every row different, and "
                "PE[p + k] a fixed rotation of PE[p] (Vaswani et al. 2017).", f"PE: {n} × {d} = positions × d",
                positional.sinusoidal(n, d, dtype=torch.float64)[None], [f"p = {p}" for p in range(n)],
                [f"{'sin' if j % 2 == 0 else 'cos'} {j // 2}" for j in range(d)], "PE")


def rope_step(sentence: str, setup: Setup, query: int = 0, key: int = 1) -> Step:
    """(1, len(ABSOLUTE), 2n − 1): the head-0 score of word `query` at position p + o against word `key` at p, for
    offsets o = −(n−1) … n − 1 (columns) and absolute positions p (rows): every row the same."""
    tokens = words(sentence)
    n = len(tokens)
    if not (0 <= query < n and 0 <= key < n):
        raise ValueError(f"choose the query and key words among the sentence's {n} words")
    x, w = embed(tokens, setup.d_model, setup.seed), weights(setup)
    q, k = x[query] @ w["w_q"][0], x[key] @ w["w_k"][0]  # (d_k,)
    offsets = torch.arange(-(n - 1), n)
    rows = []
    for p in ABSOLUTE:
        at = torch.full_like(offsets, p)
        rows.append((_turn(q.expand(len(offsets), -1), at + offsets) * _turn(k.expand(len(offsets), -1), at)).sum(-1)
                    / math.sqrt(setup.d_k))
    return Step("rope", f"RoPE: the score of “{tokens[query]}” and “{tokens[key]}” by offset, at any position",
                "Queries and keys are turned by angles proportional to their positions (Su et al. 2021): the score "
                "depends on the offset i − j only, so every row (the key at p = 0, 1, 10, 100, 1000) is the same.",
                f"score: {len(ABSOLUTE)} positions × {2 * n - 1} offsets; q, k: d_k = {setup.d_k} (pairs turned)",
                torch.stack(rows)[None], [f"key at p = {p}" for p in ABSOLUTE], [f"{o:+d}" for o in offsets.tolist()],
                "score")


def alibi_step(n: int, heads: int = ALIBI_HEADS) -> Step:
    """(1, heads, n): ALiBi's penalty −m_h·d at distance d = |i − j| for each head."""
    slopes = positional.alibi_slopes(heads)
    table = -slopes[:, None] * torch.arange(n, dtype=torch.float64)
    return Step("alibi", "ALiBi: a linear penalty on distance, one slope per head",
                f"No position vector at all: each head adds −m_h·|i − j| to its scores, m_h = 2^(−8(h+1)/H), so "
                f"with H = {heads} heads the slopes run 1/2 … 1/{round(1 / float(slopes[-1]))} (Press et al. 2021): "
                "steep heads look near, gentle heads far.", f"bias: {heads} heads × {n} distances (the full bias is "
                f"heads × n × n)", table[None], [f"head {h} (m = 1/{round(1 / float(m))})" for h, m in
                                                 enumerate(slopes.tolist())], [f"|i − j| = {d}" for d in range(n)],
                "bias")


# ---- the lookup ----

@dataclass(frozen=True)
class Lookup:
    """One query's lookup in head 0: scores (m,) with −∞ where masked, soft and hard weights (m,), the soft and
    hard outputs (d_k,), and `gap` = ‖soft − hard‖ / ‖hard‖."""

    step: Step
    soft: torch.Tensor
    hard: torch.Tensor
    soft_out: torch.Tensor
    hard_out: torch.Tensor
    gap: float


def lookup(walk: Walk, query: int = 0, temperature: float = 1.0) -> Lookup:
    """Hard lookup V[argmax_j s_j] beside the soft one Σ_j softmax(s / T)_j v_j for the scores s of query `query`
    (head 0 of a lesson.Walk, as scaled and masked there). T → 0 gives the hard lookup, large T the mean of the
    values. The soft lookup is one update of a modern Hopfield network with β = 1/T (Ramsauer et al. 2020).
    O(m·d_k)."""
    if not 0 <= query < len(walk.queries):
        raise ValueError(f"choose a query among the sentence's {len(walk.queries)} words")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and 0.01 <= temperature <= 100):
        raise ValueError(f"temperature {temperature!r} is not allowed; choose a number from 0.01 to 100")
    s = walk.masked[0, query]
    soft = torch.softmax(s / temperature, dim=-1)
    hard = torch.zeros_like(soft)
    hard[int(s.argmax())] = 1.0
    soft_out, hard_out = soft @ walk.v[0], hard @ walk.v[0]
    gap = float((soft_out - hard_out).norm() / hard_out.norm().clamp_min(1e-300))
    step = Step("lookup", f"The lookup of “{walk.queries[query]}”: hard and soft side by side",
                "A dictionary returns the value of the one matching key; attention returns every value, weighted by "
                f"softmax(score / T). At T = {temperature:g} the soft lookup is {gap:.3g} (relative) from the hard "
                "one: lower T and it becomes the hard lookup. One softmax step is the update rule of a modern Hopfield "
                "network (Ramsauer et al. 2020).", f"scores, weights: 3 × {len(walk.keys)} = 3 × m; outputs: "
                f"d_k = {walk.setup.d_k}", torch.stack((s, soft, hard))[None],
                ["score s = q·k" + ("/√d_k" if walk.setup.scaled else ""), f"soft: softmax(s / {temperature:g})",
                 "hard: one-hot argmax s"], list(walk.keys))
    return Lookup(step, soft, hard, soft_out, hard_out, gap)


# ---- what the weights explain ----

def stack(setup: Setup, layers: int) -> list[dict]:
    """`layers` layers' seeded weights; the first is the Learn page's own layer."""
    if layers not in (1, *LAYERS):
        raise ValueError(f"layers = {layers!r} is not allowed; choose 1, 2 or 3")
    return [weights(dataclasses.replace(setup, seed=setup.seed + 1_000_003 * layer)) for layer in range(layers)]


def run_stack(x: torch.Tensor, ws: list[dict], setup: Setup, hidden: torch.Tensor | None = None,
              ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """x_{l+1} = x_l + attention_l(x_l) (a residual stream, no normalisation): the last x (n, d_model) and each
    layer's weights (H, n, n); or batched, (B, n, d_model) and (B, H, n, n). `hidden` (n,) or (B, n) bool: keys
    hidden from every layer."""
    found = []
    for w in ws:
        out, attn = attend(x, w, setup, hidden=hidden)
        x = x + out
        found.append(attn)
    return x, found


def rollout(layer_weights: list[torch.Tensor]) -> torch.Tensor:
    """Attention rollout (Abnar and Zuidema 2020): R = Ã_L ⋯ Ã_1 with Ã_l = ½ A_l + ½ I (the residual connection
    as an identity half the flow), A_l (n, n) a layer's weights averaged over heads. Rows of R sum to 1: how much
    of each input token reaches each output. O(L·n³)."""
    r = None
    for a in layer_weights:
        mixed = 0.5 * a + 0.5 * torch.eye(a.shape[-1], dtype=a.dtype)
        mixed = mixed / mixed.sum(-1, keepdim=True)
        r = mixed if r is None else mixed @ r
    return r


def saliency(x: torch.Tensor, ws: list[dict], setup: Setup, token: int) -> torch.Tensor:
    """(n,) ‖∂f/∂x_j‖ with f = ⟨y_token, u⟩, u the unit direction of token's final output y_token (held fixed):
    gradient saliency (Simonyan et al. 2013, arXiv 1312.6034) of each input word for one output. One backward."""
    x = x.detach().clone().requires_grad_(True)
    y = run_stack(x, ws, setup)[0][token]
    (y @ (y / y.norm()).detach()).backward()
    return x.grad.norm(dim=-1)


def erasure(x: torch.Tensor, ws: list[dict], setup: Setup, token: int) -> torch.Tensor:
    """(n,) ‖y_token − y_token(word j erased)‖ / ‖y_token‖: word j hidden as a key from every layer (it still has its
    own output), the change in token's final output. The n + 1 stacks run as one batch: O(n) times the stack."""
    n = x.shape[0]
    hidden = torch.cat((torch.zeros(1, n, dtype=torch.bool), torch.eye(n, dtype=torch.bool)))  # row 0: none
    y = run_stack(x.expand(n + 1, n, x.shape[1]), ws, setup, hidden)[0][:, token]  # (n + 1, d_model)
    return (y[1:] - y[0]).norm(dim=-1) / y[0].norm()


@dataclass(frozen=True)
class Reweighting:
    """Jain and Wallace's check on one layer: the original weights and the ones found (H, n, m), the mean total
    variation ½Σ|Ã − A| over rows (0: same weights, 1: disjoint), its largest row, and the output's relative
    change ‖ỹ − y‖ / ‖y‖."""

    original: torch.Tensor
    found: torch.Tensor
    weight_change: float
    largest_row_change: float
    output_change: float


def _jsd(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen–Shannon divergence of the rows (natural log), 0 … ln 2."""
    m = (0.5 * (p + q)).clamp_min(1e-300).log()
    return 0.5 * ((p * (p.clamp_min(1e-300).log() - m)).sum(-1) + (q * (q.clamp_min(1e-300).log() - m)).sum(-1))


def _per_head_outputs(walk: Walk) -> torch.Tensor:
    """(H, m, d_model): each head's values through its block of W_O, so that the layer's output is
    Σ_h A_h U_h (n, d_model) — one product per step of the search, not two through W_O."""
    heads, m, d_k = walk.v.shape
    return walk.v @ walk.w_o.view(heads, d_k, -1)


def reweight_loss(z: torch.Tensor, walk: Walk, penalty: float, u: torch.Tensor | None = None,
                  y: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, ∂loss/∂z) of the search below, the gradient written out (no autograd: a hundred tiny backward passes
    cost seconds on a busy CPU): ∂JSD/∂P = ½ log(P / M), M = (P + A)/2; the output term's ∂/∂P_h = G U_hᵀ with
    G = 2·penalty·(ỹ − y)/‖y‖² and U from `_per_head_outputs`; through the softmax, ∂/∂z = P ⊙ (g − Σ P g).
    `u`, `y`: U and the layer's output y, when the caller holds them (the search computes them once)."""
    a = walk.weights
    u = _per_head_outputs(walk) if u is None else u
    heads, n, _ = a.shape
    p = torch.softmax(z, dim=-1)
    y = walk.concat @ walk.w_o if y is None else y
    found = torch.einsum("hnm,hmd->nd", p, u)
    rows = heads * n
    loss = -_jsd(p, a).sum() / rows + penalty * ((found - y).norm() / y.norm()) ** 2
    m = 0.5 * (p + a)
    g = -0.5 * (p.clamp_min(1e-300).log() - m.clamp_min(1e-300).log()) / rows
    g = g + (2 * penalty * (found - y) / y.norm() ** 2)[None] @ u.transpose(-2, -1)
    return loss, p * (g - (p * g).sum(-1, keepdim=True))


def reweight(walk: Walk, steps: int = 200, penalty: float = 20.0, seed: int = 0, lr: float = 0.1) -> Reweighting:
    """Adversarial weights for a lesson.Walk's layer (Jain and Wallace 2019): logits z (H, n, m) from the original
    scores plus seeded N(0, 1) noise, `steps` Adam steps (Kingma and Ba 2014, arXiv 1412.6980) on
    −mean JSD(softmax z, A) + penalty·‖ỹ − y‖² / ‖y‖², ỹ = concat(softmax(z) V) W_O; masked cells stay 0.
    O(H·m·d_k·d_model + steps·H·n·m·d_model)."""
    a, u, y = walk.weights, _per_head_outputs(walk), walk.concat @ walk.w_o
    g = torch.Generator().manual_seed(seed)
    z = walk.masked + torch.randn(a.shape, generator=g, dtype=a.dtype)
    first, second = torch.zeros_like(a), torch.zeros_like(a)
    live = torch.isfinite(z)
    for t in range(1, steps + 1):
        grad = reweight_loss(z, walk, penalty, u, y)[1]
        first = 0.9 * first + 0.1 * grad
        second = 0.999 * second + 0.001 * grad ** 2
        move = lr * (first / (1 - 0.9 ** t)) / ((second / (1 - 0.999 ** t)).sqrt() + 1e-8)
        z = torch.where(live, z - move, z)
    found = torch.softmax(z, dim=-1)
    rows = 0.5 * (found - a).abs().sum(-1)
    out = torch.einsum("hnm,hmd->nd", found, u)
    return Reweighting(a, found, float(rows.mean()), float(rows.max()), float((out - y).norm() / y.norm()))


EXPLAIN_VIEWS = ("weights per layer", "rollout", "one word, four answers", "Jain–Wallace check")


def explain_step(view: str, sentence: str, setup: Setup, layers: int = 2, token: int = 0) -> Step:
    """One interpretability figure (`view`, one of EXPLAIN_VIEWS but the last) for a `layers`-deep stack of the
    page's layer over `sentence`: each layer's weights (L, n, n, mean over heads), the rollout after each layer
    (L, n, n), or for word `token` its raw last-layer weights, rollout, saliency and erasure (1, 4, n), each scaled
    to sum to 1 (only that view computes saliency and erasure)."""
    if view not in EXPLAIN_VIEWS[:-1]:
        raise ValueError(f"view {view!r} is not one of {', '.join(EXPLAIN_VIEWS[:-1])}")
    tokens = words(sentence)
    n = len(tokens)
    if not 0 <= token < n:
        raise ValueError(f"choose a word among the sentence's {n}")
    x, ws = embed(tokens, setup.d_model, setup.seed), stack(setup, layers)
    per_layer = [a.mean(0) for a in run_stack(x, ws, setup)[1]]
    shape = f"{layers} × {n} × {n} = layers × n × n"
    if view == "weights per layer":
        return Step("layers", f"Raw weights of a {layers}-layer stack", "Each layer's softmax weights, averaged over "
                    "heads: layer 1 is the layer above; the later layers mix words that are already mixtures.", shape,
                    torch.stack(per_layer), tokens, tokens, "weight",
                    panels=tuple(f"layer {i + 1}" for i in range(layers)))
    rolled = torch.stack([rollout(per_layer[:i + 1]) for i in range(layers)])
    if view == "rollout":
        return Step("rollout", "Attention rollout: ½A + ½I multiplied through the layers",
                    "How much of each input word reaches each output, counting the residual stream as half the flow "
                    "(Abnar and Zuidema 2020); after layer 1 it is ½A₁ + ½I.", shape, rolled, tokens, tokens, "share",
                    panels=tuple(f"after layer {i + 1}" for i in range(layers)))
    answers = torch.stack((per_layer[-1][token], rolled[-1][token], saliency(x, ws, setup, token),
                           erasure(x, ws, setup, token)))
    return Step("answers", f"Which words made “{tokens[token]}”? Four answers",
                "Its last layer's raw weights, its rollout, gradient saliency ‖∂y/∂x_j‖ and erasure (hide word j from "
                "every layer, measure the change), each scaled to sum to 1. Where they disagree, the raw weights alone "
                "were not the explanation.", f"4 × {n} = methods × words",
                (answers / answers.sum(-1, keepdim=True))[None],
                ["raw weights (last layer)", "rollout", "gradient saliency", "erasure"], tokens, "share")


def reweight_step(walk: Walk, steps: int = 200) -> tuple[Step, Reweighting]:
    """The Jain–Wallace figure: head 0's original and adversarial weights side by side, with the two numbers."""
    found = reweight(walk, steps=steps)
    n, m = len(walk.queries), len(walk.keys)
    step = Step("jain_wallace", "Different weights, nearly the same output (Jain and Wallace 2019)",
                f"{steps} optimisation steps looked for weights far from the layer's while keeping its output: the "
                f"weights moved by {found.weight_change:.2f} in total variation on average (0: same, 1: disjoint; "
                f"{found.largest_row_change:.2f} for the most moved word), the output by {found.output_change:.1%}. "
                "High weights are not proof that a word mattered.",
                f"A: 2 × {n} × {m} = (original, found) × n × m, the first head",
                torch.stack((found.original[0], found.found[0])), list(walk.queries), list(walk.keys), "weight",
                panels=("original", "found"))
    return step, found

"""Native Sparse Attention: compressed, selected and sliding-window branches mixed by gates (Yuan et al. 2025,
'Native Sparse Attention: Hardware-Aligned and Natively Trainable Sparse Attention', arXiv 2502.11089)."""
from __future__ import annotations

import functools

import numpy as np
import torch

from ..spec import Cost, Generation, Insight, MechanismSpec, Param, Shape, State, Supports
from ._cache import Cache, Ring, kv_bytes
from ._common import GPU_WORKSPACE, GPUS, check_key_padding, check_sinks, checked_shape, scale, trusted
from ._cpu import ALWAYS, others_running, run_blocks
from ._nsa_branches import _block_bytes, _selected, _softmax_rows, compressed, rows, visible_blocks
from ._sparse import work_dtype

ROWS = 64  # a GPU's smallest block of queries of the forward pass, and its unit (`block_rows`)
CPU_ROWS = 128  # queries per block of the forward pass on a CPU (`block_rows`)
PARALLEL_MIN = 1 << 20  # numbers of the queries (B·H·n·D) from which the blocks may be shared among threads (a
# call of tens of milliseconds: n = 2048 at 8 heads, D = 64)
GPU_BLOCK_NUMBERS = 1 << 27  # a GPU block's compressed, selected and window keys, a row and head each (`block_rows`)
GATES = ("g_cmp", "g_slc", "g_win")
GATE_LOGIT = 2.0  # default gates sigmoid(z), z uniform in [−2, 2]
DEFAULTS = {"block": 32, "stride": 16, "select_block": 64, "select_blocks": 16, "window": 512}


def block_rows(device: str, bh: int, n: int, *, block: int = 32, stride: int = 16, select_block: int = 64,
               select_blocks: int = 16, window: int = 512) -> int:
    """Queries per block of the forward pass over n queries of bh heads and batch elements: CPU_ROWS on a CPU, where
    a block's selected keys are read once for all its rows that chose them (`native.block_softmax`), so that more
    rows share more: at n = 16384 (8 heads, fp32, causal, 2-core EPYC) blocks of 64, 128 and 256 rows took 1.99, 1.61
    and 1.61 s a call, SDPA 2.17 (the per-row kernel before it: 2.81, 2.36 and 2.46). On a GPU,
    where a block's products are launches to fill, not caches to fit, as many as keep a block's compressed scores,
    selected positions and window keys, a row and head each, within GPU_BLOCK_NUMBERS, from ROWS up to 64 times ROWS:
    4,096 at n = 16384 with eight heads, 250 at a million tokens, where a row sees 65,535 compressed blocks. On an
    H100 (fp32, causal, n = 16384) blocks of 64, 256, 1,024 and 4,096 rows took 720, 183, 61 and 43 ms, the window's
    extra keys (r + window a row) notwithstanding."""
    if device not in GPUS:
        return CPU_ROWS
    keys = visible_blocks(n - 1, block, stride) + min(select_blocks, -(-n // select_block)) * select_block + window
    return max(ROWS, min(GPU_WORKSPACE * ROWS, GPU_BLOCK_NUMBERS // (bh * keys)))


# -- gates: seeded defaults drawn outside the kernel -------------------------------------------------------------
def draw_gates(B: int, H: int, n: int, *, seed: int = 0, device=None, dtype=torch.float32) -> dict:
    """{'g_cmp', 'g_slc', 'g_win'}, each (B, H, n) in (0, 1): sigmoid(z), z uniform in [−2, 2] (0.12 to 0.88), one
    per query head and token. The paper computes them from the input with an MLP and a sigmoid; untrained, they are
    seeded here. Drawn position by position from one stream, so the first m tokens' gates are the same whatever n."""
    u = torch.rand(n, 3, B, H, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    z = torch.sigmoid(GATE_LOGIT * (2 * u - 1))
    return {name: z[:, i].permute(1, 2, 0).to(device=device, dtype=dtype).contiguous() for i, name in enumerate(GATES)}


def init_state(shape: Shape, device=None, dtype=torch.float32, *, seed: int = 0, **params) -> dict:
    """Seeded default gates for shape's tokens (`draw_gates`), each (B, H, Nq)."""
    SPEC.check_params(params, shape)
    return draw_gates(shape.B, shape.H, shape.Nq, seed=seed, device=device, dtype=dtype)


def _gates(q: torch.Tensor, given: dict, seed: int, *, longer: bool = False) -> tuple[torch.Tensor, ...]:
    """The three gates (B, H, ≥ n): those given (checked: shape, device, values in [0, 1], except inside
    validated()), the seeded defaults for the others."""
    B, H, n, _ = q.shape
    drawn = draw_gates(B, H, n, seed=seed, device=q.device, dtype=q.dtype) if None in given.values() else {}
    return tuple(drawn[name] if given[name] is None else _checked_gate(name, given[name], q, longer)
                 for name in GATES)


def _checked_gate(name: str, t, q: torch.Tensor, longer: bool) -> torch.Tensor:
    if trusted():
        return t
    B, H, n, _ = q.shape
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() != 3 or tuple(t.shape[:2]) != (B, H) \
            or (t.shape[2] < n if longer else t.shape[2] != n):
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name} must be a floating tensor of shape (batch, heads, tokens) = ({B}, {H}, "
                         f"{'at least ' if longer else ''}{n}), one gate per query head and token, got {got}; "
                         f"init_state draws one")
    if t.device != q.device:
        raise ValueError(f"{name} is on {t.device} but the queries are on {q.device}; move it with "
                         f"{name}.to({str(q.device)!r})")
    if not bool(((t >= 0) & (t <= 1)).all()):
        raise ValueError(f"{name} must lie in [0, 1] (a sigmoid's output); got values from {float(t.min()):.3g} to "
                         f"{float(t.max()):.3g}")
    return t


# -- the mechanism -------------------------------------------------------------------------------------------------
def nsa_attention(q, k, v, *, causal: bool = True, key_padding_mask=None, block: int = 32, stride: int = 16,
                  select_block: int = 64, select_blocks: int = 16, window: int = 512, g_cmp=None, g_slc=None,
                  g_win=None, seed: int = 0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """o_t = g_cmp·Attn(q_t, K̃_{≤t}, Ṽ_{≤t}) + g_slc·Attn(q_t, K_sel(t), V_sel(t))
    + g_win·Attn(q_t, K_win(t), V_win(t)), causal only. K̃, Ṽ: means over blocks of `block` tokens every `stride`
    (`compressed`), a query seeing those that end at or before it. K_sel(t): the tokens ≤ t of `select_blocks`
    blocks of `select_block` tokens, the first and the query's own always, the rest by compressed attention spread
    back over the tokens it pooled, summed over the query heads sharing a key/value head (one selection per group, as
    the paper's kernel). K_win(t): t − window < j ≤ t.

    q (B, H, n, D), k, v (B, Hk, n, D) → (B, H, n, D); gates (B, H, n) in [0, 1] (seeded from `seed` when None).
    Queries in blocks of `block_rows`: O(n·(n/stride + select_blocks·select_block + window)·d) time, O(n·d) memory
    (each block's gathered keys are rows·select_blocks·select_block·d per key/value head; nothing n × n). On a CPU
    where other programs run, the blocks, each cut into equal shares of the key/value heads, are shared among
    torch's threads as they come free (`block_workers`, `_cpu.run_blocks`), each running its operations on one
    thread: the threads meet once a call instead of at each of its thousands of operations.
    `sinks` (H,): head h's logit a_h joins each of the three branches' softmax with no value (gpt-oss, arXiv
    2508.10925): Attn(q_t, K, V) = Σ_j e^(s_j) v_j / (Σ_j e^(s_j) + e^(a_h)) in each branch, before the gates mix
    them; the blocks read are those without sinks (`_nsa_branches.rows`). O(n·H) more a branch.
    """
    checked_shape(SPEC, q, k, v, causal, block=block, stride=stride, select_block=select_block,
                  select_blocks=select_blocks, window=window)
    if key_padding_mask is not None:
        check_key_padding(SPEC, key_padding_mask, q, k)  # refuses it with the spec's sentence
    if sinks is not None:
        check_sinks(SPEC, sinks, q)
    p = {"block": block, "stride": stride, "select_block": select_block, "select_blocks": select_blocks,
         "window": window}
    gates = _gates(q, {"g_cmp": g_cmp, "g_slc": g_slc, "g_win": g_win}, seed)
    kc, vc = compressed(k, block, stride), compressed(v, block, stride)
    n = q.shape[2]
    short = -n % select_block  # the last selection block's positions past the end: zero keys, always masked
    work = work_dtype(q.dtype)  # the sparse products' (half k, v copied once, not a block at a time)
    selectable = tuple(torch.nn.functional.pad(x.to(work), (0, 0, 0, short)) if short else x.to(work) for x in (k, v))
    out = torch.empty_like(q)
    r = block_rows(q.device.type, q.shape[0] * q.shape[1], n, **p)

    workers = block_workers(q, k, v, *gates, *(() if sinks is None else (sinks,)))
    Hk, G = k.shape[1], q.shape[1] // k.shape[1]

    def block(s: int, a: int, b: int) -> None:  # rows s … s + r − 1 of key/value heads a … b − 1
        e, h = min(n, s + r), slice(a * G, b * G)
        out[:, h, s:e] = rows(q[:, h, s:e], k[:, a:b], v[:, a:b], kc[:, a:b], vc[:, a:b], s,
                              [g[:, h, s:e] for g in gates], **p, selectable=tuple(x[:, a:b] for x in selectable),
                              sinks=None if sinks is None else sinks[h])

    parts = max(c for c in range(1, min(workers, Hk) + 1) if Hk % c == 0)  # equal shares of the heads
    cuts = [Hk * i // parts for i in range(parts + 1)]
    # the last blocks, which see the most compressed blocks, first: the threads end together
    run_blocks([functools.partial(block, s, a, b) for s in reversed(range(0, n, r)) for a, b in zip(cuts, cuts[1:])],
               workers)
    return out


def block_workers(*tensors: torch.Tensor) -> int:
    """Threads the forward pass shares its query blocks among (`_cpu.run_blocks`): torch's count on a CPU where other
    programs are running (`_cpu.others_running`) and the call has PARALLEL_MIN numbers or more (B·H·n·D of the
    queries), else 1: in the caller, the blocks one after another, each operation on torch's threads. On a quiet
    machine that is faster, each operation on all the heads (n = 2048 to 16384, 8 heads, D = 64, 2-core Xeon, 5
    interleaved rounds: shared 66.7, 157, 351, 874 ms against 59.2, 147, 330, 843); beside other programs sharing
    wins (n = 16384, against SDPA interleaved: 0.83–0.86× beside one spinning program, 0.83–0.85× beside two, 0.90×
    beside six, where one fitted thread made 1.0×, 1.5–1.7× and 1.8×). Also 1 where autograd records (the blocks'
    writes into one output from several threads would race in its graph), under CPU autocast, and under torch's
    profiler, which records the allocations of the thread it was started in only: the engine's memory run then
    measures the blocks one after another, the peak `_memory` predicts."""
    q = tensors[0]
    recording = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    if q.device.type != "cpu" or recording or q.numel() < PARALLEL_MIN or torch.is_autocast_enabled("cpu") \
            or torch.autograd._profiler_enabled() or torch.get_num_threads() <= 1 or others_running() == 0:
        return 1
    return torch.get_num_threads()


# -- generation: a key-value cache and the compressed blocks so far ------------------------------------------------
class NSACache(Cache):
    """`tokens`: every token's k, v (selection may pick any block); `blocks`: the compressed k, v of each block
    completed so far; the gates of the tokens to come (inputs of future steps, not counted in `nbytes`); `sinks` (H,)
    the layer's sink logits, or None."""

    def __init__(self, params: dict, k, v, gates, seed: int, max_len: int | None, sinks: torch.Tensor | None = None):
        super().__init__(params, k)
        self.sinks = sinks
        n = k.shape[2]
        self.tokens = Ring(k, v, reserve=max_len or 0)
        ahead = max(max_len or 0, n)
        self.blocks = Ring(compressed(k, params["block"], params["stride"]),
                           compressed(v, params["block"], params["stride"]),
                           reserve=visible_blocks(ahead - 1, params["block"], params["stride"]))
        self.gates, self.seed = gates, seed
        self.next_gates(ahead)  # drawn now, so that no step up to max_len draws

    def next_gates(self, stop: int | None = None) -> list[torch.Tensor]:
        """The gates of position `length`, (B, H, 1) views; past the stream (or short of `stop` positions), the
        seeded defaults of positions up to twice as far are drawn first (amortized O(1) a token)."""
        t = self.length if stop is None else stop - 1
        if t >= min(g.shape[-1] for g in self.gates):
            B, H, _ = self.gates[0].shape
            drawn = draw_gates(B, H, 2 * t + 1, seed=self.seed, device=self.device, dtype=self.gates[0].dtype)
            self.gates = [torch.cat([g, drawn[name][..., g.shape[-1]:]], -1) if g.shape[-1] <= t else g
                          for name, g in zip(GATES, self.gates)]
        return [g[..., self.length:self.length + 1] for g in self.gates]

    def mark(self) -> tuple[int, ...]:
        return (self.length, self.tokens.length, self.blocks.length)

    def rewind(self, mark: tuple[int, ...]) -> None:
        self.length, self.tokens.length, self.blocks.length = self._checked(mark)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (*self.tokens.tensors(), *self.blocks.tensors())

    @property
    def used_bytes(self) -> int:
        return self.tokens.used_bytes + self.blocks.used_bytes


def _params(block=32, stride=16, select_block=64, select_blocks=16, window=512) -> dict:
    return {"block": block, "stride": stride, "select_block": select_block, "select_blocks": select_blocks,
            "window": window}


def _remember(k, v, *, max_len: int | None = None, g_cmp=None, g_slc=None, g_win=None, seed: int = 0,
              sinks: torch.Tensor | None = None, **params) -> NSACache:
    """The prompt's keys and values and its compressed blocks; gates given past the prompt are kept for the steps.
    The gates are per query head: without queries, their head count is taken from the gates given, else the sinks',
    else the key/value heads' (the steps' queries must then have as many heads)."""
    p = _params(**params)
    given = [g_cmp, g_slc, g_win]
    like = next((g for g in given if g is not None), None)
    B, Hk, n, D = k.shape
    H = (Hk if sinks is None else sinks.shape[0]) if like is None else like.shape[1]
    q = k.new_empty(B, H, n, D)
    gates = _gates(q, dict(zip(GATES, given)), seed, longer=True)
    return NSACache(p, k, v, list(gates), seed, max_len, sinks)


def _prefill(q, k, v, *, max_len: int | None = None, g_cmp=None, g_slc=None, g_win=None, seed: int = 0,
             sinks: torch.Tensor | None = None, **params):
    """The prompt's causal outputs and its cache."""
    gates = _gates(q, {"g_cmp": g_cmp, "g_slc": g_slc, "g_win": g_win}, seed, longer=True)
    n = q.shape[2]
    out = nsa_attention(q, k, v, causal=True, **params, sinks=sinks,
                        **{name: g[..., :n] for name, g in zip(GATES, gates)})
    cache = NSACache(_params(**params), k, v, list(gates), seed, max_len, sinks)
    return out, cache


def _step(q, k, v, cache: NSACache):
    """Append the token; close a compressed block when one ends here; then the three branches for the new query:
    it reads `decode_tokens` tokens (compressed, selected, window), O((n/stride + S·l' + w)·d) whatever else."""
    p, t = cache.params, cache.length
    gates = cache.next_gates()
    cache.tokens.append(k, v)
    cache.length += 1
    keys, values = cache.tokens.view()
    block, stride = p["block"], p["stride"]
    if t + 1 >= block and (t + 1 - block) % stride == 0:
        cache.blocks.append(keys[:, :, t + 1 - block:].mean(2, keepdim=True),
                            values[:, :, t + 1 - block:].mean(2, keepdim=True))
    kc, vc = cache.blocks.view()
    return rows(q, keys, values, kc, vc, t, gates, **p, sinks=cache.sinks), cache


def decode_tokens(n: int, block: int = 32, stride: int = 16, select_block: int = 64, select_blocks: int = 16,
                  window: int = 512) -> dict[str, int]:
    """Tokens one decode step reads at context n (the new token at position n − 1), branch by branch: the compressed
    blocks ending by then (⌊(n − block)/stride⌋ + 1), the selected blocks' tokens (min(select_blocks, ⌈n/l'⌉) blocks,
    the own block only up to the query) and the window (min(window, n)); 'total' their sum (a token in two branches
    counts twice, as each branch reads it). The paper's Table 4 counts n/stride + select_blocks·select_block +
    window: 2048, 2560, 3584, 5632 at 8k, 16k, 32k, 64k; this count is one less each (⌊(n − 32)/16⌋ + 1 = n/16 − 1)."""
    t = n - 1
    blocks = min(select_blocks, t // select_block + 1)
    counts = {"compressed": visible_blocks(t, block, stride),
              "selected": (blocks - 1) * select_block + t % select_block + 1,
              "window": min(window, n)}
    return {**counts, "total": sum(counts.values())}


STEP_TOKENS_NOTE = ("The paper's Table 4 (Yuan et al. 2025, arXiv 2502.11089) counts n/stride + select_blocks·"
                    "select_block + window tokens a decode step: 2,048, 2,560, 3,584 and 5,632 at 8K, 16K, 32K and "
                    "64K with its settings (block 32, stride 16, select_block 64, select_blocks 16, window 512). "
                    "Counted block by block, blocks of 32 every 16 that end by n number ⌊(n − 32)/16⌋ + 1 = n/16 − 1, "
                    "so these counts are one less each: 2,047, 2,559, 3,583 and 5,631. A token two branches read "
                    "counts twice, as each branch reads it.")


def _cache_bytes(s: Shape, block=32, stride=16, select_block=64, select_blocks=16, window=512) -> float:
    return kv_bytes(s, s.Nk) + kv_bytes(s, visible_blocks(s.Nk - 1, block, stride))


def _step_flops(s: Shape, **params) -> float:
    """4·d per token read per query head (q·k and p·v)."""
    return 4.0 * s.bh * s.D * decode_tokens(s.Nk, **params)["total"]


# -- what it costs ---------------------------------------------------------------------------------------------
def _blocks(n: int, r: int) -> list[tuple[int, int]]:
    return [(s, min(n, s + r)) for s in range(0, n, r)]


def _executed_flops(s: Shape, block=32, stride=16, select_block=64, select_blocks=16, window=512) -> float:
    """Per query block [a, e): QKᵀ and PV over the compressed blocks the last query sees, over the gathered tokens of
    min(select_blocks, ⌈e/l'⌉) blocks, and over the window's keys max(0, a − w + 1) … e − 1: 4·d per cell."""
    cells = 0
    r = block_rows(s.device, s.bh, s.Nq, **_params(block, stride, select_block, select_blocks, window))
    for a, e in _blocks(s.Nq, r):
        sel = min(select_blocks, -(-e // select_block)) * select_block
        cells += (e - a) * (visible_blocks(e - 1, block, stride) + sel + e - max(0, a - window + 1))
    return 4.0 * s.bh * s.D * cells


def _flops(s: Shape, block=32, stride=16, select_block=64, select_blocks=16, window=512) -> float:
    """Σ over queries t of 4·d per key read: the compressed blocks it sees, the selected tokens ≤ t, the window."""
    t = np.arange(s.Nq)
    cmp = np.where(t + 1 < block, 0, (t + 1 - block) // stride + 1)
    sel = (np.minimum(select_blocks, t // select_block + 1) - 1) * select_block + t % select_block + 1
    win = np.minimum(window, t + 1)
    return 4.0 * s.bh * s.D * float((cmp + sel + win).sum())


def _memory(s: Shape, block=32, stride=16, select_block=64, select_blocks=16, window=512, sinks: bool = False) -> float:
    """Peak bytes above the inputs: the output, the compressed keys and values (and k and v for the selection, when
    padded to whole selection blocks or copied from half precision), plus the largest stage of one query block
    (`_block_bytes`). Every stage grows with a block's end, so the last full block and the partial one, and the first,
    whose rows may see no compressed block yet (softmax then masks into copies). Gates given (as the engine gives
    them), not drawn. `sinks`: the selection's sink correction at its products (`selected_softmax_bytes`).
    The blocks one after another, as under torch's profiler (`block_workers`). Where W threads share them, each
    task is a block's share of 1/W of the key/value heads, and every stage's tensors but a few positions and masks
    are per head: W tasks at their peaks at once hold the peak here and (W − 1) × 8–9 KiB (n = 4096 and 16384, 8
    heads, D = 64: 6.000 and 21.497 MiB for a whole last block, 6.008 and 21.506 for two halves)."""
    e, w = s.elem, max(s.elem, 4)
    n, short = s.Nq, -s.Nq % select_block
    fixed = s.output_bytes + kv_bytes(s, visible_blocks(n - 1, block, stride)) + \
        (2 * s.bk * (n + short) * s.D * w if short or e < w else 0)
    p = _params(block, stride, select_block, select_blocks, window)
    r = block_rows(s.device, s.bh, n, **p)
    full = n // r * r
    ends = {(0, min(r, n))} | ({(full - r, full)} if full else set()) | ({(full, n)} if full < n else set())
    return fixed + max(_block_bytes(s, a, end, **p, sinks=sinks) for a, end in ends)


def _branches(q, k, block: int, stride: int, select_block: int, select_blocks: int):
    """Over all n queries at once (small n): the compressed probabilities p (B, H, n, m) (zero before a query sees a
    block), `cover` (m, n), which tokens each compressed block pools, and `chosen` (B, H, n, n), the tokens of the
    blocks each query's group selects (past the query included: the caller masks them). k repeated to H heads."""
    B, H, n, D = q.shape
    G = H // k.shape[1]
    k = k.repeat_interleave(G, dim=1)
    kc = compressed(k, block, stride)
    m = kc.shape[2]
    t = torch.arange(n)
    ends = torch.arange(m) * stride + block - 1
    sc = (q @ kc.transpose(-2, -1)) * scale(D)
    sc = sc.masked_fill(ends > t[:, None], float("-inf"))
    p = _softmax_rows(sc, dead_ok=True) if m else sc  # (B, H, n, m)
    cover = (t[None, :] >= (ends - block + 1)[:, None]) & (t[None, :] <= ends[:, None])
    score = (p.view(B, H // G, G, n, m).sum(2) @ cover.to(q.dtype)) if m else q.new_zeros(B, H // G, n, n)
    nsel = -(-n // select_block)
    padded = torch.nn.functional.pad(score, (0, nsel * select_block - n)).view(B, H // G, n, nsel, select_block)
    idx = _selected(padded.sum(-1), 0, n, select_block, select_blocks)
    chosen = torch.zeros(B, H // G, n, nsel, dtype=torch.bool).scatter_(-1, idx, True)
    return p, cover, chosen.repeat_interleave(select_block, -1)[..., :n].repeat_interleave(G, dim=1)


def _effective(q, k, v, causal: bool, state: dict, block=32, stride=16, select_block=64, select_blocks=16,
               window=512) -> tuple[torch.Tensor, torch.Tensor]:
    """The dense (B, H, n, n) weights g_cmp·W_cmp + g_slc·W_slc + g_win·W_win with W_cmp's weight on a compressed
    block spread evenly over the tokens it averages (the mean pooling), W_slc and W_win softmax over the selected and
    the window's tokens; values v (shared heads repeated: a picture, not a kernel)."""
    n, D = q.shape[2], q.shape[3]
    G = q.shape[1] // k.shape[1]
    gates = _gates(q, {name: state.get(name) for name in GATES}, 0)
    p, cover, chosen = _branches(q, k, block, stride, select_block, select_blocks)
    k, v = (x.repeat_interleave(G, dim=1) for x in (k, v))
    w_cmp = p @ (cover.to(q.dtype) / block)  # (B, H, n, n)
    t = torch.arange(n)
    dense = (q @ k.transpose(-2, -1)) * scale(D)
    future = t[None, :] > t[:, None]
    w_slc = torch.softmax(dense.masked_fill(~chosen | future, float("-inf")), -1)
    w_win = torch.softmax(dense.masked_fill(future | (t[None, :] <= t[:, None] - window), float("-inf")), -1)
    g_cmp, g_slc, g_win = (g[..., :n, None] for g in gates)
    return g_cmp * w_cmp + g_slc * w_slc + g_win * w_win, v


def _read(q, k, causal: bool, state: dict, block=32, stride=16, select_block=64, select_blocks=16,
          window=512) -> tuple[torch.Tensor, tuple[str, ...]]:
    """The cells batch 0's queries read, per query head (H, n, n + m): the selected blocks' tokens ≤ t and the
    window's in full, then the m compressed blocks, those ending at or before t; the blocks named "c0 0–31" by the
    tokens they pool."""
    with torch.no_grad():
        _, _, chosen = _branches(q[:1], k[:1], block, stride, select_block, select_blocks)
    n = q.shape[2]
    t = torch.arange(n)
    window_cells = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - window)
    tokens = (chosen[0] & (t[None, :] <= t[:, None])) | window_cells
    m = visible_blocks(n - 1, block, stride)
    ends = torch.arange(m) * stride + block - 1
    blocks = (ends[None, :] <= t[:, None]).expand(q.shape[1], n, m)
    names = tuple(f"c{i} {i * stride}–{i * stride + block - 1}" for i in range(m))
    return torch.cat([tokens, blocks], -1), names


def _reads(n: int, causal: bool, block=32, stride=16, select_block=64, select_blocks=16,
           window=512) -> tuple[float, str]:
    """At most the cells a query reads in full, Σ_t: its own block's tokens ≤ t and the window (both end at t: the
    longer holds the other), the first block, and the other chosen blocks whole, as if none lay in the window (the
    inputs decide); the compressed blocks beside them (decode_tokens counts each branch's reads)."""
    t = np.arange(n)
    own = t // select_block
    lo = np.maximum(0, t - window + 1)  # the window: [lo, t]
    if select_blocks > 1:
        lo = np.minimum(own * select_block, lo)  # with the own block, another suffix: the longer holds the other
    union = t - lo + 1 + np.minimum(np.minimum(select_block, t + 1), lo)  # and the first block
    others = np.maximum(0, np.minimum(select_blocks, own + 1) - np.where(own > 0, 2, 1)) * select_block
    cells = float(np.minimum(union + others, t + 1).sum())
    cmp = visible_blocks(n - 1, block, stride)
    return cells, (f"at most {cells / (n * n):.1%} of the n² cells read in full (the selected blocks and the "
                   f"window; fewer where a chosen block lies in the window), and up to {cmp:,} compressed block "
                   f"means a query")


SPEC = MechanismSpec(
    label="NSA",
    fn=nsa_attention,
    description="Native Sparse Attention: each query reads compressed block means, the top-scoring blocks in full "
                "(picked by the compressed scores) and a sliding window, mixed by gates; a bounded number of tokens "
                "per decode step.",
    paper="Yuan et al. 2025, 'Native Sparse Attention: Hardware-Aligned and Natively Trainable Sparse Attention', "
          "arXiv 2502.11089",
    params=(
        Param("block", 32, 1, 1 << 16, "Tokens pooled into one compressed key and value (l).", log=True,
              tokens=True, small=lambda n: 4),
        Param("stride", 16, 1, 1 << 16, "Tokens between the starts of compressed blocks (d).", log=True,
              small=lambda n: 2),
        Param("select_block", 64, 1, 1 << 16, "Tokens per selection block (l').", log=True, tokens=True,
              small=lambda n: 4),
        Param("select_blocks", 16, 1, 1 << 12, "Blocks each query reads in full (n), the first and its own "
              "included.", log=True, small=lambda n: 2),
        Param("window", 512, 1, 1 << 20, "Tokens of the sliding window, the query's own included (w).", log=True,
              tokens=True, small=lambda n: 4),
    ),
    exact=False,
    state=State(init=init_state, keys=GATES),
    cost=Cost(flops=_flops, executed_flops=_executed_flops, memory_bytes=_memory,
              time_big_o="O(n·(n/stride + n_sel·l' + w)·d)", memory_big_o="O(n·d)",
              sinks_memory_bytes=lambda s, **p: _memory(s, **p, sinks=True), keeps_threads=lambda **_: ALWAYS),
    supports=Supports(
        causal=True,
        cross=False,
        causal_only="its blocks are selected from the compressed blocks that end before the query and its window "
                    "looks back only, as NSA is defined for decoding",
        padding=False,
        no_padding="its compressed blocks average whatever tokens they span, padding included, so a mask would "
                   "have to reshape the blocks",
        shared_kv=True,
        sinks=True,
        generation=Generation(remember=_remember, step=_step, cache_bytes=_cache_bytes, prefill=_prefill,
                              step_flops=_step_flops, step_big_o="O((n/stride + n_sel·l' + w)·d)",
                              cache_big_o="O(n·d)", step_tokens=decode_tokens, step_tokens_note=STEP_TOKENS_NOTE),
    ),
    insight=Insight(
        effective=_effective,
        selected=_read,
        extra_columns="compressed blocks",
        reads=_reads,
        regime=("local", "gaussian", "NSA keeps a window and the blocks the compressed scores favour: with "
                "unrelated tokens the weight softmax spreads over the whole sequence falls mostly on blocks it "
                "does not read, and its gates (random, untrained here) mix three different distributions."),
        accuracy_note="NSA is a model of its own: its gates, learned in the paper and random here, weigh three "
                      "attentions whose rows do not sum to one together, so its distance from softmax is not an "
                      "approximation error.",
    ),
)

"""The C++ kernels as torch operators (attn_lab::select, selected_softmax, block_softmax, index_scores,
elu_plus_one, prefix_sums, band, linear: torch.library custom ops with fake implementations and no backward), and
the wrappers that check what each kernel would misread."""
from __future__ import annotations

import ctypes
import math
from typing import Optional

import torch

from .loader import band_expected, describe, elu_expected, library, linear_lanes

FLOATS = (torch.float32, torch.float64)  # the kernels' types (`select`, `selected_softmax`)


def _threads(items: int) -> int:
    """Threads a kernel splits `items` rows (or pairs of rows) among: torch's, at most one a row. The kernels and their
    scratch's pricing both take it from here."""
    return max(1, min(torch.get_num_threads(), items))


def _refuse_unless(ok: bool, what: str, got: str) -> None:
    if not ok:
        raise ValueError(f"native {what}; got {got}")


def _kernels() -> ctypes.CDLL:
    """The library, for an op's implementation (its wrapper has checked there is one)."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"the C++ kernels are not loaded ({describe()})")
    return lib


def _no_backward(name: str):
    def backward(ctx, *grads):
        raise RuntimeError(f"attn_lab::{name} (a C++ kernel) has no backward: call it without gradients; the "
                           f"attention functions run the torch form where gradients are wanted")
    return backward


# ---- select: the kk highest scores of each row --------------------------------------------------------------------

@torch.library.custom_op("attn_lab::select", mutates_args=(), device_types="cpu")
def _select_op(scores: torch.Tensor, kk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, m) float32 or float64 scores → (positions (rows, kk) int64, usable (rows, kk) bool): select.cpp."""
    flat = scores.contiguous()
    rows, m = flat.shape
    idx = torch.empty(rows, kk, dtype=torch.long)
    usable = torch.empty(rows, kk, dtype=torch.bool)
    if rows == 0:
        return idx, usable
    threads = _threads(rows)
    wide = flat.dtype == torch.float64
    scratch = torch.empty(threads * 2 * (m + 16), dtype=torch.int64 if wide else torch.int32)
    lib = _kernels()
    fn = lib.attn_select_f64 if wide else lib.attn_select_f32
    fn(flat.data_ptr(), rows, m, kk, threads, scratch.data_ptr(), idx.data_ptr(), usable.data_ptr())
    return idx, usable


@_select_op.register_fake
def _(scores, kk):
    return scores.new_empty(scores.shape[0], kk, dtype=torch.long), scores.new_empty(scores.shape[0], kk,
                                                                                     dtype=torch.bool)


_select_op.register_autograd(_no_backward("select"))


def runs(scores: torch.Tensor) -> bool:
    """Whether `select` takes these scores: float32 or float64 on the CPU, rows of at least one key, and a library."""
    return scores.device.type == "cpu" and scores.dtype in FLOATS and scores.dim() >= 1 and scores.shape[-1] > 0 \
        and library() is not None


def select(scores: torch.Tensor, kk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kk highest scores of each row (…, m) of NaN-free float32 or float64 CPU scores (`runs`): (indices (…, kk)
    int64, increasing in each row; usable (…, kk): the score is above −inf), ties at the threshold going to the
    earlier keys: topk._select_exact's selection, with the earliest keys where −inf scores fill a row. O(m) a row
    (select.cpp, the op attn_lab::select), on torch.get_num_threads() threads. Scratch: 2·(m + 16) keys a thread (of
    the scores' width)."""
    _refuse_unless(library() is not None and scores.device.type == "cpu" and scores.dtype in FLOATS
                   and scores.dim() >= 1 and 1 <= kk <= scores.shape[-1],
                   f"select needs a built library, float32 or float64 CPU scores and 1 <= kk <= "
                   f"{scores.shape[-1] if scores.dim() else 0} (the row's length)",
                   f"{scores.dtype} scores of shape {tuple(scores.shape)} on {scores.device} and kk = {kk}")
    rows_shape, m = scores.shape[:-1], scores.shape[-1]
    idx, usable = torch.ops.attn_lab.select(scores.detach().reshape(-1, m), kk)
    return idx.view(*rows_shape, kk), usable.view(*rows_shape, kk)


def scratch_bytes(m: int, rows: int, elem: int = 4) -> int:
    """Bytes of `select`'s scratch for `rows` rows of m scores of `elem` bytes: 2·(m + 16) keys of `elem` bytes for
    each of its threads, min(torch.get_num_threads(), rows)."""
    return _threads(rows) * 2 * (m + 16) * elem


# ---- selected_softmax: softmax over each query's selected keys ----------------------------------------------------

def _rows_of(x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """x (B, X, n, D) as rows of D read in place (a copy where its rows are not), and its batch and head strides."""
    if x.stride(-1) != 1 or x.stride(-2) != x.shape[-1]:
        x = x.contiguous()
    return x, x.stride(0), x.stride(1)


def _sizes(q: torch.Tensor, k: torch.Tensor, sel: torch.Tensor) -> tuple[int, ...]:
    """B, H, r, D of the queries, Hk, m of the keys, S and the entries a row of a selection (B, S, r, entries)."""
    return (*q.shape, k.shape[1], k.shape[2], sel.shape[1], sel.shape[-1])


@torch.library.custom_op("attn_lab::selected_softmax", mutates_args=(), device_types="cpu")
def _selected_softmax_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, usable: torch.Tensor,
                         width: int, sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """q (B, H, r, D), k and v (B, Hk, m, D), idx and usable (B, S, r, kk), `width` keys a part (0: whole rows),
    sinks (H,) of q's dtype or None → (B, H, r, D): selected_softmax.cpp. Refuses a position outside 0 … m − 1 with a
    sentence."""
    B, H, r, D, Hk, m, S, kk = _sizes(q, k, idx)
    out = q.new_empty(B, H, r, D)
    if out.numel() == 0:
        return out
    if kk == 0:
        return out.zero_()
    low, high = torch.aminmax(idx)
    if int(low) < 0 or int(high) >= m:
        raise ValueError(f"selected positions must lie in 0 … {m - 1}, got {int(low)} … {int(high)}")
    idx = idx.contiguous()
    flags = None if bool(usable.all()) else usable.contiguous()
    q, qb, qh = _rows_of(q.detach())
    k, kb, kh = _rows_of(k.detach())
    v, vb, vh = _rows_of(v.detach())
    threads = _threads(r)
    parts = -(-m // width) if width else 0
    scratch = q.new_empty(threads * kk)
    state = q.new_empty(r * (D + 4) if parts else 1)
    bounds = torch.empty(B * S * r * (parts + 1) if parts else 1, dtype=torch.int64)
    lib = _kernels()
    fn = lib.attn_selected_softmax_f64 if q.dtype == torch.float64 else lib.attn_selected_softmax_f32
    logits = None if sinks is None else sinks.detach().to(q.dtype).contiguous()
    fn(q.data_ptr(), qb, qh, k.data_ptr(), kb, kh, v.data_ptr(), vb, vh, idx.data_ptr(),
       None if flags is None else flags.data_ptr(), B, H, r, D, Hk, S, kk, m, width, D ** -0.5,
       None if logits is None else logits.data_ptr(), threads, scratch.data_ptr(), state.data_ptr(),
       bounds.data_ptr(), out.data_ptr())
    return out


def _shaped_like_queries(op, name: str) -> None:
    """A softmax op's fake implementation (an output of the queries' shape) and its refused backward."""
    op.register_fake(lambda q, *rest: q.new_empty(q.shape))
    op.register_autograd(_no_backward(name))


_shaped_like_queries(_selected_softmax_op, "selected_softmax")


def softmax_runs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether `selected_softmax` takes these, once in the work dtype: floating CPU tensors, no gradient wanted
    through them, and a library."""
    wanted = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return all(t.device.type == "cpu" and t.is_floating_point() for t in (q, k, v)) and not wanted and \
        library() is not None


def selected_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor,
                     usable: torch.Tensor, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """softmax_s∈sel(t) (q_t·k_s/√D) v_s in one pass a query row (selected_softmax.cpp, the op
    attn_lab::selected_softmax): q (B, H, r, D), k and v (B, Hk, m, D) of one CPU float dtype (`softmax_runs`), idx
    and usable (B, S, r, kk) with S = 1 or Hk → (B, H, r, D). A row with no usable key outputs zeros, one with a NaN
    or +inf score NaN. Reads k and v in place; holds the output and kk scores a thread (`softmax_scratch_bytes`).
    Refuses, with a sentence, an index outside 0 … m − 1 (the kernel would read past the keys). No backward: a
    gradient through it raises (`softmax_runs` sends such calls to the torch form). `sinks` (H,): head h's logit
    a_h joins each row's denominator with no value (gpt-oss's attention sinks): out = Σ e^(s_j − M) v_j /
    (Σ e^(s_j − M) + e^(a_h − M)), M the row's highest score, in the same pass (no second look at the scores)."""
    B, H, r, D = q.shape
    Hk, m = k.shape[1], k.shape[2]
    S, kk = idx.shape[1], idx.shape[-1]
    _refuse_unless(library() is not None and S in (1, Hk) and H % Hk == 0 and idx.shape == (B, S, r, kk)
                   and usable.shape == idx.shape and k.shape == (B, Hk, m, D) and v.shape == k.shape
                   and idx.dtype == torch.int64 and usable.dtype == torch.bool and q.dtype in FLOATS
                   and k.dtype == v.dtype == q.dtype
                   and all(t.device.type == "cpu" for t in (q, k, v, idx, usable))
                   and (sinks is None or (sinks.shape == (H,) and sinks.device.type == "cpu"
                                          and sinks.is_floating_point())),
                   "selected_softmax needs a library, CPU tensors, q (B, H, r, D), k and v (B, Hk, m, D) of q's "
                   "float32 or float64, and a selection (B, 1 or Hk, r, kk) of int64 positions and bool flags",
                   f"q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} {v.dtype}, "
                   f"positions {tuple(idx.shape)} {idx.dtype}, flags {usable.dtype}")
    return torch.ops.attn_lab.selected_softmax(q, k, v, idx, usable, _parts(m, D, q.element_size())[0], sinks)


PART_BYTES: Optional[int] = None  # a part's keys and values, in bytes; None: from this CPU (see `part_bytes`)


def part_bytes() -> int:
    """Bytes of one part's keys and values in `selected_softmax` (`part_keys`): PART_BYTES where set, else a quarter
    of a core's own level-2 cache (`_cpu.caches`), so that the part stays there beside the rows' queries, states and
    selections. On a CPU with 2 MiB a core (an Intel Xeon) that is the 512 KiB of 1,024 keys measured best there
    (below). On the 2-core AMD EPYC with 512 KiB a core (2026-12-06), top-k's causal call at n = 16384 (7 rounds
    interleaved, load 2.0) won 5 of 7 rounds in parts of 128 KiB against parts of 512 KiB, medians 2.48 s against
    2.88 s; alone, the kernel's cost a selected key was the same in parts of 256 to 1,024 keys there (11.0-11.6 ns)."""
    if PART_BYTES is not None:
        return PART_BYTES
    from ..mechanisms._cpu import caches  # (here, not above: the mechanisms import this module)
    return max(1 << 14, caches().per_core // 4)


def part_keys(m: int, D: int, elem: int) -> int:
    """Keys of one part in `selected_softmax` (0: whole rows): where a head's m keys and values outgrow a part
    (`part_bytes`) twice over, every row's entries among the first `part_keys` keys are taken, then the next part's,
    the softmax carried from part to part (its highest score, sum and output, rescaled as a higher score comes), so
    that each part's keys and values are read from the core's cache. A block of top-k at n = 16384, top_k = 2048,
    D = 64 (341 rows, a head's keys and values 8 MB) on the Xeon took 18.9, 17.1, 17.2, 17.7 and 20.1 ms in parts
    of 256 … 4,096 keys, 23.3 in whole rows (float32; the kernel's other widths and types run whole rows)."""
    width = max(1, part_bytes() // (2 * D * elem))
    return width if m > 2 * width else 0


def _parts(m: int, D: int, elem: int) -> tuple[int, int]:
    """(`part_keys`, the parts of m keys it makes; 0 for whole rows)."""
    width = part_keys(m, D, elem)
    return width, -(-m // width) if width else 0


def softmax_scratch_bytes(B: int, S: int, r: int, m: int, D: int, kk: int, elem: int = 4) -> int:
    """Bytes of `selected_softmax`'s scratch: kk scores of `elem` bytes for each of its threads, min(threads, r);
    where it runs in parts (`part_keys`), each row's running state (D + 4 numbers) and where each row's entries of
    each part begin (int64, B·S·r·(parts + 1))."""
    parts = _parts(m, D, elem)[1]
    carried = (r * (D + 4) * elem + 8 * B * S * r * (parts + 1)) if parts else elem + 8
    return _threads(r) * kk * elem + carried


# ---- block_softmax: softmax over each query's selected blocks of keys ----------------------------------------------

ROWS_AT_ONCE = 4  # block_softmax.cpp's rows of one block a step (its scratch holds their scores)


def block_tile(B: int, Hk: int, r: int) -> int:
    """Rows of one task in `block_softmax`: all r where the batch's key/value heads make two tasks a thread or more
    (each block's keys then serve every row of the head that chose it), else r split so that they do (MQA, one head).
    Tasks are taken as threads come free, so one slowed by another program takes fewer."""
    tasks = B * Hk
    want = 2 * torch.get_num_threads()
    return max(1, r if tasks >= want else -(-r // -(-want // tasks)))


def _block_sizes(B: int, H: int, r: int, Hk: int, nb: int, m: int, l: int) -> tuple[int, int, int, int]:
    """(tile, threads, scratch numbers a thread, list entries a thread) of a `block_softmax` call."""
    tile = block_tile(B, Hk, r)
    threads = _threads(B * Hk * -(-r // tile))
    return tile, threads, ROWS_AT_ONCE * l + 3 * (H // Hk) * tile, -(-m // l) + 1 + tile * nb


@torch.library.custom_op("attn_lab::block_softmax", mutates_args=(), device_types="cpu")
def _block_softmax_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: torch.Tensor, block: int,
                      first: int, sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """q (B, H, r, D), k and v (B, Hk, m, D), blocks (B, S, r, nb) int64, `block` keys a block, row 0 at position
    `first`, sinks (H,) or None → (B, H, r, D): block_softmax.cpp. Refuses a block outside 0 … ⌈m/block⌉ − 1 with a
    sentence."""
    B, H, r, D, Hk, m, S, nb = _sizes(q, k, blocks)
    out = q.new_empty(B, H, r, D)
    if out.numel() == 0:
        return out
    if nb == 0 or m == 0:
        return out.zero_()
    low, high = torch.aminmax(blocks)
    if int(low) < 0 or int(high) >= -(-m // block):
        raise ValueError(f"selected blocks must lie in 0 … {-(-m // block) - 1} ({m} keys in blocks of {block}), "
                         f"got {int(low)} … {int(high)}")
    blocks = blocks.contiguous()
    q, qb, qh = _rows_of(q.detach())
    k, kb, kh = _rows_of(k.detach())
    v, vb, vh = _rows_of(v.detach())
    tile, threads, floats, ints = _block_sizes(B, H, r, Hk, nb, m, block)
    scratch = q.new_empty(threads * floats)
    lists = torch.empty(threads * ints, dtype=torch.int64)
    lib = _kernels()
    fn = lib.attn_block_softmax_f64 if q.dtype == torch.float64 else lib.attn_block_softmax_f32
    logits = None if sinks is None else sinks.detach().to(q.dtype).contiguous()
    fn(q.data_ptr(), qb, qh, k.data_ptr(), kb, kh, v.data_ptr(), vb, vh, blocks.data_ptr(), B, H, r, D, Hk, S, nb, m,
       block, first, tile, D ** -0.5, None if logits is None else logits.data_ptr(), threads, scratch.data_ptr(),
       lists.data_ptr(), out.data_ptr())
    return out


_shaped_like_queries(_block_softmax_op, "block_softmax")


def block_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: torch.Tensor, block: int, first: int,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
    """softmax over the keys of each query's selected blocks, Σ p_s·v_s (block_softmax.cpp, the op
    attn_lab::block_softmax): q (B, H, r, D), k and v (B, Hk, m, D) of one CPU float dtype (`softmax_runs`), blocks
    (B, S, r, nb) int64 with S = 1 or Hk, any order (a block listed twice counts twice) → (B, H, r, D). Query row t
    sits at position first + t and reads, of each listed block j, the keys j·block … j·block + block − 1 at or
    before it and before m: NSA's selection branch with no position or flag a key. A row with no key outputs zeros,
    one with a NaN or +inf score NaN. Each block's keys are read once for every row (and query head) that chose it,
    four rows a step. Holds the output and, a thread, 4·block scores, each row's running state and its task's lists
    (`block_scratch_bytes`). Refuses, with a sentence, a block outside the keys. No backward. `sinks` (H,): head h's
    logit a_h joins each row's denominator with no value (gpt-oss's attention sinks)."""
    B, H, r, D = q.shape
    Hk, m = k.shape[1], k.shape[2]
    S = blocks.shape[1] if blocks.dim() == 4 else 0
    _refuse_unless(library() is not None and S in (1, Hk) and H % Hk == 0 and blocks.shape[::2] == (B, r)
                   and k.shape == (B, Hk, m, D) and v.shape == k.shape and blocks.dtype == torch.int64
                   and q.dtype in FLOATS and k.dtype == v.dtype == q.dtype and block >= 1 and first >= 0
                   and all(t.device.type == "cpu" for t in (q, k, v, blocks))
                   and (sinks is None or (sinks.shape == (H,) and sinks.device.type == "cpu"
                                          and sinks.is_floating_point())),
                   "block_softmax needs a library, CPU tensors, q (B, H, r, D), k and v (B, Hk, m, D) of q's "
                   "float32 or float64, blocks (B, 1 or Hk, r, nb) int64, a block of at least one key and a first "
                   "position of at least 0",
                   f"q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} {v.dtype}, "
                   f"blocks {tuple(blocks.shape)} {blocks.dtype}, block {block}, first {first}")
    return torch.ops.attn_lab.block_softmax(q, k, v, blocks, block, first, sinks)


def block_scratch_bytes(B: int, H: int, r: int, Hk: int, nb: int, m: int, block: int, elem: int = 4) -> int:
    """Bytes of `block_softmax`'s scratch, for each of its threads (one a task at most, `block_tile`): 4·block scores
    and 3 numbers a row and query head of its task's tile (of `elem` bytes), and the task's lists (int64): where each
    of the ⌈m/block⌉ blocks' rows end, and the tile's nb entries a row."""
    _, threads, floats, ints = _block_sizes(B, H, r, Hk, nb, m, block)
    return threads * (floats * elem + ints * 8)


# ---- index_scores: top-k's indexer --------------------------------------------------------------------------------

@torch.library.custom_op("attn_lab::index_scores", mutates_args=(), device_types="cpu")
def _index_op(qi: torch.Tensor, kt: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """qi (B, r, IH·dI) float32, kt (B, dI, m), w (IH,) → (B, r, m) float32: index.cpp."""
    B, r, width = qi.shape
    heads, m = w.shape[0], kt.shape[2]
    out = torch.empty(B, r, m)
    if out.numel() == 0:
        return out
    if qi.stride(2) != 1 or qi.stride(1) != width:
        qi = qi.contiguous()
    kt, w = kt.to(torch.float32), w.to(torch.float32).contiguous()
    if kt.stride(2) != 1:
        kt = kt.contiguous()
    threads = _threads(B * -(-r // 2))
    _kernels().attn_index_scores_f32(qi.data_ptr(), qi.stride(0), kt.data_ptr(), kt.stride(0), kt.stride(1),
                                     w.data_ptr(), B, r, m, heads, width // heads, threads, out.data_ptr())
    return out


@_index_op.register_fake
def _(qi, kt, w):
    return qi.new_empty(qi.shape[0], qi.shape[1], kt.shape[2], dtype=torch.float32)


_index_op.register_autograd(_no_backward("index_scores"))


def index_runs(qi: torch.Tensor) -> bool:
    """Whether `index_scores` takes these indexer queries: float32 on the CPU, and a library built with AVX-512 or
    AVX2 and FMA."""
    if qi.device.type != "cpu" or qi.dtype != torch.float32:
        return False
    lib = library()
    return lib is not None and bool(lib.attn_index_available())


def index_scores(qi: torch.Tensor, kt: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """I_{t,s} = Σ_j w_j · ReLU(q^I_{t,j} · k^I_s) (index.cpp, the op attn_lab::index_scores): qi (B, r, IH·dI)
    float32 CPU (`index_runs`), kt the indexer keys transposed (B, dI, m; a view of the first m of longer rows is read
    in place), w (IH,) → (B, r, m), float32. Two query rows, four heads and 32 keys at a time in registers (two, two
    and 24 with AVX2), the ReLU (NaN kept, as torch.relu keeps it) and weighted sum in them: nothing beside the scores
    but each thread's block of keys, packed (128 KiB). Refuses mismatched shapes with a sentence."""
    lib = library()
    _refuse_unless(lib is not None and bool(lib.attn_index_available()) and qi.dim() == 3 and w.dim() == 1
                   and kt.dim() == 3 and kt.shape[0] == qi.shape[0] and w.shape[0] * kt.shape[1] == qi.shape[2]
                   and qi.dtype == torch.float32 and kt.is_floating_point() and w.is_floating_point()
                   and all(t.device.type == "cpu" for t in (qi, kt, w)),
                   "index_scores needs a library built with AVX-512 or AVX2, CPU float32 queries (B, r, IH·dI), keys "
                   "(B, dI, m) and weights (IH,)", f"{tuple(qi.shape)} {qi.dtype}, {tuple(kt.shape)}, {tuple(w.shape)}")
    return torch.ops.attn_lab.index_scores(qi, kt, w)


# ---- elu_plus_one: linear attention's feature map ----------------------------------------------------------------

ELU_PIECE = 1 << 14  # elu_plus_one.cpp's numbers a task (PIECE)


def rows_of_numbers(x: torch.Tensor) -> tuple[int, int, int] | None:
    """(rows, stride between rows, numbers a row) when x is rows of contiguous numbers evenly apart (a contiguous
    tensor: one row; a slice of positions of (B, H, n, D): B·H rows of its positions·D numbers, n·D apart), else
    None."""
    if x.numel() == 0:
        return None
    dims = [(size, stride) for size, stride in zip(x.shape, x.stride()) if size != 1]
    width = 1
    while dims and dims[-1][1] == width:  # the trailing dimensions laid end to end
        width *= dims.pop()[0]
    if not dims:
        return 1, width, width
    rows, step = dims.pop()
    while dims and dims[-1][1] == step * rows:  # the leading ones must merge into one evenly spaced dimension
        rows *= dims.pop()[0]
    return (rows, step, width) if not dims and step >= width else None


def _elu_layout(x: torch.Tensor, out: torch.Tensor) -> tuple[int, int, int, int] | None:
    """(rows, x's stride between them, numbers a row, out's stride) where x and out are the same rows of contiguous
    numbers (`rows_of_numbers`; a contiguous one takes the other's rows), else None."""
    a, b = rows_of_numbers(x), rows_of_numbers(out)
    if a is None or b is None:
        return None
    if a[0] == 1 and b[0] != 1:
        a = (b[0], b[2], b[2])
    elif b[0] == 1 and a[0] != 1:
        b = (a[0], a[2], a[2])
    return (a[0], a[1], a[2], b[1]) if (a[0], a[2]) == (b[0], b[2]) else None


@torch.library.custom_op("attn_lab::elu_plus_one", mutates_args=("out",), device_types="cpu")
def _elu_op(x: torch.Tensor, out: torch.Tensor) -> None:
    """out ← elu(x) + 1, x and out float32 of one shape, the same rows of contiguous numbers (`_elu_layout`), out
    possibly x itself: elu_plus_one.cpp."""
    if x.numel():
        layout = _elu_layout(x, out)
        if layout is None:
            raise ValueError(f"elu_plus_one reads and writes rows of contiguous numbers; got x of strides "
                             f"{x.stride()} and out of strides {out.stride()} (shape {tuple(x.shape)})")
        rows, x_row, width, out_row = layout
        threads = _threads(rows * -(-width // ELU_PIECE))
        _kernels().attn_elu_plus_one_f32(x.data_ptr(), rows, x_row, width, out_row, threads, out.data_ptr())


def elu_runs(x: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether `elu_plus_one` takes x into out: float32 CPU tensors of one shape, each contiguous or the same rows of
    contiguous numbers (`rows_of_numbers`: a slice of positions of every head), no gradient wanted through x, and a
    library built with AVX-512, or AVX2 with FMA (a scalar loop would be slower than torch's five passes)."""
    if not (x.device.type == out.device.type == "cpu" and x.dtype == out.dtype == torch.float32
            and x.shape == out.shape):
        return False
    if torch.is_grad_enabled() and (x.requires_grad or out.requires_grad):
        return False
    if x.numel() and _elu_layout(x, out) is None:
        return False
    return elu_expected()


def elu_plus_one(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out ← φ(x) = elu(x) + 1 = e^min(x, 0) + (x − min(x, 0)), in one pass (elu_plus_one.cpp, the op
    attn_lab::elu_plus_one), and out returned: x and out float32 CPU tensors of one shape, each contiguous or a slice
    of positions of every head, read and written where they lie (`elu_runs`; out may be x). NaN and −inf give NaN,
    +inf gives +inf. Holds nothing beside them. No backward. Refuses, with a sentence, what `elu_runs` does not
    take."""
    _refuse_unless(elu_runs(x, out), "elu_plus_one needs a library built with AVX-512 or AVX2, and float32 CPU "
                   "tensors x and out of one shape, each contiguous or a slice of positions, that want no gradient",
                   f"x {tuple(x.shape)} {x.dtype} on {x.device} (strides {x.stride()}), out {tuple(out.shape)} "
                   f"{out.dtype} on {out.device} (strides {out.stride()})")
    torch.ops.attn_lab.elu_plus_one(x.detach(), out)
    return out


# ---- prefix_sums: the sums of the steps before each one ------------------------------------------------------------

PREFIX_SPAN = 1024  # prefix.cpp's columns a task (SPAN)


@torch.library.custom_op("attn_lab::prefix_sums", mutates_args=(), device_types="cpu")
def _prefix_op(x: torch.Tensor) -> torch.Tensor:
    """x (outer, steps, inner) float32 or float64 → out of its shape, out[:, s] = Σ_{t < s} x[:, t]: prefix.cpp."""
    x = x.contiguous()
    out = torch.empty_like(x)
    outer, steps, inner = x.shape
    if out.numel():
        lib = _kernels()
        fn = lib.attn_prefix_f64 if x.dtype == torch.float64 else lib.attn_prefix_f32
        fn(x.data_ptr(), outer, steps, inner, _threads(outer * -(-inner // PREFIX_SPAN)), out.data_ptr())
    return out


@_prefix_op.register_fake
def _(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


_prefix_op.register_autograd(_no_backward("prefix_sums"))


def prefix_runs(x: torch.Tensor) -> bool:
    """Whether `prefix_sums` takes x: a contiguous float32 or float64 CPU tensor that wants no gradient, and a
    library."""
    return x.device.type == "cpu" and x.dtype in FLOATS and x.is_contiguous() and x.dim() >= 1 \
        and not (torch.is_grad_enabled() and x.requires_grad) and library() is not None


def prefix_sums(x: torch.Tensor, dim: int) -> torch.Tensor:
    """The exclusive prefix sums of x along `dim`: out.select(dim, s) = Σ_{t < s} x.select(dim, t), 0 at s = 0
    (prefix.cpp, the op attn_lab::prefix_sums), a new contiguous tensor of x's shape: x contiguous float32 or float64
    on the CPU (`prefix_runs`). Summed in double, step by step (torch.cumsum's order and precision for float32); a
    stretch of 1,024 columns a task, so a step is one vectorised add. Holds nothing beside x and out. No backward.
    Refuses, with a sentence, what `prefix_runs` does not take."""
    _refuse_unless(prefix_runs(x) and -x.dim() <= dim < x.dim(),
                   "prefix_sums needs a library, a contiguous float32 or float64 CPU tensor that wants no gradient, "
                   "and one of its dimensions",
                   f"{tuple(x.shape)} {x.dtype} on {x.device}{'' if x.is_contiguous() else ', not contiguous'}, "
                   f"dim {dim}")
    dim %= x.dim()
    shaped = x.detach().reshape(math.prod(x.shape[:dim]), x.shape[dim], math.prod(x.shape[dim + 1:]))
    return torch.ops.attn_lab.prefix_sums(shaped).view(x.shape)


# ---- band: banded attention, every block in one call --------------------------------------------------------------

BAND_LANES = 16  # band.cpp's AVX-512 vector: head widths it takes are a multiple of it


def band_rows(block: int) -> int:
    """The block's rows rounded up to what band.cpp's score steps take (two vectors of BAND_LANES): its transposed
    bias and scratch are this wide."""
    return -(-block // (2 * BAND_LANES)) * 2 * BAND_LANES


def band_scratch_bytes(D: int, span: int, block: int, tasks: int) -> int:
    """Bytes of `band`'s scratch: (D + span + 1) rows of band_rows(block) float32 numbers for each of its threads
    (min(torch.get_num_threads(), tasks)): a block's queries transposed, its scores transposed, its rows' sums."""
    return _threads(tasks) * (D + span + 1) * band_rows(block) * 4


def band_runs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether `band` takes these: float32 CPU tensors whose head width AVX-512's 16 lanes divide, no gradient wanted
    through them, and a library built with its AVX-512 form (AVX2 machines keep the flash kernel: band.cpp)."""
    wanted = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if wanted or q.shape[-1] % BAND_LANES or not all(t.device.type == "cpu" and t.dtype == torch.float32
                                                     for t in (q, k, v)):
        return False
    return band_expected()


@torch.library.custom_op("attn_lab::band", mutates_args=("out",), device_types="cpu")
def _band_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias_t: torch.Tensor, out: torch.Tensor, block: int,
             left: int) -> None:
    """out ← every query block's softmax attention over its window: band.cpp."""
    B, H, n, D = q.shape
    span = bias_t.shape[0]
    q, qb, qh = _rows_of(q.detach())
    k, kb, kh = _rows_of(k.detach())
    v, vb, vh = _rows_of(v.detach())
    tasks = B * H * -(-n // block)
    threads, bp = _threads(tasks), band_rows(block)
    scratch = torch.empty(band_scratch_bytes(D, span, block, tasks) // 4, dtype=torch.float32)
    _kernels().attn_band_f32(q.data_ptr(), qb, qh, k.data_ptr(), kb, kh, v.data_ptr(), vb, vh, bias_t.data_ptr(),
                             B, H, k.shape[1], n, D, block, left, span, bp, D ** -0.5, threads, scratch.data_ptr(),
                             out.data_ptr())


_band_op.register_fake(lambda *args: None)  # it writes `out` and returns nothing (so no autograd formula: `band_runs`
# refuses tensors that want gradients)


def band(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias_t: torch.Tensor, out: torch.Tensor, block: int,
         left: int) -> None:
    """Banded attention (band.cpp, the op attn_lab::band), written into `out`: query block β's `block` rows, from
    β·block (the last block what is left of n), see the S keys from β·block − left, each block with the same additive
    bias, given transposed and zero-padded: bias_t (S, band_rows(block)); at the ends of the sequence only the keys
    inside [0, n) count. q (B, H, n, D), k and v (B, Hk, n, D), float32 on the CPU (`band_runs`), out (B, H, n, D)
    contiguous. O(n·S·D) time; beside the output, a thread's scratch (`band_scratch_bytes`). Refuses what it would
    misread with a sentence."""
    B, H, n, D = q.shape
    span = bias_t.shape[0]
    _refuse_unless(band_runs(q, k, v) and k.shape == v.shape and k.dim() == 4 and k.shape[0] == B
                   and k.shape[2] == n and k.shape[3] == D and H % k.shape[1] == 0
                   and out.shape == q.shape and out.is_contiguous() and out.dtype == torch.float32
                   and bias_t.dtype == torch.float32 and bias_t.is_contiguous()
                   and tuple(bias_t.shape) == (span, band_rows(block)) and block >= 1 and left >= 0
                   and span >= left + block,
                   "band needs a library with its AVX-512 form, float32 CPU q (B, H, n, D) with D a multiple of 16, "
                   "k and v (B, Hk, n, D), a contiguous float32 output like q, and a bias (S, band_rows(block)) whose "
                   "window of S keys from left before each block holds the block's own",
                   f"q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)}, out {tuple(out.shape)}, bias "
                   f"{tuple(bias_t.shape)}, blocks of {block}, left {left}")
    torch.ops.attn_lab.band(q, k, v, bias_t, out, block, left)


# ---- linear: linear attention (φ = elu + 1), causal and not, fused ------------------------------------------------

LINEAR_ROWS, LINEAR_TASK_ROWS = 64, 256  # linear.cpp's rows a step (ROWS) and queries a task of pass 2 (TASK_ROWS)
LINEAR_TILES = {16: (6, 4), 8: (4, 2)}  # linear.cpp's (TILE, CV) by its lanes: rows, and vectors of columns, a tile


def linear_streams(out: torch.Tensor) -> bool:
    """Whether linear.cpp writes the output past the caches (non-temporal stores: no read of each line before it is
    written): where it fills half the last-level cache or more, so it would not stay there. B = 1, H = 8, D = 64 on
    the 2-core Xeon (32 MiB taken as its last level), 9–15 interleaved rounds: n = 8192 5.56 against 5.70 ms, 16384
    11.4 against 11.9, 32768 22.8 against 24.4; at 2048 and 4096 (4 and 8 MiB) within the spread. Only into an output
    that starts on a 64-byte line (a view at another offset is written the usual way)."""
    from ..mechanisms._cpu import caches  # (not at import: the mechanisms import this package)
    return out.numel() * out.element_size() * 2 >= caches().shared and out.data_ptr() % 64 == 0  # (whole lines)


def linear_parts(bk: int, nk: int) -> int:
    """Shares of each of the B·Hk key/value heads' keys in linear.cpp's first pass: enough tasks for two a thread
    (a thread that another program slows then holds up a smaller share), at most one a step of keys."""
    return max(1, min(-(-2 * torch.get_num_threads() // bk), -(-nk // LINEAR_ROWS)))


def linear_scratch_bytes(bk: int, bh: int, nq: int, nk: int, D: int, causal: bool = False) -> int:
    """Bytes of `linear`'s scratch. Not causal: each share's state and key sum, D·(D + 1) float32 numbers
    (`linear_parts`), and for each of its threads (min(torch.get_num_threads(), tasks of pass 2)) a step's φ and
    normalizers, LINEAR_ROWS·(D + 1). Causal, for each thread (min(torch.get_num_threads(), B·Hk)): a block's φ(K),
    its transpose and φ(Q) (LINEAR_ROWS·D each), the in-block products (LINEAR_ROWS²), their row sums and the
    normalizers, and the state carried (D·(D + 1))."""
    c = LINEAR_ROWS
    if causal:
        return _threads(bk) * (3 * c * D + c * c + 2 * c + D * (D + 1)) * 4
    threads = _threads(bh * -(-nq // LINEAR_TASK_ROWS))
    return (bk * linear_parts(bk, nk) * D * (D + 1) + threads * c * (D + 1)) * 4


def linear_runs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> bool:
    """Whether `linear` takes these: float32 CPU (B, heads, n, D) tensors whose head width the vector's lanes divide
    (`linear_lanes`: 16 with AVX-512, 8 with AVX2), each position's numbers contiguous (read where they lie, heads
    split from (B, n, H·D) too: never copied), no gradient wanted through them, and a library built with a vector
    form (linear.cpp). Causal also: as many queries as keys, and at least as many key/value heads B·Hk as torch's
    threads (each runs its positions in order, a head a thread: with fewer, threads would wait, where the torch
    form's segments split the positions too)."""
    wanted = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if wanted or not all(t.device.type == "cpu" and t.dtype == torch.float32 and t.dim() == 4 and t.stride(-1) == 1
                         for t in (q, k, v)):
        return False  # read where they lie: a position whose numbers are not contiguous keeps the torch form
    if causal and (q.shape[2] != k.shape[2] or k.shape[0] * k.shape[1] < torch.get_num_threads()):
        return False
    lanes = linear_lanes()
    return lanes > 0 and q.shape[-1] % lanes == 0


@torch.library.custom_op("attn_lab::linear", mutates_args=("scratch", "out"), device_types="cpu")
def _linear_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scratch: torch.Tensor, out: torch.Tensor,
               causal: bool) -> None:
    """out ← elu + 1 linear attention (causal or not): linear.cpp; scratch[0] ← how many normalizers and state
    numbers it found NaN or infinite."""
    B, H, nq, D = q.shape
    Hk, nk = k.shape[1], k.shape[2]
    q, k, v = (x.detach() if x.stride(-1) == 1 else x.detach().contiguous() for x in (q, k, v))  # (linear_runs)
    strided = (q.data_ptr(), *q.stride()[:3], k.data_ptr(), *k.stride()[:3], v.data_ptr(), *v.stride()[:3])
    if causal:
        bad = _kernels().attn_linear_causal_f32(*strided, B, H, Hk, nq, D, int(linear_streams(out)),
                                                _threads(B * Hk), scratch.data_ptr(), out.data_ptr())
    else:
        bad = _kernels().attn_linear_f32(*strided, B, H, Hk, nq, nk, D, linear_parts(B * Hk, nk),
                                         int(linear_streams(out)), _threads(B * H * -(-nq // LINEAR_TASK_ROWS)),
                                         scratch.data_ptr(), out.data_ptr())
    scratch[0].fill_(float(bad))


_linear_op.register_fake(lambda *args: None)  # it writes `scratch` and `out` and returns nothing (so no autograd
# formula: `linear_runs` refuses tensors that want gradients)


def linear(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, causal: bool = False) -> bool:
    """Linear attention with φ = elu + 1 (linear.cpp, the op attn_lab::linear), written into `out`:
    out_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ / φ(q_i)ᵀ Σ_j φ(k_j), j over all keys (causal: j ≤ i), 0 where that normalizer
    is below the smallest normal number. q (B, H, Nq, D), k and v (B, Hk, Nk, D), float32 on the CPU (`linear_runs`),
    out (B, H, Nq, D) contiguous. O(n·D²) time (causal: O(n·D·(D + C)), blocks of C = LINEAR_ROWS), q, k and v read
    once; beside the output, `linear_scratch_bytes`. Returns whether a normalizer or a sum over keys is NaN or
    infinite (a non-finite input, or sums that overflow). Refuses, with a sentence, what the kernel would misread."""
    B, H, nq, D = q.shape
    _refuse_unless(linear_runs(q, k, v, causal) and k.dim() == 4 and k.shape == v.shape and k.shape[0] == B
                   and k.shape[3] == D and k.shape[1] >= 1 and H % k.shape[1] == 0 and k.shape[2] >= 1
                   and out.shape == q.shape and out.is_contiguous() and out.dtype == torch.float32,
                   f"linear needs a library with a vector form, float32 CPU q (B, H, Nq, D) with D a multiple of "
                   f"{linear_lanes() or 16}, k and v (B, Hk, Nk, D) with Hk dividing H and at least one key (causal: "
                   f"as many as queries, and B·Hk at least torch's threads), and a contiguous float32 output like q",
                   f"q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)}, v {tuple(v.shape)}, out {tuple(out.shape)}"
                   f"{', causal' if causal else ''}")
    Hk, nk = k.shape[1], k.shape[2]
    scratch = torch.empty(linear_scratch_bytes(B * Hk, B * H, nq, nk, D, causal) // 4, dtype=torch.float32)
    torch.ops.attn_lab.linear(q, k, v, scratch, out, causal)
    return scratch[0].item() != 0

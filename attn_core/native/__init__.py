"""Kernels of our own in C++, for the CPU steps torch has no one op for, registered as torch operators
(torch.library custom ops in the namespace attn_lab, each with a fake implementation giving its outputs' shapes, so
that torch.compile traces around them and torch.library.opcheck checks them). Each runs beside the torch form it
replaces, which is what runs where no library is built (no compiler, a failed build, not built yet,
ATTN_LAB_NATIVE=0), and `describe` names which ran.

    select(scores, kk)                           the kk highest scores of each row, exactly (select.cpp;
                                                 topk.select's CPU form)
    selected_softmax(q, k, v, idx, usable)       softmax over each query's selected keys, fused (selected_softmax.cpp;
                                                 _sparse.selected_softmax's CPU form without gradients)
    block_softmax(q, k, v, blocks, block, first) softmax over each query's selected blocks of keys, a block's keys
                                                 read once for all the rows that chose it (block_softmax.cpp;
                                                 _sparse.block_softmax's CPU form without gradients: NSA)
    index_scores(qi, kt, w)                      top-k's indexer, fused (index.cpp; topk.index_scores's CPU form,
                                                 float32 on machines with AVX-512 or AVX2)
    elu_plus_one(x, out)                         linear attention's φ = elu + 1 in one pass (elu_plus_one.cpp;
                                                 _linear_core.phi_into's CPU form, float32 with AVX-512 or AVX2)
    prefix_sums(x, dim)                          the sums of the steps before each one along a dimension (prefix.cpp;
                                                 causal linear attention's block states, where torch has cumsum)
    band(q, k, v, bias_t, out, block, left)      banded attention, every block in one call, written in place
                                                 (band.cpp; _banded's fused path on the CPU, float32 without
                                                 gradients, AVX-512)
    linear(q, k, v, out, causal)                 linear attention (φ = elu + 1), fused: q, k and v read once
                                                 (linear.cpp; _linear_core's whole form on the CPU, float32
                                                 without gradients, AVX-512 or AVX2)

The ops take no gradient: a backward through one raises a sentence, and the callers send calls that want gradients
to the torch forms. Each wrapper refuses, with a sentence, what its kernel would misread (a device, a dtype, a shape,
a position outside the keys) before it passes a pointer.

The build is explicit (`build`: `python -m attn_core native build`, the dashboard's worker at start-up); a forward
call never builds, it loads a library already built into the cache, else runs the torch form. `$CXX`, else c++, g++
or clang++, with -O3, -march=native (this machine's vector units: the cache key holds the CPU's flags) and -fopenmp
(rows split among torch.get_num_threads() threads; on Linux the library shares the libgomp that torch loaded), each
dropped in turn where the compiler refuses it; each source is compiled by a compiler of its own, all at once, each
in a session of its own, all killed whole at the time limit, then linked. Every exported function is declared once,
in signatures.py: the build writes signatures.h from it for the .cpp files (the compiler refuses a definition that
differs), ctypes takes its argument lists from it, and the library carries the table's hash, checked at load (a
library built from other declarations is refused). The cache
(cache.py): a per-user folder made 0700, its owner and mode checked and each library's, symbolic links refused;
where none is safe, a private folder made for the process.

The package's modules: toolchain (compiler, flags, compile, load), loader (the switch and the one library a process
holds: build, library, describe), ops (the torch operators and their wrappers), cache and signatures.
"""
from __future__ import annotations

from .cache import CACHE
from .loader import (BUILD_HINT, OFF, ON, SWITCH, band_expected, build, describe, elu_expected, enabled, expected,
                     index_expected, library, linear_expected, linear_lanes)
from .ops import (BAND_LANES, FLOATS, LINEAR_ROWS, LINEAR_TILES, band, band_rows, band_runs, band_scratch_bytes,
                  block_scratch_bytes, block_softmax, elu_plus_one, elu_runs, index_runs, index_scores, linear,
                  linear_parts, linear_runs, linear_scratch_bytes, part_bytes, part_keys, prefix_runs, prefix_sums,
                  runs, scratch_bytes, select, selected_softmax, softmax_runs, softmax_scratch_bytes)
from .toolchain import BUILD_SECONDS, FLAGS, HERE, SOURCES, TRIES, Stale, compiler, targets

__all__ = ["BAND_LANES", "BUILD_HINT", "BUILD_SECONDS", "CACHE", "FLAGS", "FLOATS", "HERE", "LINEAR_ROWS",
           "LINEAR_TILES", "OFF", "ON", "SOURCES", "SWITCH", "TRIES", "Stale", "band", "band_expected", "band_rows",
           "band_runs", "band_scratch_bytes", "block_scratch_bytes", "block_softmax", "build", "compiler", "describe",
           "elu_expected", "elu_plus_one", "elu_runs", "enabled", "expected", "index_expected", "index_runs",
           "index_scores", "library", "linear", "linear_expected", "linear_lanes", "linear_parts", "linear_runs",
           "linear_scratch_bytes", "part_bytes", "part_keys", "prefix_runs", "prefix_sums", "runs", "scratch_bytes",
           "select", "selected_softmax", "softmax_runs", "softmax_scratch_bytes", "targets"]

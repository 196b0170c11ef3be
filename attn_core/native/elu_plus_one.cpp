// Linear attention's feature map φ(x) = elu(x) + 1 in one pass: attn_core.mechanisms._linear_core.phi_into's form
// for the CPU, float32.
//
// φ(x) = e^min(x, 0) + (x − min(x, 0)): x + 1 for x > 0, eˣ otherwise. The torch form takes five passes over the
// tensor (clamp, subtract, scale, exp2, add), each reading and writing all of it; here each element is read once and
// written once, e^m by vector.h's polynomial (0 below −87.3, where float32's eˣ is no longer normal). NaN gives NaN;
// −inf gives NaN (−inf − (−inf)) and +inf gives +inf, as the torch form gives them, so the sums over keys and the
// normalizers still show a non-finite input. At n = 8192, 8 heads, D = 64 (4 Mi numbers) this took the causal call
// from 52.6 to 44.3 ms on the 2-core EPYC. x and out are rows of `width` contiguous numbers, `x_row` and `out_row`
// apart: a chunk of positions of every head (B·H rows of chunk·D numbers, n·D apart) is read where it lies, without
// a copy. Each row is cut into pieces of PIECE numbers (64 KiB), taken by the threads as they come free (dynamic),
// so a thread another program slows takes fewer of them. Tested against elu + 1 in float64
// (tests/native/test_native_elu.py).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "signatures.h"  // each exported function's one declaration (written by the build)
#if defined(_OPENMP)
#include <omp.h>
#endif
#include "vector.h"  // the float32 vector and its e^x, for each instruction set

namespace {

constexpr int64_t PIECE = 1 << 14;  // numbers a task: 64 KiB in and out, within a core's own cache

inline float elu_plus_one(float x) {
  const float m = std::min(x, 0.0f);  // NaN stays NaN (std::min returns its first argument unless the second is less)
  return std::exp(m) + (x - m);
}

}  // namespace

extern "C" {

int64_t attn_elu_plus_one_available() {
#if defined(ATTN_VECTOR)
  return 1;
#else
  return 0;  // no vector form: torch's five vectorised passes are faster than a scalar loop
#endif
}

void attn_elu_plus_one_f32(const float* x, int64_t rows, int64_t x_row, int64_t width, int64_t out_row,
                           int64_t threads, float* out) {
  const int64_t per_row = (width + PIECE - 1) / PIECE, pieces = rows * per_row;
#pragma omp parallel for num_threads(static_cast<int>(threads)) schedule(dynamic, 1)
  for (int64_t p = 0; p < pieces; ++p) {
    const int64_t row = p / per_row, start = (p % per_row) * PIECE, stop = std::min(width, start + PIECE);
    const float* xr = x + row * x_row;
    float* orow = out + row * out_row;
    int64_t i = start;
#if defined(ATTN_VECTOR)
    for (; i + LANES <= stop; i += LANES) vstore(orow + i, vphi(vload(xr + i)));
#endif
    for (; i < stop; ++i) orow[i] = elu_plus_one(xr[i]);
  }
  (void)threads;
}

}  // extern "C"

// Exclusive prefix sums along the middle dimension: attn_core.mechanisms._linear_core's sums of the block states
// before each block (causal linear attention), for the CPU, float32 and float64.
//
// out[o, s, i] = Σ_{t < s} x[o, t, i] for x of (outer, steps, inner), out[o, 0, :] = 0. torch's cumsum along a middle
// dimension walks it element by element: 3.6 ms for the 128 block states of 8 heads at n = 8192, D = 64 (17 MB),
// where copying them takes 0.9 ms. Here a task takes one o and a stretch of SPAN columns and walks the steps, each
// step one vectorised add over the stretch, in double (as torch's cumsum accumulates a float32 tensor): 1.1–1.2 ms.
// Tasks go to the threads as they come free (dynamic), so a thread another program slows takes fewer.
// Tested against torch.cumsum less each step's own (tests/native/test_native_prefix.py).
#include <algorithm>
#include <cstdint>

#include "signatures.h"  // each exported function's one declaration (written by the build)
#if defined(_OPENMP)
#include <omp.h>
#endif

namespace {

constexpr int64_t SPAN = 1024;  // columns a task: its running sums (8 KiB of double) stay in the core's L1

template <typename F>
void prefix(const F* x, int64_t outer, int64_t steps, int64_t inner, int64_t threads, F* out) {
  const int64_t spans = (inner + SPAN - 1) / SPAN;
#pragma omp parallel for num_threads(static_cast<int>(threads)) schedule(dynamic, 1)
  for (int64_t task = 0; task < outer * spans; ++task) {
    const int64_t o = task / spans, a = (task % spans) * SPAN, width = std::min(inner, a + SPAN) - a;
    const F* xs = x + o * steps * inner + a;
    F* os = out + o * steps * inner + a;
    double acc[SPAN];
    for (int64_t i = 0; i < width; ++i) acc[i] = 0, os[i] = 0;
    for (int64_t s = 1; s < steps; ++s) {
      const F* prev = xs + (s - 1) * inner;
      F* row = os + s * inner;
#pragma omp simd
      for (int64_t i = 0; i < width; ++i) {
        acc[i] += static_cast<double>(prev[i]);
        row[i] = static_cast<F>(acc[i]);
      }
    }
  }
  (void)threads;
}

}  // namespace

extern "C" {

void attn_prefix_f32(const float* x, int64_t outer, int64_t steps, int64_t inner, int64_t threads, float* out) {
  prefix(x, outer, steps, inner, threads, out);
}

void attn_prefix_f64(const double* x, int64_t outer, int64_t steps, int64_t inner, int64_t threads, double* out) {
  prefix(x, outer, steps, inner, threads, out);
}

}  // extern "C"

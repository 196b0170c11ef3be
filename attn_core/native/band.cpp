// Banded attention, every block in one call: attn_core.mechanisms._banded's fused path (PyTorch's flash kernel, called
// on the interior blocks and on each end) for float32 on the CPU (the sliding window, block-local, Longformer's band).
//
// Query block β (rows β·block …, `block` of them, the last block what is left) of head h sees the `span` keys from
// β·block − left of its key/value head h / (H / Hk), every block with the same additive bias (block, span) (the pattern
// is invariant under shifts by the block); at the ends of the sequence, only the window's keys inside [0, n), so that
// one call takes every block and no ends are left for other calls. Per task (a batch element, a head and a block): the
// block's queries transposed into a thread's scratch (D × bp, bp the rows rounded up to two vectors), then the scores
// transposed, Sᵀ = K Qᵀ·scale + biasᵀ (span × bp): each key's numbers broadcast against the query vectors, six keys by
// two vectors of rows in registers, so that neither keys nor values are ever transposed or packed. The softmax runs
// down Sᵀ's columns, a vector of rows at a time (the highest score, e^(s − highest) by vector.h's vexp, the sum), and
// the output O = P V four rows by four vectors of columns, each row over its sum, written into the output in place. The
// flash kernel runs the same block as tiles of 32 rows against 512 keys with its matrix products called per tile; at a
// window of 256 (288 keys a block of 32) those products are small. A row with a NaN or +inf score outputs NaN, as
// softmax gives it; the bias is finite (a masked cell's floor), so no row lacks a highest score.
// Float32 with AVX-512 only (attn_band_available); elsewhere the flash kernel runs. On the 2-core Xeon, the interior
// of the sliding window (256, causal) at n = 16384, B = 1, H = 8, D = 64: 44.6 ms against the flash kernel's 52.9
// (9 interleaved calls). Built for AVX2 (-march=haswell, five keys by two vectors and two rows by four in AVX2's 16
// registers), on the same machine with torch's kernels held to AVX2 too (ATEN_CPU_CAPABILITY=avx2), it took 77.8 ms
// against the flash kernel's 59.2: a form that keeps the FMA units busy gains nothing where they are half as wide,
// so AVX2 machines keep the flash kernel. Tested against attention written in float64
// (tests/native/test_native_band.py).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "signatures.h"  // each exported function's one declaration (written by the build)
#include "vector.h"  // the float32 vector and its e^x, for each instruction set

namespace {

#if defined(__AVX512F__)
#define ATTN_BAND 1
constexpr int KEYS = 6;  // keys a step of the scores (by two vectors of rows)
constexpr int ROWS = 4;  // rows a step of the output (by four vectors of columns)
constexpr int RV = 2;  // vectors of rows a step of the scores
constexpr int CV = 4;  // vectors of columns a step of the output

// Sᵀ rows j0 … j0 + nk − 1, row vectors v0 … v0 + RV − 1: the keys' numbers broadcast against Qᵀ's vectors
template <int NK>
inline void score_tile(const float* K, int64_t D, const float* qt, int64_t bp, int64_t j0, int64_t v0, float scale,
                       const float* bt, float* st) {
  vec acc[NK][RV];
  for (int a = 0; a < NK; ++a)
    for (int b = 0; b < RV; ++b) acc[a][b] = vset(0.0f);
  const float* kr = K + j0 * D;
  for (int64_t d = 0; d < D; ++d) {
    const vec q0 = vload(qt + d * bp + v0 * LANES), q1 = vload(qt + d * bp + (v0 + 1) * LANES);
    for (int a = 0; a < NK; ++a) {
      const vec kb = vset(kr[a * D + d]);
      acc[a][0] = vfmadd(kb, q0, acc[a][0]);
      acc[a][1] = vfmadd(kb, q1, acc[a][1]);
    }
  }
  const vec vs = vset(scale);
  for (int a = 0; a < NK; ++a)
    for (int b = 0; b < RV; ++b) {
      const int64_t at = (j0 + a) * bp + (v0 + b) * LANES;
      vstore(st + at, vfmadd(acc[a][b], vs, vload(bt + at)));
    }
}

// rows i0 … i0 + NR − 1 of the output, column vectors c0 … c0 + nc − 1: Σ_j pᵀ[j][i] V[j], over each row's sum
template <int NR>
inline void output_tile(const float* V, int64_t D, const float* st, int64_t bp, int64_t span, int64_t i0, int64_t c0,
                        int nc, const float* inv, float* out) {
  vec acc[NR][CV];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < CV; ++c) acc[r][c] = vset(0.0f);
  for (int64_t j = 0; j < span; ++j) {
    const float* vr = V + j * D + c0 * LANES;
    const float* pr = st + j * bp + i0;
    vec vv[CV];
    for (int c = 0; c < CV; ++c) vv[c] = c < nc ? vload(vr + c * LANES) : vset(0.0f);
    for (int r = 0; r < NR; ++r) {
      const vec p = vset(pr[r]);
      for (int c = 0; c < CV; ++c) acc[r][c] = vfmadd(p, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < NR; ++r) {
    const vec w = vset(inv[i0 + r]);
    for (int c = 0; c < nc; ++c) vstore(out + (i0 + r) * D + (c0 + c) * LANES, vmul(acc[r][c], w));
  }
}

// one task: the block's `rows` queries Q (rows of D) against `span` keys K and values V (rows of D), the transposed
// bias bt (span × bp), into out (rows of D); scratch: qt (D × bp), st (span × bp), inv (bp)
void block_task(const float* Q, const float* K, const float* V, const float* bt, int64_t rows, int64_t span,
                int64_t D, int64_t bp, float scale, float* qt, float* st, float* inv, float* out) {
  for (int64_t d = 0; d < D; ++d) {
    float* row = qt + d * bp;
    for (int64_t i = 0; i < rows; ++i) row[i] = Q[i * D + d];
    for (int64_t i = rows; i < bp; ++i) row[i] = 0.0f;
  }
  const int64_t vecs = bp / LANES;
  for (int64_t v0 = 0; v0 < vecs; v0 += RV) {  // bp is a multiple of RV·LANES
    int64_t j0 = 0;
    for (; j0 + KEYS <= span; j0 += KEYS) score_tile<KEYS>(K, D, qt, bp, j0, v0, scale, bt, st);
    for (; j0 < span; ++j0) score_tile<1>(K, D, qt, bp, j0, v0, scale, bt, st);
  }
  // softmax down each column of Sᵀ, a vector of rows at a time
  for (int64_t v0 = 0; v0 < vecs; ++v0) {
    float* col = st + v0 * LANES;
    vec top = vset(-std::numeric_limits<float>::infinity()), bad = vset(0.0f);
    for (int64_t j = 0; j < span; ++j) {
      const vec s = vload(col + j * bp);
      top = vmax(s, top);  // a NaN score leaves top as it was: `bad` marks its row
      bad = vmax(bad, vbad(s));
    }
    vec sum = vset(0.0f);
    for (int64_t j = 0; j < span; ++j) {
      const vec e = vexp(vsub(vload(col + j * bp), top));
      vstore(col + j * bp, e);
      sum = vadd(sum, e);
    }
    float sums[LANES], worst[LANES];
    vstore(sums, sum);
    vstore(worst, bad);
    for (int u = 0; u < LANES; ++u)
      inv[v0 * LANES + u] = worst[u] != 0.0f ? std::numeric_limits<float>::quiet_NaN() : 1.0f / sums[u];
  }
  for (int64_t c0 = 0; c0 < D / LANES; c0 += CV) {
    const int nc = static_cast<int>(std::min<int64_t>(CV, D / LANES - c0));
    int64_t i0 = 0;
    for (; i0 + ROWS <= rows; i0 += ROWS) output_tile<ROWS>(V, D, st, bp, span, i0, c0, nc, inv, out);
    for (; i0 < rows; ++i0) output_tile<1>(V, D, st, bp, span, i0, c0, nc, inv, out);
  }
}
#endif

}  // namespace

extern "C" {

// 1 where this build has the band kernel (AVX-512), 0 where the caller runs the flash kernel
int64_t attn_band_available() {
#if defined(ATTN_BAND)
  return 1;
#else
  return 0;
#endif
}

// q (B, H, n, D) with its batch and head strides, rows of D; k, v (B, Hk, n, D) likewise; bt: the bias transposed,
// span × bp (bp: block rounded up to RV·LANES, zero past the block); every block β of ⌈n / block⌉: its rows from
// β·block (the last may have fewer), its window of keys from β·block − left, cut at [0, n) (the keys outside are
// never read, nor counted in the softmax); D a multiple of LANES; scratch: threads · (D + span + 1) · bp;
// out (B, H, n, D) contiguous
void attn_band_f32(const float* q, int64_t q_batch, int64_t q_head, const float* k, int64_t k_batch, int64_t k_head,
                   const float* v, int64_t v_batch, int64_t v_head, const float* bt, int64_t B, int64_t H, int64_t Hk,
                   int64_t n, int64_t D, int64_t block, int64_t left, int64_t span, int64_t bp, float scale,
                   int64_t threads, float* scratch, float* out) {
#if defined(ATTN_BAND)
  const int64_t g = H / Hk, c = (n + block - 1) / block, tasks = B * H * c, each = (D + span + 1) * bp;
#pragma omp parallel num_threads(static_cast<int>(threads))
  {
    float* mine = thread_slice(scratch, each);
#pragma omp for schedule(dynamic, 4)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / (H * c), h = task / c % H, row = task % c * block;
      const int64_t rows = std::min(block, n - row), key = row - left;
      const int64_t j0 = std::max<int64_t>(0, -key), j1 = std::min(span, n - key);  // the window's keys in [0, n)
      block_task(q + b * q_batch + h * q_head + row * D, k + b * k_batch + (h / g) * k_head + (key + j0) * D,
                 v + b * v_batch + (h / g) * v_head + (key + j0) * D, bt + j0 * bp, rows, j1 - j0, D, bp, scale,
                 mine, mine + D * bp, mine + (D + span) * bp, out + ((b * H + h) * n + row) * D);
    }
  }
#else
  (void)q, (void)q_batch, (void)q_head, (void)k, (void)k_batch, (void)k_head, (void)v, (void)v_batch, (void)v_head;
  (void)bt, (void)B, (void)H, (void)Hk, (void)n, (void)D, (void)block, (void)left, (void)span, (void)bp;
  (void)scale, (void)threads, (void)scratch, (void)out;  // never called: attn_band_available says 0
#endif
}

}  // extern "C"

// Top-k's lightning indexer, fused: attn_core.mechanisms.topk.index_scores's form for the CPU, float32.
//
// I[t, s] = Σ_j w_j · ReLU(q_{t,j} · k_s) for each query row t (its IH indexer heads' vectors of dI, laid head after
// head) and key s, with the keys given transposed (kT: dI rows of m, so that 16 keys' values of one coordinate are one
// vector). Two query rows, four heads and 32 keys at a time: 16 accumulators, each key vector loaded once for 8
// multiply-adds, each query coordinate broadcast; then ReLU and the weighted sum over the heads in registers, and
// one store of 32 scores a row. torch's form runs a product of every head and row with a tile of keys, then the ReLU
// and the weighted sum as further passes (2.6 times this kernel's time at n = 16384, IH = 4, dI = 32).
//
// Rows are split among OpenMP threads two at a time. The keys' tail (m not a multiple of 32) is read and written by
// masked loads and stores. Tested against the formula written with einsum (tests/test_native.py).
#include <cstdint>

#include "signatures.h"  // each exported function's one declaration (written by the build)
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

#if defined(__AVX512F__)
// heads h0 … h0 + NH − 1 of R query rows (q[i]: row i's vectors) against keys s0 … s0 + 31 (lanes past m masked
// off by k0m, k1m), their ReLU weighted and added into o[2·i], o[2·i + 1]
template <int R, int NH>
inline void heads(const float* const* q, const float* kT, int64_t ks, int64_t s0, int64_t dI, int64_t h0,
                  const float* w, __mmask16 k0m, __mmask16 k1m, __m512* o) {
  __m512 a[R][NH][2];
  for (int i = 0; i < R; ++i)
    for (int h = 0; h < NH; ++h) a[i][h][0] = a[i][h][1] = _mm512_setzero_ps();
  for (int64_t d = 0; d < dI; ++d) {
    const float* kr = kT + d * ks + s0;
    const __m512 k0 = _mm512_maskz_loadu_ps(k0m, kr), k1 = _mm512_maskz_loadu_ps(k1m, kr + 16);
    for (int i = 0; i < R; ++i)
      for (int h = 0; h < NH; ++h) {
        const __m512 qb = _mm512_set1_ps(q[i][(h0 + h) * dI + d]);
        a[i][h][0] = _mm512_fmadd_ps(qb, k0, a[i][h][0]);
        a[i][h][1] = _mm512_fmadd_ps(qb, k1, a[i][h][1]);
      }
  }
  // ReLU as max(0, x): where either operand is NaN, vmaxps returns its second, so a NaN product stays NaN (as
  // torch.relu keeps it); max(x, 0) would turn it into 0 and give a finite, different selection
  const __m512 zero = _mm512_setzero_ps();
  for (int i = 0; i < R; ++i)
    for (int h = 0; h < NH; ++h) {
      const __m512 wb = _mm512_set1_ps(w[h0 + h]);
      o[2 * i] = _mm512_fmadd_ps(wb, _mm512_max_ps(zero, a[i][h][0]), o[2 * i]);
      o[2 * i + 1] = _mm512_fmadd_ps(wb, _mm512_max_ps(zero, a[i][h][1]), o[2 * i + 1]);
    }
}

// R query rows (q[i], their outputs out[i], rows of m) against every key (kT: dI rows of m, ks apart)
template <int R>
void rows(const float* const* q, const float* kT, int64_t ks, const float* w, int64_t m, int64_t IH, int64_t dI,
          float* const* out) {
  for (int64_t s0 = 0; s0 < m; s0 += 32) {
    const int64_t left = m - s0;
    const auto lanes = [](int64_t n) {  // the first n of 16 lanes
      return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
    };
    const __mmask16 k0m = lanes(left), k1m = lanes(left - 16);
    __m512 o[2 * R];
    for (int i = 0; i < 2 * R; ++i) o[i] = _mm512_setzero_ps();
    int64_t h0 = 0;
    for (; h0 + 4 <= IH; h0 += 4) heads<R, 4>(q, kT, ks, s0, dI, h0, w, k0m, k1m, o);
    switch (IH - h0) {
      case 3: heads<R, 3>(q, kT, ks, s0, dI, h0, w, k0m, k1m, o); break;
      case 2: heads<R, 2>(q, kT, ks, s0, dI, h0, w, k0m, k1m, o); break;
      case 1: heads<R, 1>(q, kT, ks, s0, dI, h0, w, k0m, k1m, o); break;
      default: break;
    }
    for (int i = 0; i < R; ++i) {
      _mm512_mask_storeu_ps(out[i] + s0, k0m, o[2 * i]);
      _mm512_mask_storeu_ps(out[i] + s0 + 16, k1m, o[2 * i + 1]);
    }
  }
}
#endif

}  // namespace

extern "C" {

// 1 where this build has the fused indexer (AVX-512), 0 where the caller runs torch's form
int64_t attn_index_available() {
#if defined(__AVX512F__)
  return 1;
#else
  return 0;
#endif
}

// qi: B batches of r rows of IH·dI (row stride IH·dI, batch stride qb); kT: B batches (kb apart) of dI rows of m
// keys (ks apart, unit stride along the keys); w (IH); out (B, r, m) contiguous
void attn_index_scores_f32(const float* qi, int64_t qb, const float* kT, int64_t kb, int64_t ks, const float* w,
                           int64_t B, int64_t r, int64_t m, int64_t IH, int64_t dI, int64_t threads, float* out) {
#if defined(__AVX512F__)
  const int64_t pairs = (r + 1) / 2;
#pragma omp parallel for schedule(static) num_threads(static_cast<int>(threads))
  for (int64_t p = 0; p < B * pairs; ++p) {
    const int64_t b = p / pairs, t = 2 * (p % pairs);
    const float* base = qi + b * qb;
    const float* keys = kT + b * kb;
    float* ob = out + (b * r) * m;
    if (t + 1 < r) {
      const float* q[2] = {base + t * IH * dI, base + (t + 1) * IH * dI};
      float* o[2] = {ob + t * m, ob + (t + 1) * m};
      rows<2>(q, keys, ks, w, m, IH, dI, o);
    } else {
      const float* q[1] = {base + t * IH * dI};
      float* o[1] = {ob + t * m};
      rows<1>(q, keys, ks, w, m, IH, dI, o);
    }
  }
#else
  (void)qi, (void)qb, (void)kT, (void)kb, (void)ks, (void)w, (void)B, (void)r, (void)m, (void)IH, (void)dI;
  (void)threads, (void)out;  // never called: attn_index_available says 0
#endif
}

}  // extern "C"

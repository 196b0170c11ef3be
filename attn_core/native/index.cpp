// Top-k's lightning indexer, fused: attn_core.mechanisms.topk.index_scores's form for the CPU, float32.
//
// I[t, s] = Σ_j w_j · ReLU(q_{t,j} · k_s) for each query row t (its IH indexer heads' vectors of dI, laid head after
// head) and key s, with the keys given transposed (kT: dI rows of m, so that a vector's keys' values of one
// coordinate are contiguous). With AVX-512: two query rows, four heads and 32 keys at a time, 16 accumulators, each
// key vector loaded once for 8 multiply-adds; with AVX2 and FMA: two rows, two heads and 24 keys, 12 accumulators
// (half the registers). Each query coordinate is broadcast; then ReLU and the weighted sum over the heads in
// registers, and one store of the step's scores a row. torch's form runs a product of every head and row with a tile
// of keys, then the ReLU and the weighted sum as further passes (2.6 times this kernel's time at n = 16384, IH = 4,
// dI = 32, on a CPU with AVX-512).
//
// Rows are split among OpenMP threads two at a time; each thread goes through the keys a block at a time (128 KiB,
// packed: see pack), every one of its row pairs against the block. The keys' tail (m not a multiple of the step) is
// read and written by masked loads and stores. Tested against the formula written with einsum (tests/native/test_native.py).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "signatures.h"  // each exported function's one declaration (written by the build)
#if defined(_OPENMP)
#include <omp.h>
#endif
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#define ATTN_INDEX 1  // the fused indexer: AVX-512 (16 lanes) or AVX2 with FMA (8 lanes)
#endif

namespace {

#if defined(ATTN_INDEX)
// The float32 vector, its lane mask and the few operations the kernel uses, for each instruction set; one code
// over them. HEADS: indexer heads a pass, so that R·HEADS·2 accumulators, two key vectors and a broadcast fit the
// registers (32 with AVX-512, 16 with AVX2).
#if defined(__AVX512F__)
using vec = __m512;
using lanemask = __mmask16;
constexpr int LANES = 16, HEADS = 4, KV = 2;
#define ATTN_V(op) _mm512_##op
inline vec vload(lanemask k, const float* p) { return _mm512_maskz_loadu_ps(k, p); }
inline void vstore(lanemask k, float* p, vec x) { _mm512_mask_storeu_ps(p, k, x); }
inline lanemask first(int64_t n) {  // the first n lanes
  return n >= LANES ? lanemask(0xFFFF) : n <= 0 ? lanemask(0) : lanemask((1u << n) - 1);
}
#else  // AVX2 and FMA (the AMD EPYC this was measured on has no AVX-512)
using vec = __m256;
using lanemask = __m256i;  // a lane is on where its sign bit is set
constexpr int LANES = 8, HEADS = 2, KV = 3;
#define ATTN_V(op) _mm256_##op
inline vec vload(lanemask k, const float* p) { return _mm256_maskload_ps(p, k); }
inline void vstore(lanemask k, float* p, vec x) { _mm256_maskstore_ps(p, k, x); }
inline lanemask first(int64_t n) {  // the first n lanes: lane i on where i < n
  const int c = n >= LANES ? LANES : n <= 0 ? 0 : static_cast<int>(n);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif
inline vec vzero() { return ATTN_V(setzero_ps)(); }
inline vec vset(float x) { return ATTN_V(set1_ps)(x); }
inline vec vfmadd(vec a, vec b, vec c) { return ATTN_V(fmadd_ps)(a, b, c); }
inline vec vmax(vec a, vec b) { return ATTN_V(max_ps)(a, b); }
inline vec vload(const float* p) { return ATTN_V(loadu_ps)(p); }
inline void vstore(float* p, vec x) { ATTN_V(storeu_ps)(p, x); }
#undef ATTN_V
constexpr int KEYS = KV * LANES;  // keys a step: KV vectors
// bytes of keys a block (see attn_index_scores_f32): a quarter of the smallest L2 of the CPUs measured (512 KiB)
constexpr int64_t BLOCK_BYTES = 128 * 1024;

// heads h0 … h0 + NH − 1 of R query rows (q[i]: row i's vectors) against one step's KEYS keys (kp: dI rows of KEYS,
// packed), their ReLU weighted and added into o[KV·i] … o[KV·i + KV − 1]
template <int R, int NH>
inline void heads(const float* const* q, const float* kp, int64_t dI, int64_t h0, const float* w, vec* o) {
  vec a[R][NH][KV];
  for (int i = 0; i < R; ++i)
    for (int h = 0; h < NH; ++h)
      for (int v = 0; v < KV; ++v) a[i][h][v] = vzero();
  for (int64_t d = 0; d < dI; ++d) {
    vec k[KV];
    for (int v = 0; v < KV; ++v) k[v] = vload(kp + d * KEYS + v * LANES);
    for (int i = 0; i < R; ++i)
      for (int h = 0; h < NH; ++h) {
        const vec qb = vset(q[i][(h0 + h) * dI + d]);
        for (int v = 0; v < KV; ++v) a[i][h][v] = vfmadd(qb, k[v], a[i][h][v]);
      }
  }
  // ReLU as max(0, x): where either operand is NaN, vmaxps returns its second, so a NaN product stays NaN (as
  // torch.relu keeps it); max(x, 0) would turn it into 0 and give a finite, different selection
  const vec zero = vzero();
  for (int i = 0; i < R; ++i)
    for (int h = 0; h < NH; ++h) {
      const vec wb = vset(w[h0 + h]);
      for (int v = 0; v < KV; ++v) o[KV * i + v] = vfmadd(wb, vmax(zero, a[i][h][v]), o[KV * i + v]);
    }
}

// heads h0 … h0 + n − 1 (n < HEADS) of R rows, as heads<R, n>
template <int R, int NH = HEADS - 1>
inline void few(int64_t n, const float* const* q, const float* kp, int64_t dI, int64_t h0, const float* w, vec* o) {
  if constexpr (NH > 0) {
    if (n == NH) return heads<R, NH>(q, kp, dI, h0, w, o);
    few<R, NH - 1>(n, q, kp, dI, h0, w, o);
  }
}

// keys from … to − 1 (kT: dI rows, ks apart) packed step by step: each step's dI rows of KEYS contiguous, the lanes
// past `to` zero: a step's rows then lie in consecutive memory, not m floats apart (at m = 16384, in one L1 set), and
// a block is read from the thread's own copy by each of its row pairs.
void pack(const float* kT, int64_t ks, int64_t from, int64_t to, int64_t dI, float* kp) {
  for (int64_t s0 = from; s0 < to; s0 += KEYS, kp += dI * KEYS)
    for (int v = 0; v < KV; ++v) {
      const lanemask km = first(to - s0 - v * LANES);
      for (int64_t d = 0; d < dI; ++d) vstore(kp + d * KEYS + v * LANES, vload(km, kT + d * ks + s0 + v * LANES));
    }
}

// R query rows (q[i], their outputs out[i], rows of m) against keys from … to − 1, packed in kp
template <int R>
void rows(const float* const* q, const float* kp, const float* w, int64_t from, int64_t to, int64_t IH, int64_t dI,
          float* const* out) {
  for (int64_t s0 = from; s0 < to; s0 += KEYS, kp += dI * KEYS) {
    vec o[KV * R];
    for (int i = 0; i < KV * R; ++i) o[i] = vzero();
    int64_t h0 = 0;
    for (; h0 + HEADS <= IH; h0 += HEADS) heads<R, HEADS>(q, kp, dI, h0, w, o);
    few<R>(IH - h0, q, kp, dI, h0, w, o);
    for (int v = 0; v < KV; ++v) {
      const lanemask km = first(to - s0 - v * LANES);
      for (int i = 0; i < R; ++i) vstore(km, out[i] + s0 + v * LANES, o[KV * i + v]);
    }
  }
}
#endif

}  // namespace

extern "C" {

// 1 where this build has the fused indexer (AVX-512, or AVX2 with FMA), 0 where the caller runs torch's form
int64_t attn_index_available() {
#if defined(ATTN_INDEX)
  return 1;
#else
  return 0;
#endif
}

// qi: B batches of r rows of IH·dI (row stride IH·dI, batch stride qb); kT: B batches (kb apart) of dI rows of m
// keys (ks apart, unit stride along the keys); w (IH); out (B, r, m) contiguous
void attn_index_scores_f32(const float* qi, int64_t qb, const float* kT, int64_t kb, int64_t ks, const float* w,
                           int64_t B, int64_t r, int64_t m, int64_t IH, int64_t dI, int64_t threads, float* out) {
#if defined(ATTN_INDEX)
  const int64_t pairs = (r + 1) / 2, all = B * pairs;
  // keys a block: their dI rows fill BLOCK_BYTES, so that a block, packed (see pack), stays in the core's L2 while
  // each of the thread's row pairs passes over it
  const int64_t block = std::max<int64_t>(KEYS, BLOCK_BYTES / (dI * 4) / KEYS * KEYS);
#pragma omp parallel num_threads(static_cast<int>(threads))
  {
    int64_t T = 1, me = 0;
#if defined(_OPENMP)
    T = omp_get_num_threads(), me = omp_get_thread_num();
#endif
    const int64_t lo = all * me / T, hi = all * (me + 1) / T;  // this thread's pairs
    std::vector<float> kp(static_cast<size_t>((block + KEYS - 1) / KEYS * KEYS * dI));
    for (int64_t from = 0; from < m; from += block) {
      const int64_t to = std::min(m, from + block);
      int64_t packed = -1;  // the batch whose keys kp holds
      for (int64_t p = lo; p < hi; ++p) {
        const int64_t b = p / pairs, t = 2 * (p % pairs);
        if (b != packed) pack(kT + b * kb, ks, from, to, dI, kp.data()), packed = b;
        const float* base = qi + b * qb;
        float* ob = out + (b * r) * m;
        if (t + 1 < r) {
          const float* q[2] = {base + t * IH * dI, base + (t + 1) * IH * dI};
          float* o[2] = {ob + t * m, ob + (t + 1) * m};
          rows<2>(q, kp.data(), w, from, to, IH, dI, o);
        } else {
          const float* q[1] = {base + t * IH * dI};
          float* o[1] = {ob + t * m};
          rows<1>(q, kp.data(), w, from, to, IH, dI, o);
        }
      }
    }
  }
#else
  (void)qi, (void)qb, (void)kT, (void)kb, (void)ks, (void)w, (void)B, (void)r, (void)m, (void)IH, (void)dI;
  (void)threads, (void)out;  // never called: attn_index_available says 0
#endif
}

}  // extern "C"

// The float32 vector the kernels share (selected_softmax.cpp, block_softmax.cpp, elu_plus_one.cpp): its lanes and
// the few operations they use, for each instruction set, one code over them; a vector e^x and exp_less. Included,
// never compiled alone.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#if defined(_OPENMP)
#include <omp.h>
#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#define ATTN_VECTOR 1  // the kernels' vector forms: AVX-512 (16 lanes) or AVX2 with FMA (8 lanes)
#endif

namespace {

// The float32 vector, its lanes and the few operations the kernel uses, for each instruction set; one code over them.
#if defined(__AVX512F__)
using vec = __m512;
constexpr int LANES = 16;
#define ATTN_V(op) _mm512_##op
inline float vsum(vec x) { return _mm512_reduce_add_ps(x); }
inline vec vround(vec x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline vec vtimes_2n(vec p, vec n) { return _mm512_scalef_ps(p, n); }  // p·2^n
inline vec vzero_below(vec y, vec x, vec floor) {  // y, 0 where x < floor
  return _mm512_maskz_mov_ps(__mmask16(~_mm512_cmp_ps_mask(x, floor, _CMP_LT_OQ)), y);
}
// lane u: the sum of x[u]'s lanes, for 16 vectors at once: halves of 256 bits, then of 128 (across vectors, so each
// step halves the vectors), then within 128-bit lanes, and one permutation into key order; about 3 operations a
// key where a reduction of its own takes 8 and waits on each
inline vec vsums(const vec* x) {
  vec v[8], w[4];
  for (int i = 0; i < 8; ++i)  // [a0+a2, a1+a3, b0+b2, b1+b3] in 128-bit parts, a = x[2i], b = x[2i + 1]
    v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // 128-bit part c: four partial sums of x[4i + c]
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xDD));
  const vec p0 = _mm512_add_ps(_mm512_unpacklo_ps(w[0], w[1]), _mm512_unpackhi_ps(w[0], w[1]));
  const vec p1 = _mm512_add_ps(_mm512_unpacklo_ps(w[2], w[3]), _mm512_unpackhi_ps(w[2], w[3]));
  const __m512d d0 = _mm512_castps_pd(p0), d1 = _mm512_castps_pd(p1);
  const vec s = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(d0, d1)),
                              _mm512_castpd_ps(_mm512_unpackhi_pd(d0, d1)));  // lane 4c + i: x[4i + c]'s sum
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), s);
}
// lanes whose flag (16 bools at `ok`) is false set to `to`
inline vec vunless(vec x, const bool* ok, vec to) {
  const __m512i flags = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ok)));
  return _mm512_mask_mov_ps(x, _mm512_cmpeq_epi32_mask(flags, _mm512_setzero_si512()), to);
}
inline __mmask16 vbad_lanes(vec x) {  // the lanes that are NaN or +inf
  const vec inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  return _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(x, inf, _CMP_EQ_OQ);
}
inline bool vany_bad(vec x) { return vbad_lanes(x) != 0; }  // a NaN or +inf lane
inline vec vbad(vec x) { return _mm512_maskz_mov_ps(vbad_lanes(x), _mm512_set1_ps(1.0f)); }  // 1 there, 0 elsewhere
inline float vmax_lanes(vec x) { return _mm512_reduce_max_ps(x); }
#define ATTN_KEYS_AT_ONCE 1  // vsums: 16 keys' scores reduced in one step
#elif defined(ATTN_VECTOR)  // AVX2 and FMA (the AMD EPYC this was measured on has no AVX-512)
using vec = __m256;
constexpr int LANES = 8;
#define ATTN_V(op) _mm256_##op
inline float vsum(vec x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline vec vround(vec x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline vec vtimes_2n(vec p, vec n) {  // p·2^n, 2^n made in the exponent's bits (n ≥ −126 here: a normal number)
  return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(
                              _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23)));
}
inline vec vzero_below(vec y, vec x, vec floor) { return _mm256_andnot_ps(_mm256_cmp_ps(x, floor, _CMP_LT_OQ), y); }
inline vec vset_inf() { return _mm256_set1_ps(std::numeric_limits<float>::infinity()); }
// lane u: the sum of x[u]'s lanes, for 8 vectors at once (three rounds of pairwise sums, then the two halves added):
// a key's score costs an eighth of this instead of a whole reduction of its own
inline vec vsums(const vec* x) {
  const vec t0 = _mm256_hadd_ps(x[0], x[1]), t1 = _mm256_hadd_ps(x[2], x[3]);
  const vec t2 = _mm256_hadd_ps(x[4], x[5]), t3 = _mm256_hadd_ps(x[6], x[7]);
  const vec u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}
// lanes whose flag (8 bools at `ok`) is false set to `to`
inline vec vunless(vec x, const bool* ok, vec to) {
  const __m256i flags = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(ok)));
  return _mm256_blendv_ps(x, to, _mm256_castsi256_ps(_mm256_cmpeq_epi32(flags, _mm256_setzero_si256())));
}
inline vec vbad_lanes(vec x) {  // all bits set in the lanes that are NaN or +inf
  return _mm256_or_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q), _mm256_cmp_ps(x, vset_inf(), _CMP_EQ_OQ));
}
inline bool vany_bad(vec x) { return _mm256_movemask_ps(vbad_lanes(x)) != 0; }  // a NaN or +inf lane
inline vec vbad(vec x) { return _mm256_and_ps(vbad_lanes(x), _mm256_set1_ps(1.0f)); }  // 1 there, 0 elsewhere
inline float vmax_lanes(vec x) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
#define ATTN_KEYS_AT_ONCE 1  // vsums: 8 keys' scores reduced in one step
#endif

#if defined(ATTN_VECTOR)
inline vec vload(const float* p) { return ATTN_V(loadu_ps)(p); }
inline void vstore(float* p, vec x) { ATTN_V(storeu_ps)(p, x); }
inline vec vset(float x) { return ATTN_V(set1_ps)(x); }
inline vec vadd(vec a, vec b) { return ATTN_V(add_ps)(a, b); }
inline vec vsub(vec a, vec b) { return ATTN_V(sub_ps)(a, b); }
inline vec vmul(vec a, vec b) { return ATTN_V(mul_ps)(a, b); }
inline vec vfmadd(vec a, vec b, vec c) { return ATTN_V(fmadd_ps)(a, b, c); }
inline vec vfnmadd(vec a, vec b, vec c) { return ATTN_V(fnmadd_ps)(a, b, c); }
inline vec vmin(vec a, vec b) { return ATTN_V(min_ps)(a, b); }  // b where a is NaN
inline vec vmax(vec a, vec b) { return ATTN_V(max_ps)(a, b); }  // b where a is NaN
inline void vstream(float* p, vec x) { ATTN_V(stream_ps)(p, x); }  // past the caches; p aligned to the vector

// e^x for x <= 0 (scores less their row's highest); 0 below −87.34, where float32's e^x is no longer normal
inline vec vexp(vec x) {
  const vec floor = vset(-87.33654f);
  const vec xf = ATTN_V(max_ps)(x, floor);
  const vec n = vround(vmul(xf, vset(1.44269504088896341f)));
  vec r = vfnmadd(n, vset(0.693359375f), xf);  // x − n·ln 2, ln 2 in two parts
  r = vfnmadd(n, vset(-2.12194440e-4f), r);
  vec p = vset(1.9875691500e-4f);
  p = vfmadd(p, r, vset(1.3981999507e-3f));
  p = vfmadd(p, r, vset(8.3334519073e-3f));
  p = vfmadd(p, r, vset(4.1665795894e-2f));
  p = vfmadd(p, r, vset(1.6666665459e-1f));
  p = vfmadd(p, r, vset(5.0000001201e-1f));
  p = vfmadd(p, vmul(r, r), vadd(r, vset(1.0f)));
  return vzero_below(vtimes_2n(p, n), x, floor);
}

// linear attention's feature map φ(x) = elu(x) + 1 = e^min(x, 0) + (x − min(x, 0)): NaN and −inf give NaN (min
// returns 0 for a NaN lane, then x − 0 is NaN; −inf − (−inf) is NaN), +inf gives +inf
inline vec vphi(vec x) {
  const vec m = vmin(x, vset(0.0f));
  return vadd(vexp(m), vsub(x, m));
}
#undef ATTN_V
#endif

#if defined(ATTN_VECTOR)
// sc[0, n) ← e^(sc − top) (top: their highest, or higher), returning their sum
inline float exp_less(float* sc, int64_t n, float top) {
  const vec vt = vset(top);
  vec acc = vset(0.0f);
  int64_t j = 0;
  for (; j + LANES <= n; j += LANES) {
    const vec e = vexp(vsub(vload(sc + j), vt));
    vstore(sc + j, e);
    acc = vadd(acc, e);
  }
  float total = vsum(acc);
  for (; j < n; ++j) total += (sc[j] = std::exp(sc[j] - top));
  return total;
}
#endif

#if defined(ATTN_VECTOR)
// out[u] ← the sum of x[u]'s lanes, u = 0 … 7 (8 products' partial sums reduced together)
inline void sums8(const vec* x, float* out) {
#if defined(__AVX512F__)  // vsums of 16, the last 8 zero
  vec y[16];
  for (int u = 0; u < 16; ++u) y[u] = u < 8 ? x[u] : _mm512_setzero_ps();
  _mm256_storeu_ps(out, _mm512_castps512_ps256(vsums(y)));
#elif defined(ATTN_KEYS_AT_ONCE)
  vstore(out, vsums(x));
#else
  for (int u = 0; u < 8; ++u) out[u] = vsum(x[u]);
#endif
}
#endif

constexpr float NEG32 = -std::numeric_limits<float>::infinity();

// the calling OpenMP thread's slice of `each` numbers of a scratch buffer that holds one slice a thread
template <typename F>
inline F* thread_slice(F* scratch, int64_t each) {
#if defined(_OPENMP)
  return scratch + omp_get_thread_num() * each;
#else
  (void)each;
  return scratch;
#endif
}

}  // namespace

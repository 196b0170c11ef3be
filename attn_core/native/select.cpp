// The top kk scores of each row, exactly, a row at a time: attn_core.mechanisms.topk.select's form for the CPU.
//
// For each row of m scores (float32 or float64), the indices of its kk highest scores in increasing order, ties at
// the threshold going to the earlier keys, and a flag per index: its score is above -inf. A NaN ranks below -inf and
// is never usable (topk.select sends rows that may hold NaN to its exact torch form, which ranks NaN highest); every
// row gets exactly kk indices within it, whatever the input. The same
// selection as topk._select_exact (a top-k over the whole row); written apart from it, tested against it and against
// a stable sort (tests/test_native.py).
//
// How, without a sort or a top-k over the row. Scores become unsigned keys that order as the scores do (-0 and +0
// one key, as they compare equal). The kk-th highest key is found by counting: how many keys are at or above t is one
// vectorised pass, and t moves by interpolation between two counts that bracket kk (bisection where that gains less
// than a halving) until exactly kk keys are at or above it (the least of them is the kk-th) or the bracket holds one
// value. On long rows (4·kk <= m) every STRIDE-th key is searched first for two ranks a few standard deviations
// either side of its share of kk; one pass over the row then counts the keys above the upper bound and copies those
// between the bounds, and the search runs on that band alone (about a tenth of the row at kk = m / 8). A last pass
// writes the indices.
//
// The band's pass and the last one are vectorised with AVX-512 (compress instructions) or AVX2 (a permutation
// table for both); elsewhere they are plain loops.
// O(m) a row: at m = 16384, kk = 2048, about 13 µs a row on one core of a 2.6 GHz AMD EPYC (AVX-512); on an AVX2 EPYC,
// 1,024 rows of indexer-like scores in 24 ms with 2 threads against 55 ms with the plain loops. There the indices
// had been written a set bit at a time, a branch that mispredicts wherever an eighth of the scores pass; written
// through the band's permutation table instead, one thread's 1,024 rows took 26–28 ms against 41–49 (fastest of 7).
// Rows are split among `threads` OpenMP threads (the process's libgomp: torch's, where torch brought it). No
// allocation: the caller passes each thread's scratch.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "signatures.h"  // each exported function's one declaration (written by the build)
#if defined(_OPENMP)
#include <omp.h>
#endif
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t STRIDE = 8;  // every 8th key is the sample

template <typename F> struct Key;
template <> struct Key<float> { using type = uint32_t; };
template <> struct Key<double> { using type = uint64_t; };

// the bits of +inf of the float type whose key type is K: exponent all ones, mantissa zero
template <typename K>
constexpr K inf_bits() {
  return sizeof(K) == 4 ? K(0x7F800000u) : K(0x7FF0000000000000ull);
}

// a key that orders as v does: sign bit flipped for v >= 0, every bit flipped for v < 0; -0 taken as +0; a NaN
// (outside the contract) the lowest key of all, below -inf, so that counts and indices stay consistent whatever comes
template <typename F>
inline typename Key<F>::type order_key(F v) {
  using K = typename Key<F>::type;
  constexpr K sign = K(1) << (8 * sizeof(K) - 1);
  const K inf = inf_bits<K>();
  K u;
  std::memcpy(&u, &v, sizeof u);
  if (K(u & ~sign) > inf) return K(0);
  u = (u << 1) == 0 ? K(0) : u;
  return (u & sign) ? K(~u) : K(u | sign);
}

// the number whose key is x (x a number's key)
template <typename F>
inline F from_key(typename Key<F>::type x) {
  using K = typename Key<F>::type;
  constexpr K sign = K(1) << (8 * sizeof(K) - 1);
  const K u = (x & sign) ? K(x & ~sign) : K(~x);
  F v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

#if defined(__AVX512F__)
// order_key of 16 float32 scores
inline __m512i keys16(const float* p) {
  const __m512i sign = _mm512_set1_epi32(int(0x80000000u)), magnitude = _mm512_set1_epi32(0x7FFFFFFF);
  __m512i u = _mm512_loadu_si512(p);
  u = _mm512_maskz_mov_epi32(_mm512_test_epi32_mask(u, magnitude), u);  // -0 → +0
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, magnitude), _mm512_set1_epi32(0x7F800000));
  const __mmask16 neg = _mm512_test_epi32_mask(u, sign);
  const __m512i x = _mm512_mask_xor_epi32(_mm512_or_si512(u, sign), neg, u, _mm512_set1_epi32(-1));
  return _mm512_maskz_mov_epi32(__mmask16(~nan), x);
}
#elif defined(__AVX2__)
// order_key of 8 float32 scores (as keys16: -0 → +0, a NaN → 0)
inline __m256i keys8(const float* p) {
  const __m256i sign = _mm256_set1_epi32(int(0x80000000u)), magnitude = _mm256_set1_epi32(0x7FFFFFFF);
  __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i size = _mm256_and_si256(u, magnitude);
  u = _mm256_andnot_si256(_mm256_cmpeq_epi32(size, _mm256_setzero_si256()), u);  // -0 → +0
  const __m256i nan = _mm256_cmpgt_epi32(size, _mm256_set1_epi32(0x7F800000));
  const __m256i x = _mm256_xor_si256(_mm256_or_si256(u, sign), _mm256_srai_epi32(u, 31));  // u | sign, or ~u
  return _mm256_andnot_si256(nan, x);
}

// the lanes of x whose bit of `mask` is set, moved to the front (AVX2 has no compress: a permutation per mask,
// 256 of them, made once)
struct Compress8 {
  alignas(32) int32_t order[256][8];
  Compress8() {
    for (int mask = 0; mask < 256; ++mask) {
      int j = 0;
      for (int lane = 0; lane < 8; ++lane)
        if (mask >> lane & 1) order[mask][j++] = lane;
      for (; j < 8; ++j) order[mask][j] = 0;
    }
  }
};
const Compress8 COMPRESS8;

inline __m256i compress8(__m256i x, int mask) {
  return _mm256_permutevar8x32_epi32(x, _mm256_load_si256(reinterpret_cast<const __m256i*>(COMPRESS8.order[mask])));
}

// x >= t for unsigned 32-bit lanes: all ones where it holds
inline __m256i at_or_above(__m256i x, __m256i t) { return _mm256_cmpeq_epi32(_mm256_max_epu32(x, t), x); }
#endif

template <typename K>
inline int64_t at_least(const K* key, int64_t n, K t) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) c += key[i] >= t;
  return c;
}

// the rank-th highest of key[0, n) (1 <= rank <= n), by counts alone: every loop here is one vectorised pass
template <typename K>
K kth(const K* key, int64_t n, int64_t rank) {
  K lo = key[0], top = key[0];
  for (int64_t i = 1; i < n; ++i) { lo = std::min(lo, key[i]); top = std::max(top, key[i]); }
  K hi = K(top + 1);  // no NaN, so the highest key is +inf's at most, and top + 1 does not wrap
  int64_t clo = n, chi = 0;  // at_least(lo) = clo >= rank > chi = at_least(hi)
  bool bisect = false;
  while (clo != rank && K(hi - lo) > 1) {
    const K span = K(hi - lo);
    const double share = (static_cast<double>(clo - rank) + 0.5) / static_cast<double>(clo - chi);
    K step = bisect ? K(span / 2) : static_cast<K>(static_cast<double>(span) * share);
    step = std::min(std::max(step, K(1)), K(span - 1));
    const K mid = K(lo + step);
    const int64_t c = at_least(key, n, mid), before = clo - chi;
    if (c >= rank) { lo = mid; clo = c; } else { hi = mid; chi = c; }
    bisect = !bisect && 2 * (clo - chi) > before;  // interpolation gained less than a halving: bisect once
  }
  if (clo != rank) return lo;  // [lo, lo + 1) holds the rank-th: it is lo
  K least = top;  // exactly rank keys at or above lo: the rank-th is the least of them
  for (int64_t i = 0; i < n; ++i) least = std::min(least, key[i] >= lo ? key[i] : top);
  return least;
}

// one row: idx (kk) increasing, use (kk); keys and band: m + 16 scratch each
template <typename F>
void select_row(const F* row, int64_t m, int64_t kk, typename Key<F>::type* keys, typename Key<F>::type* band,
                int64_t* idx, bool* use) {
  using K = typename Key<F>::type;
  const K dead = order_key<F>(-std::numeric_limits<F>::infinity());
  int64_t above = 0, nb = 0;  // keys certainly among the kk (at or above the upper bound); keys in band
  bool banded = false;
  if (4 * kk <= m) {  // bounds from the sample: its share of kk, four standard deviations and 12 either side
    const int64_t ns = (m + STRIDE - 1) / STRIDE;
    for (int64_t i = 0; i < ns; ++i) keys[i] = order_key<F>(row[i * STRIDE]);
    const int64_t share = (kk * ns + m - 1) / m;
    const int64_t spread = 4 * static_cast<int64_t>(std::sqrt(static_cast<double>(share))) + 12;
    const int64_t r_lo = std::min(share + spread, ns), r_hi = share - spread;
    const K lo = kth<K>(keys, ns, r_lo);
    const bool capped = r_hi >= 1;  // else no upper bound: every key at or above lo is in the band
    const K hi = capped ? kth<K>(keys, ns, r_hi) : K(0);
    int64_t s = 0;
#if defined(__AVX512F__)
    if constexpr (std::is_same<F, float>::value) {
      const __m512i vlo = _mm512_set1_epi32(int(lo)), vhi = _mm512_set1_epi32(int(hi));
      for (; s + 16 <= m; s += 16) {
        const __m512i x = keys16(row + s);
        const __mmask16 up = capped ? _mm512_cmpge_epu32_mask(x, vhi) : __mmask16(0);
        const __mmask16 in = _mm512_mask_cmpge_epu32_mask(__mmask16(~up), x, vlo);
        above += __builtin_popcount(up);
        _mm512_storeu_si512(band + nb, _mm512_maskz_compress_epi32(in, x));
        nb += __builtin_popcount(in);
      }
    }
#elif defined(__AVX2__)
    if constexpr (std::is_same<F, float>::value) {
      const __m256i vlo = _mm256_set1_epi32(int(lo)), vhi = _mm256_set1_epi32(int(hi));
      for (; s + 8 <= m; s += 8) {
        const __m256i x = keys8(row + s);
        const int up = capped ? _mm256_movemask_ps(_mm256_castsi256_ps(at_or_above(x, vhi))) : 0;
        const int in = _mm256_movemask_ps(_mm256_castsi256_ps(at_or_above(x, vlo))) & ~up;
        above += __builtin_popcount(up);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(band + nb), compress8(x, in));  // band: m + 16
        nb += __builtin_popcount(in);
      }
    }
#endif
    for (; s < m; ++s) {
      const K x = order_key<F>(row[s]);
      const bool up = capped && x >= hi;
      above += up;
      band[nb] = x;
      nb += !up && x >= lo;
    }
    banded = above < kk && above + nb >= kk;  // the bounds hold the kk-th key between them
  }
  K t;
  if (banded) {
    t = kth<K>(band, nb, kk - above);
    above += at_least(band, nb, t);  // now: keys at or above t
  } else {  // a short row, or bounds that missed: the whole row
    for (int64_t s = 0; s < m; ++s) keys[s] = order_key<F>(row[s]);
    t = kth<K>(keys, m, kk);
    above = at_least(keys, m, t);
  }
  int64_t j = 0;
  if (above == kk && t > 0) {  // no tie to settle: the keys at or above t, exactly kk of them, i.e. (t a number's
    // key, not a NaN's) the scores at or above its value, by one float comparison a score
    const F tau = from_key<F>(t);
    int64_t s = 0;
#if defined(__AVX512F__)
    if constexpr (std::is_same<F, float>::value) {
      const __m512 vt = _mm512_set1_ps(tau);
      const __m512i sixteen = _mm512_set1_epi64(16);
      __m512i lo8 = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7), hi8 = _mm512_setr_epi64(8, 9, 10, 11, 12, 13, 14, 15);
      for (; s + 16 <= m; s += 16) {
        const __mmask16 k = _mm512_cmp_ps_mask(_mm512_loadu_ps(row + s), vt, _CMP_GE_OQ);
        const __mmask8 a = __mmask8(k & 0xFF), b = __mmask8(k >> 8);
        const int na = __builtin_popcount(a), nb8 = __builtin_popcount(b);
        if (j + na + nb8 > kk) break;  // cannot happen (the count said kk); never written past the row's kk
        _mm512_mask_storeu_epi64(idx + j, __mmask8((1u << na) - 1), _mm512_maskz_compress_epi64(a, lo8));
        j += na;
        _mm512_mask_storeu_epi64(idx + j, __mmask8((1u << nb8) - 1), _mm512_maskz_compress_epi64(b, hi8));
        j += nb8;
        lo8 = _mm512_add_epi64(lo8, sixteen);
        hi8 = _mm512_add_epi64(hi8, sixteen);
      }
    }
#elif defined(__AVX2__)
    if constexpr (std::is_same<F, float>::value) {
      // the positions of the lanes at or above tau moved to the front (compress8) and widened to int64: no branch
      // on the mask (a loop over its set bits mispredicts at every step where a fraction of the scores pass)
      const __m256 vt = _mm256_set1_ps(tau);
      const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), eight = _mm256_set1_epi32(8);
      __m256i at = lanes;  // (positions as int32: m < 2^31)
      for (; s + 8 <= m && j + 8 <= kk; s += 8, at = _mm256_add_epi32(at, eight)) {
        const int k = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(row + s), vt, _CMP_GE_OQ));
        const __m256i front = compress8(at, k);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + j), _mm256_cvtepi32_epi64(_mm256_castsi256_si128(front)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + j + 4),
                            _mm256_cvtepi32_epi64(_mm256_extracti128_si256(front, 1)));
        j += __builtin_popcount(unsigned(k));  // (8 written, the count kept: the next ones overwrite the rest)
      }
      for (; s + 8 <= m; s += 8) {  // the last few of the kk, near the row's end of room
        unsigned k = unsigned(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(row + s), vt, _CMP_GE_OQ)));
        if (j + __builtin_popcount(k) > kk) break;  // cannot happen (the count said kk)
        for (; k; k &= k - 1) idx[j++] = s + __builtin_ctz(k);
      }
    }
#endif
    for (; s < m && j < kk; ++s) if (row[s] >= tau) idx[j++] = s;
    if (j == kk) {
      if (t > dead) std::memset(use, 1, kk);
      else for (int64_t i = 0; i < kk; ++i) use[i] = order_key<F>(row[idx[i]]) > dead;
      return;
    }
    j = 0;  // (unreachable) the general pass below, which writes kk at most
  }
  int64_t equal = 0;  // a tie at t: the earliest kk − (keys above t) of the keys equal to t
  for (int64_t s = 0; s < m; ++s) equal += order_key<F>(row[s]) == t;
  int64_t need = kk - (above - equal);
  for (int64_t s = 0; s < m && j < kk; ++s) {
    const K x = order_key<F>(row[s]);
    if (x > t || (x == t && need > 0)) {
      need -= x == t;
      idx[j] = s;
      use[j] = x > dead;
      ++j;
    }
  }
  for (; j < kk; ++j) {  // (unreachable: at least kk keys are at or above t) every index within the row regardless
    idx[j] = 0;
    use[j] = false;
  }
}

template <typename F>
void select_rows(const F* scores, int64_t rows, int64_t m, int64_t kk, int64_t threads,
                 typename Key<F>::type* scratch, int64_t* idx, bool* use) {
  const int64_t per = 2 * (m + 16);  // a thread's keys and band
#pragma omp parallel for schedule(static) num_threads(static_cast<int>(threads))
  for (int64_t r = 0; r < rows; ++r) {
#if defined(_OPENMP)
    typename Key<F>::type* mine = scratch + omp_get_thread_num() * per;
#else
    typename Key<F>::type* mine = scratch;
#endif
    select_row<F>(scores + r * m, m, kk, mine, mine + m + 16, idx + r * kk, use + r * kk);
  }
}

}  // namespace

extern "C" {

// 1 where rows are split among OpenMP threads, 0 where this build runs them on the calling thread
int64_t attn_select_openmp() {
#if defined(_OPENMP)
  return 1;
#else
  return 0;
#endif
}

// scores (rows, m) row-major, no NaN; 1 <= kk <= m; scratch: threads · 2·(m + 16) keys of the type's width;
// idx (rows, kk) int64 and use (rows, kk) bool written
void attn_select_f32(const float* scores, int64_t rows, int64_t m, int64_t kk, int64_t threads, uint32_t* scratch,
                     int64_t* idx, bool* use) {
  select_rows<float>(scores, rows, m, kk, threads, scratch, idx, use);
}

void attn_select_f64(const double* scores, int64_t rows, int64_t m, int64_t kk, int64_t threads, uint64_t* scratch,
                     int64_t* idx, bool* use) {
  select_rows<double>(scores, rows, m, kk, threads, scratch, idx, use);
}

}  // extern "C"

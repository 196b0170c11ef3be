// Non-causal linear attention with φ = elu + 1, fused: attn_core.mechanisms._linear_core's whole-tensor form for
// float32 on the CPU.
//
// out_i = φ(q_i)ᵀ S / φ(q_i)ᵀ z, S = Σ_j φ(k_j) v_jᵀ (D × D) and z = Σ_j φ(k_j) per key/value head. The torch form
// runs a group of heads through seven operations, each reading or writing the group's rows (φ(K), its product with V,
// its sum, φ(Q), its product with the state, the normalizers, the division): past the last-level cache each is a
// trip to memory. Here q, k and v are each read once and the output written once. Pass 1, per task (a key/value
// head's share of the keys): ROWS keys at a time, φ(K) of the rows into a thread's scratch (vector.h's e^x) and summed
// into z, then S += φ(K)ᵀV six features by four vectors of columns in registers, each key's features broadcast
// against its values' vectors, so that nothing is transposed. The shares of a head are then added. Pass 2, per task (a
// query head's TASK_ROWS rows): ROWS queries at a time, φ(Q) into the scratch, each row's normalizer φ(q_i)·z, then
// φ(Q)·S six rows by four vectors of columns, each row times 1 / its normalizer, written once. A row whose normalizer
// is below the smallest normal float32 (no key weighs: its features underflow) is 0, as the torch form makes it. NaN
// in q, k or v gives NaN where the torch form gives it (φ(NaN) is NaN, φ(−inf) is NaN); the call returns how many
// normalizers and state numbers are not finite, so that the caller names the input without reading it again. The
// tasks are taken by the threads as they come free (dynamic), so a thread another program slows takes fewer.
// Float32 with AVX-512 only (attn_linear_available): with AVX2's 16 registers a step holds a quarter of the products,
// so AVX2 machines keep the torch form. Tested against linear attention written in float64
// (tests/native/test_native_linear.py).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "signatures.h"  // each exported function's one declaration (written by the build)
#if defined(_OPENMP)
#include <omp.h>
#endif
#include "vector.h"  // the float32 vector and its e^x, for each instruction set

namespace {

#if defined(__AVX512F__)
#define ATTN_LINEAR 1
constexpr int64_t ROWS = 64;  // keys or queries a step: their φ in a thread's scratch, within a core's own cache
constexpr int64_t TASK_ROWS = 256;  // queries a task of pass 2
constexpr int TILE = 6;  // features (pass 1) or query rows (pass 2) a step, by up to CV vectors of columns
constexpr int CV = 4;  // vectors of columns a step: TILE·CV accumulators, CV values and a broadcast in 32 registers

inline vec phi(vec x) {
  const vec m = vmin(x, vset(0.0f));  // 0 where x is NaN: then x − m is NaN
  return vadd(vexp(m), vsub(x, m));
}

// f (rows of D) ← φ(x) for `rows` rows of D numbers, `step` apart in x; z (D) += their sum where z is given
inline void map_rows(const float* x, int64_t step, int64_t rows, int64_t D, float* f, float* z) {
  for (int64_t c = 0; c < D; c += LANES) {
    vec sum = vset(0.0f);
    for (int64_t j = 0; j < rows; ++j) {
      const vec y = phi(vload(x + j * step + c));
      vstore(f + j * D + c, y);
      sum = vadd(sum, y);
    }
    if (z != nullptr) vstore(z + c, vadd(vload(z + c), sum));
  }
}

// S rows d0 … d0 + NF − 1, column vectors c0 … c0 + NC − 1 += Σ_j f[j][d] V[j] (V's rows `vs` apart)
template <int NF, int NC>
inline void state_tile(const float* f, const float* V, int64_t vs, int64_t rows, int64_t D, int64_t d0, int64_t c0,
                       float* S) {
  vec acc[NF][NC];
  for (int a = 0; a < NF; ++a)
    for (int c = 0; c < NC; ++c) acc[a][c] = vload(S + (d0 + a) * D + (c0 + c) * LANES);
  for (int64_t j = 0; j < rows; ++j) {
    vec vv[NC];
    for (int c = 0; c < NC; ++c) vv[c] = vload(V + j * vs + (c0 + c) * LANES);
    for (int a = 0; a < NF; ++a) {
      const vec b = vset(f[j * D + d0 + a]);
      for (int c = 0; c < NC; ++c) acc[a][c] = vfmadd(b, vv[c], acc[a][c]);
    }
  }
  for (int a = 0; a < NF; ++a)
    for (int c = 0; c < NC; ++c) vstore(S + (d0 + a) * D + (c0 + c) * LANES, acc[a][c]);
}

// out rows i0 … i0 + NR − 1, column vectors c0 … c0 + NC − 1 ← (Σ_d f[i][d] S[d]) · inv[i]
template <int NR, int NC>
inline void output_tile(const float* f, const float* S, int64_t D, int64_t i0, int64_t c0, const float* inv,
                        bool stream, float* out) {
  vec acc[NR][NC];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = vset(0.0f);
  for (int64_t d = 0; d < D; ++d) {
    vec sv[NC];
    for (int c = 0; c < NC; ++c) sv[c] = vload(S + d * D + (c0 + c) * LANES);
    for (int r = 0; r < NR; ++r) {
      const vec b = vset(f[(i0 + r) * D + d]);
      for (int c = 0; c < NC; ++c) acc[r][c] = vfmadd(b, sv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < NR; ++r) {
    const vec w = vset(inv[i0 + r]);
    float* o = out + (i0 + r) * D + c0 * LANES;
    if (stream) {  // past the cache: straight to memory, without reading the lines first
      for (int c = 0; c < NC; ++c) _mm512_stream_ps(o + c * LANES, vmul(acc[r][c], w));
    } else {
      for (int c = 0; c < NC; ++c) vstore(o + c * LANES, vmul(acc[r][c], w));
    }
  }
}

// fn(std::integral_constant<int, n>()) for n = 1 … N: a tile's features, rows or column vectors as a constant, so
// that its accumulators are unrolled into registers
template <int N, typename Fn>
inline void as_constant(int64_t n, Fn&& fn) {
  if constexpr (N > 1) {
    if (n == N) return fn(std::integral_constant<int, N>());
    as_constant<N - 1>(n, fn);
  } else {
    fn(std::integral_constant<int, 1>());
  }
}

// the cache lines of rows [from, to) of `rows` rows of D numbers `step` apart in x asked for ahead of use, the
// piece'th of `pieces` parts of them (a part a tile, so that the requests spread over the step's products)
inline void ask_ahead(const float* x, int64_t step, int64_t rows, int64_t D, int64_t piece, int64_t pieces) {
  const int64_t per = D / 16, lines = rows * per;  // 16 floats a 64-byte line
  for (int64_t l = lines * piece / pieces; l < lines * (piece + 1) / pieces; ++l)
    _mm_prefetch(reinterpret_cast<const char*>(x + l / per * step + l % per * 16), _MM_HINT_T0);
}

// S (D × D) += φ(K)ᵀV and z (D) += Σ φ(K) over `keys` rows of k and v (ks and vs apart), ROWS at a time through
// f (ROWS × D); the next step's keys and values asked for while this step's products run
void state_task(const float* k, int64_t ks, const float* v, int64_t vs, int64_t keys, int64_t D, float* f, float* S,
                float* z) {
  const int64_t vecs = D / LANES, tiles = (D + TILE - 1) / TILE * ((vecs + CV - 1) / CV);
  for (int64_t j0 = 0; j0 < keys; j0 += ROWS) {
    const int64_t rows = std::min(ROWS, keys - j0), next = std::min(ROWS, keys - j0 - rows);
    map_rows(k + j0 * ks, ks, rows, D, f, z);
    const float* V = v + j0 * vs;
    int64_t tile = 0;
    for (int64_t c0 = 0; c0 < vecs; c0 += CV) {
      const int64_t nc = std::min<int64_t>(CV, vecs - c0);
      for (int64_t d0 = 0; d0 < D; d0 += TILE, ++tile) {
        if (next > 0) {
          ask_ahead(k + (j0 + rows) * ks, ks, next, D, tile, tiles);
          ask_ahead(V + rows * vs, vs, next, D, tile, tiles);
        }
        as_constant<CV>(nc, [&](auto NC) {
          as_constant<TILE>(std::min<int64_t>(TILE, D - d0), [&](auto NF) {
            state_tile<decltype(NF)::value, decltype(NC)::value>(f, V, vs, rows, D, d0, c0, S);
          });
        });
      }
    }
  }
}

// `rows` query rows of q (qs apart) into out (rows of D), against the head's state S and z, ROWS at a time through
// f (ROWS × D) and inv (ROWS); returns how many normalizers are NaN or infinite
int64_t output_task(const float* q, int64_t qs, int64_t rows, int64_t D, const float* S, const float* z, float* f,
                    float* inv, bool stream, float* out) {
  const int64_t vecs = D / LANES;
  const float tiny = std::numeric_limits<float>::min();
  int64_t bad = 0;
  const int64_t tiles = (ROWS + TILE - 1) / TILE * ((vecs + CV - 1) / CV);
  for (int64_t i0 = 0; i0 < rows; i0 += ROWS) {
    const int64_t m = std::min(ROWS, rows - i0), next = std::min(ROWS, rows - i0 - m);
    map_rows(q + i0 * qs, qs, m, D, f, nullptr);
    for (int64_t i = 0; i < m; ++i) {
      vec acc = vset(0.0f);
      for (int64_t c = 0; c < D; c += LANES) acc = vfmadd(vload(f + i * D + c), vload(z + c), acc);
      const float den = vsum(acc);
      bad += !std::isfinite(den);
      inv[i] = den < tiny ? 0.0f : 1.0f / den;  // NaN is not below it: 1 / NaN is NaN
    }
    float* o = out + i0 * D;
    int64_t tile = 0;
    for (int64_t c0 = 0; c0 < vecs; c0 += CV) {
      const int64_t nc = std::min<int64_t>(CV, vecs - c0);
      for (int64_t r0 = 0; r0 < m; r0 += TILE, ++tile) {
        if (next > 0) ask_ahead(q + (i0 + m) * qs, qs, next, D, tile, tiles);
        as_constant<CV>(nc, [&](auto NC) {
          as_constant<TILE>(std::min<int64_t>(TILE, m - r0), [&](auto NR) {
            output_tile<decltype(NR)::value, decltype(NC)::value>(f, S, D, r0, c0, inv, stream, o);
          });
        });
      }
    }
    for (int64_t i = 0; i < m; ++i)  // no key weighs: 0, whatever the products (an infinite one times 0 is NaN)
      if (inv[i] == 0.0f) std::fill(o + i * D, o + (i + 1) * D, 0.0f);
  }
  if (stream) _mm_sfence();  // the streamed rows visible before the task is done
  return bad;
}
#endif

}  // namespace

extern "C" {

// 1 where this build has the fused kernel (AVX-512), 0 where the caller runs the torch form
int64_t attn_linear_available() {
#if defined(ATTN_LINEAR)
  return 1;
#else
  return 0;
#endif
}

// q (B, H, nq, D) with its batch, head and position strides, each position's D numbers contiguous (heads split from
// (B, n, H·D) read where they lie); k, v (B, Hk, nk, D) likewise; each key/value head's keys
// in `parts` shares of whole steps (its partial states added after pass 1); D a multiple of LANES; scratch:
// B·Hk·parts·D·(D + 1) for the states, then threads · (ROWS·(D + 1)) for φ and the normalizers; out (B, H, nq, D)
// contiguous. Returns how many normalizers and state numbers are NaN or infinite.
int64_t attn_linear_f32(const float* q, int64_t q_batch, int64_t q_head, int64_t q_row, const float* k,
                        int64_t k_batch, int64_t k_head, int64_t k_row, const float* v, int64_t v_batch, int64_t v_head,
                        int64_t v_row, int64_t B, int64_t H, int64_t Hk, int64_t nq, int64_t nk, int64_t D,
                        int64_t parts, int64_t stream, int64_t threads, float* scratch, float* out) {
#if defined(ATTN_LINEAR)
  const int64_t g = H / Hk, heads = B * Hk, state = D * (D + 1), each = ROWS * (D + 1);
  const int64_t share = (nk + parts * ROWS - 1) / (parts * ROWS) * ROWS;  // keys a share, whole steps
  const int64_t chunks = (nq + TASK_ROWS - 1) / TASK_ROWS;
  float* states = scratch;
  float* work = scratch + heads * parts * state;
  int64_t bad = 0;
#pragma omp parallel num_threads(static_cast<int>(threads)) reduction(+ : bad)
  {
    float* f = thread_slice(work, each);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < heads * parts; ++task) {
      const int64_t head = task / parts, b = head / Hk, h = head % Hk, j0 = task % parts * share;
      float* S = states + task * state;
      std::fill(S, S + state, 0.0f);
      if (j0 < nk)
        state_task(k + b * k_batch + h * k_head + j0 * k_row, k_row, v + b * v_batch + h * v_head + j0 * v_row, v_row,
                   std::min(share, nk - j0), D, f, S, S + D * D);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t head = 0; head < heads; ++head) {
      float* S = states + head * parts * state;
      for (int64_t p = 1; p < parts; ++p)
        for (int64_t i = 0; i < state; ++i) S[i] += S[p * state + i];
      for (int64_t i = 0; i < state; ++i) bad += !std::isfinite(S[i]);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * H * chunks; ++task) {
      const int64_t b = task / (H * chunks), h = task / chunks % H, i0 = task % chunks * TASK_ROWS;
      const float* S = states + (b * Hk + h / g) * parts * state;
      bad += output_task(q + b * q_batch + h * q_head + i0 * q_row, q_row, std::min(TASK_ROWS, nq - i0), D, S,
                         S + D * D, f, f + ROWS * D, stream != 0, out + ((b * H + h) * nq + i0) * D);
    }
  }
  return bad;
#else
  (void)q, (void)q_batch, (void)q_head, (void)q_row, (void)k, (void)k_batch, (void)k_head, (void)k_row, (void)v;
  (void)v_batch, (void)v_head, (void)v_row, (void)B, (void)H, (void)Hk, (void)nq, (void)nk, (void)D, (void)parts;
  (void)stream, (void)threads, (void)scratch, (void)out;
  return 0;  // never called: attn_linear_available says 0
#endif
}

}  // extern "C"

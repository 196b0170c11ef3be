// Linear attention with φ = elu + 1, fused, causal and not: attn_core.mechanisms._linear_core's whole-tensor form
// for float32 on the CPU.
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
// Causal (attn_linear_causal_f32): a key/value head a task, its positions in blocks of ROWS in order, the state of the
// blocks before carried in the thread's scratch; each block's in-block products tril(φ(Q_b)φ(K_b)ᵀ) computed only
// where a tile has a key at or before one of its rows, and multiplied by V_b only up to its last row; the next block's
// rows asked for while this block's products run (the time slope 4k → 16k 1.12 without, 1.10 with). The torch form
// took 25 MiB beside the output at n = 16384 (its segments' block states and products); this takes 81 KiB a thread.
// Its products are one routine (`multiply`, any strides: a tile of up to six rows by four vectors of columns in
// registers). The non-causal passes keep tiles of their own with fixed strides (state_tile, output_tile): written
// through `multiply`, that call took 13.2–14.1 ms at n = 16384 against 10.7–11.4 (3 runs each, one process after
// another, B = 1, H = 8, D = 64, the 2-core Xeon), the same at 4096: the reads no longer hid behind the products.
// Float32 with AVX-512 (16 lanes, tiles of six rows by four vectors) or AVX2 and FMA (8 lanes, four rows by two
// vectors in its 16 registers); attn_linear_available says the lanes, which divide the head widths it takes. Built
// for AVX2 (-march=haswell) and run on the Xeon beside torch's kernels held to AVX2 (ATEN_CPU_CAPABILITY=avx2),
// against the torch form, 7 interleaved rounds, twice: not causal 0.98–1.02× its time at n = 4096, 0.82× at 16384;
// causal 0.67–0.69× and 0.70–0.72× (not measured on a machine without AVX-512). Tested against linear attention
// written in float64, the AVX2 form built apart for the test (tests/native/test_native_linear.py).
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

#if defined(ATTN_VECTOR)
#define ATTN_LINEAR 1
constexpr int64_t ROWS = 64;  // keys or queries a step: their φ in a thread's scratch, within a core's own cache
constexpr int64_t TASK_ROWS = 256;  // queries a task of pass 2
#if defined(__AVX512F__)
constexpr int TILE = 6;  // features (pass 1) or query rows (pass 2) a step, by up to CV vectors of columns
constexpr int CV = 4;  // vectors of columns a step: TILE·CV accumulators, CV values and a broadcast in 32 registers
#else
constexpr int TILE = 4;  // AVX2's 16 registers: 8 accumulators, 2 values and a broadcast (3 × 3, 2 × 4, 5 × 2 and
constexpr int CV = 2;  // 6 × 2 ran 2–20% slower: 5.0, 4.8, 4.3, 4.6 ms against 4.2–4.4 at n = 4096)
#endif

// f (rows of D) ← φ(x) for `rows` rows of D numbers, `step` apart in x; z (D) += their sum where z is given
inline void map_rows(const float* x, int64_t step, int64_t rows, int64_t D, float* f, float* z) {
  for (int64_t c = 0; c < D; c += LANES) {
    vec sum = vset(0.0f);
    for (int64_t j = 0; j < rows; ++j) {
      const vec y = vphi(vload(x + j * step + c));
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
      for (int c = 0; c < NC; ++c) vstream(o + c * LANES, vmul(acc[r][c], w));
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
  const int64_t per = (D + 15) / 16, lines = rows * per;  // 16 floats a 64-byte line
  for (int64_t l = lines * piece / pieces; l < lines * (piece + 1) / pieces; ++l)
    _mm_prefetch(reinterpret_cast<const char*>(x + l / per * step + l % per * 16), _MM_HINT_T0);
}

inline int64_t tile_count(int64_t rows, int64_t vecs) { return (rows + TILE - 1) / TILE * ((vecs + CV - 1) / CV); }

// inv[i] ← 1 / (f[i]·z + extra[i]) for i < rows (extra null: 0), 0 where that normalizer is below the smallest normal
// float32 (no key weighs); returns how many normalizers are NaN or infinite
inline int64_t normalizers(const float* f, const float* z, const float* extra, int64_t rows, int64_t D, float* inv) {
  const float tiny = std::numeric_limits<float>::min();
  int64_t bad = 0;
  for (int64_t i = 0; i < rows; ++i) {
    vec acc = vset(0.0f);
    for (int64_t c = 0; c < D; c += LANES) acc = vfmadd(vload(f + i * D + c), vload(z + c), acc);
    const float den = vsum(acc) + (extra != nullptr ? extra[i] : 0.0f);
    bad += !std::isfinite(den);
    inv[i] = den < tiny ? 0.0f : 1.0f / den;  // NaN is not below it: 1 / NaN is NaN
  }
  return bad;
}

// rows of out (D apart) whose normalizer was too small: 0, whatever the products (an infinite one times 0 is NaN)
inline void zero_unseen(const float* inv, int64_t rows, int64_t D, float* out) {
  for (int64_t i = 0; i < rows; ++i)
    if (inv[i] == 0.0f) std::fill(out + i * D, out + (i + 1) * D, 0.0f);
}

// S (D × D) += φ(K)ᵀV and z (D) += Σ φ(K) over `keys` rows of k and v (ks and vs apart), ROWS at a time through
// f (ROWS × D); the next step's keys and values asked for while this step's products run
void state_task(const float* k, int64_t ks, const float* v, int64_t vs, int64_t keys, int64_t D, float* f, float* S,
                float* z) {
  const int64_t vecs = D / LANES, tiles = tile_count(D, vecs);
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
  const int64_t vecs = D / LANES, tiles = tile_count(ROWS, vecs);
  int64_t bad = 0;
  for (int64_t i0 = 0; i0 < rows; i0 += ROWS) {
    const int64_t m = std::min(ROWS, rows - i0), next = std::min(ROWS, rows - i0 - m);
    map_rows(q + i0 * qs, qs, m, D, f, nullptr);
    bad += normalizers(f, z, nullptr, m, D, inv);
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
    zero_unseen(inv, m, D, o);
  }
  if (stream) _mm_sfence();  // the streamed rows visible before the task is done
  return bad;
}
// fn(NR, NC, r0, c0, t) for each tile of a grid of `rows` rows by `vecs` vectors of columns: TILE rows by CV vectors
// at a time (NR and NC the tile's, as constants), t counting the tiles
template <typename Fn>
inline void tiles(int64_t rows, int64_t vecs, Fn&& fn) {
  int64_t t = 0;
  for (int64_t c0 = 0; c0 < vecs; c0 += CV)
    for (int64_t r0 = 0; r0 < rows; r0 += TILE, ++t)
      as_constant<CV>(std::min<int64_t>(CV, vecs - c0), [&](auto NC) {
        as_constant<TILE>(std::min<int64_t>(TILE, rows - r0), [&](auto NR) { fn(NR, NC, r0, c0, t); });
      });
}

template <int NR, int NC>
using Tile = vec[NR][NC];

// acc ← the tile of rows `rs` apart at `from`, or 0 where from is null
template <int NR, int NC>
inline void load(Tile<NR, NC>& acc, const float* from, int64_t rs) {
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = from != nullptr ? vload(from + r * rs + c * LANES) : vset(0.0f);
}

// acc[r][c] += Σ_{d < K} a[r·ar + d·ad] · b[d·bs + c·LANES]: NR numbers of a broadcast against NC vectors of b's row
template <int NR, int NC>
inline void multiply(Tile<NR, NC>& acc, const float* a, int64_t ar, int64_t ad, const float* b, int64_t bs,
                     int64_t K) {
  for (int64_t d = 0; d < K; ++d) {
    vec bv[NC];
    for (int c = 0; c < NC; ++c) bv[c] = vload(b + d * bs + c * LANES);
    for (int r = 0; r < NR; ++r) {
      const vec x = vset(a[r * ar + d * ad]);
      for (int c = 0; c < NC; ++c) acc[r][c] = vfmadd(x, bv[c], acc[r][c]);
    }
  }
}

// the tile's rows into `to`, `rs` apart, each times inv[r] where inv is given; streamed: straight to memory, without
// reading the lines first (64-byte aligned rows)
template <int NR, int NC>
inline void store(const Tile<NR, NC>& acc, float* to, int64_t rs, const float* inv, bool stream) {
  for (int r = 0; r < NR; ++r) {
    const vec w = vset(inv != nullptr ? inv[r] : 1.0f);
    for (int c = 0; c < NC; ++c) {
      const vec y = inv != nullptr ? vmul(acc[r][c], w) : acc[r][c];
      if (stream) {
        vstream(to + r * rs + c * LANES, y);
      } else {
        vstore(to + r * rs + c * LANES, y);
      }
    }
  }
}

// S (D × D) += f[0, rows)ᵀ V (f: rows of D, V's rows `vs` apart): D features by D / LANES vectors of columns;
// `during(t)` runs before tile t (the next step's rows asked for)
template <typename Fn>
inline void add_state(const float* f, const float* V, int64_t vs, int64_t rows, int64_t D, float* S, Fn&& during) {
  tiles(D, D / LANES, [&](auto NR, auto NC, int64_t d0, int64_t c0, int64_t t) {
    during(t);
    Tile<decltype(NR)::value, decltype(NC)::value> acc;
    load(acc, S + d0 * D + c0 * LANES, D);
    multiply(acc, f + d0, 1, D, V + c0 * LANES, vs, rows);
    store(acc, S + d0 * D + c0 * LANES, D, nullptr, false);
  });
}

// Causal, one key/value head and its g query heads (q + t·q_head for t < g, out likewise), all n positions in blocks
// of ROWS, the state S (D × D) and z (D) of the blocks before carried in the thread's scratch: per block φ(K_b), its
// transpose; per query head φ(Q_b), the in-block products P = tril(φ(Q_b)φ(K_b)ᵀ) and their row sums, the normalizers
// φ(q_i)·z + Σ_j P_ij, out_b = (φ(Q_b)·S + P·V_b) / normalizer; then S += φ(K_b)ᵀV_b, z += Σ φ(K_b). Returns how many
// normalizers and final state numbers are NaN or infinite (a NaN in v reaches the state, not the normalizers).
int64_t causal_task(const float* q, int64_t q_head, int64_t qs, const float* k, int64_t ks, const float* v, int64_t vs,
                    int64_t g, int64_t n, int64_t D, float* work, bool stream, float* out, int64_t o_head) {
  const int64_t vecs = D / LANES, C = ROWS;
  float *fk = work, *fkt = fk + C * D, *fq = fkt + D * C, *P = fq + C * D, *sums = P + C * C, *inv = sums + C;
  float *S = inv + C, *z = S + D * D;
  std::fill(S, S + D * (D + 1), 0.0f);
  int64_t bad = 0;
  for (int64_t j0 = 0; j0 < n; j0 += C) {
    const int64_t m = std::min(C, n - j0), next = std::min(C, n - j0 - m);
    map_rows(k + j0 * ks, ks, m, D, fk, nullptr);
    for (int64_t d = 0; d < D; ++d)  // φ(K_b)ᵀ, D × C, 0 past the block's m keys
      for (int64_t j = 0; j < C; ++j) fkt[d * C + j] = j < m ? fk[j * D + d] : 0.0f;
    const float* V = v + j0 * vs;
    for (int64_t t = 0; t < g; ++t) {
      map_rows(q + t * q_head + j0 * qs, qs, m, D, fq, nullptr);
      tiles(m, C / LANES, [&](auto NR, auto NC, int64_t r0, int64_t c0, int64_t) {
        if (c0 * LANES >= r0 + decltype(NR)::value) return;  // keys after all the tile's rows: set to 0 below
        Tile<decltype(NR)::value, decltype(NC)::value> acc;
        load(acc, nullptr, 0);
        multiply(acc, fq + r0 * D, D, 1, fkt + c0 * LANES, C, D);
        store(acc, P + r0 * C + c0 * LANES, C, nullptr, false);
      });
      for (int64_t i = 0; i < m; ++i) {  // j ≤ i: the later keys of the block set to 0 (a NaN there too)
        std::fill(P + i * C + i + 1, P + (i + 1) * C, 0.0f);
        vec acc = vset(0.0f);
        for (int64_t j = 0; j < C; j += LANES) acc = vadd(acc, vload(P + i * C + j));
        sums[i] = vsum(acc);
      }
      bad += normalizers(fq, z, sums, m, D, inv);
      float* o = out + t * o_head + j0 * D;
      tiles(m, vecs, [&](auto NR, auto NC, int64_t r0, int64_t c0, int64_t at) {
        if (next > 0) ask_ahead(q + t * q_head + (j0 + m) * qs, qs, next, D, at, tile_count(m, vecs));
        Tile<decltype(NR)::value, decltype(NC)::value> acc;
        load(acc, nullptr, 0);
        multiply(acc, fq + r0 * D, D, 1, S + c0 * LANES, D, D);
        multiply(acc, P + r0 * C, C, 1, V + c0 * LANES, vs, std::min(m, r0 + decltype(NR)::value));  // j ≤ i
        store(acc, o + r0 * D + c0 * LANES, D, inv + r0, stream);
      });
      zero_unseen(inv, m, D, o);
    }
    add_state(fk, V, vs, m, D, S, [&](int64_t at) {  // the next block's keys and values asked for meanwhile
      if (next > 0) {
        ask_ahead(k + (j0 + m) * ks, ks, next, D, at, tile_count(D, vecs));
        ask_ahead(V + m * vs, vs, next, D, at, tile_count(D, vecs));
      }
    });
    for (int64_t c = 0; c < D; c += LANES) {
      vec acc = vload(z + c);
      for (int64_t j = 0; j < m; ++j) acc = vadd(acc, vload(fk + j * D + c));
      vstore(z + c, acc);
    }
  }
  for (int64_t i = 0; i < D * (D + 1); ++i) bad += !std::isfinite(S[i]);
  if (stream) _mm_sfence();
  return bad;
}
#endif

}  // namespace

extern "C" {

// the lanes of this build's vector (16 with AVX-512, 8 with AVX2 and FMA: head widths it takes are a multiple of
// them), 0 where it has no vector form and the caller runs the torch form
int64_t attn_linear_available() {
#if defined(ATTN_LINEAR)
  return LANES;
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

// causal: q (B, H, n, D), k, v (B, Hk, n, D) with their batch, head and position strides as above; each key/value
// head a task, with its H / Hk query heads (`causal_task`); scratch: threads · (3·ROWS·D + ROWS² + 2·ROWS + D·(D + 1));
// out (B, H, n, D) contiguous. Returns how many normalizers and state numbers are NaN or infinite.
int64_t attn_linear_causal_f32(const float* q, int64_t q_batch, int64_t q_head, int64_t q_row, const float* k,
                               int64_t k_batch, int64_t k_head, int64_t k_row, const float* v, int64_t v_batch,
                               int64_t v_head, int64_t v_row, int64_t B, int64_t H, int64_t Hk, int64_t n, int64_t D,
                               int64_t stream, int64_t threads, float* scratch, float* out) {
#if defined(ATTN_LINEAR)
  const int64_t g = H / Hk, each = 3 * ROWS * D + ROWS * ROWS + 2 * ROWS + D * (D + 1);
  int64_t bad = 0;
#pragma omp parallel for num_threads(static_cast<int>(threads)) schedule(dynamic, 1) reduction(+ : bad)
  for (int64_t head = 0; head < B * Hk; ++head) {
    const int64_t b = head / Hk, h = head % Hk;
    bad += causal_task(q + b * q_batch + h * g * q_head, q_head, q_row, k + b * k_batch + h * k_head, k_row,
                       v + b * v_batch + h * v_head, v_row, g, n, D, thread_slice(scratch, each), stream != 0,
                       out + (b * H + h * g) * n * D, n * D);
  }
  return bad;
#else
  (void)q, (void)q_batch, (void)q_head, (void)q_row, (void)k, (void)k_batch, (void)k_head, (void)k_row, (void)v;
  (void)v_batch, (void)v_head, (void)v_row, (void)B, (void)H, (void)Hk, (void)n, (void)D, (void)stream;
  (void)threads, (void)scratch, (void)out;
  return 0;  // never called: attn_linear_available says 0
#endif
}

}  // extern "C"

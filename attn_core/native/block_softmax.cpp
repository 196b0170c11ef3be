// Softmax over the blocks of keys each query selected, fused: attn_core.mechanisms._sparse.block_softmax's form for
// the CPU (NSA's selection branch).
//
// Query row t of head h (at position first + t) reads whole blocks of l consecutive keys: for each entry j of its
// list, keys j·l … j·l + l − 1, those at or before its position and before m. Softmax over all of them together, then
// Σ p_s·v_s. A row with no key outputs zeros, one with a NaN or +inf score NaN, as the fused softmax of selected keys
// (selected_softmax.cpp) gives them. That kernel loads a key's row once for every query that selected it: 16 blocks
// of 64 keys a query in NSA, read from the shared cache at 50–60 cycles a key on the 2-core EPYC. Here the work is
// turned around. A task (a batch element, a key/value head and a tile of rows) lists, for every block, the rows
// that selected it; then each block's keys are read once for four of its rows at a time and for every query head the
// key/value head serves, while the block stays in the core's cache. Each row's softmax is carried from block to block
// (its highest score so far, the sum of exponentials below it, and its output rescaled when a higher score comes).
// Tasks are taken as threads come free (dynamic), so a thread that another program slows takes fewer of them.
// float32 with AVX-512 or AVX2 and FMA (D a multiple of the lanes): four rows by two keys of products in registers
// (AVX2), their sums reduced eight at once, and four rows' outputs by two vectors of columns; else plain loops
// (float64, other widths, other machines). Tested against the softmax written row by row in float64
// (tests/native/test_native_blocks.py).
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

constexpr int ROWS_AT_ONCE = 4;  // rows of one block a step: each key and value row loaded serves four queries

// the sizes one call shares among its tasks
struct Shape {
  int64_t B, H, r, D, Hk, S, nb, m, l, first, tile;
};

// keys of block j that query row t reads: those at or before its position and before m (≤ 0: none)
inline int64_t reach(const Shape& d, int64_t t, int64_t j) {
  return std::min({d.l, d.first + t - j * d.l + 1, d.m - j * d.l});
}

// a row's state st = [highest score so far, sum of e^(s − highest), a NaN or +inf seen] folded with one block's n
// scores sc (made e^(s − highest) in place), of highest `top`, NaN or +inf among them `bad`: true, with the factor
// `alpha` that rescales the row's output so far, where the block adds to the row; false where it adds nothing
// (the row is NaN already or now, or none of its scores is above −inf)
template <typename F>
bool fold(F* sc, int64_t n, F top, bool bad, F* st, F& alpha) {
  constexpr F NEG = -std::numeric_limits<F>::infinity();
  if (st[2] != 0) return false;
  if (bad) {
    st[2] = 1;
    return false;
  }
  if (top == NEG) return false;
  const F M = std::max(top, st[0]);
  alpha = std::exp(st[0] - M);  // 0 before the first block
  F total = 0;
#if defined(ATTN_VECTOR)
  if constexpr (std::is_same<F, float>::value) {
    total = exp_less(sc, n, M);
  } else
#endif
  {
    for (int64_t i = 0; i < n; ++i) total += (sc[i] = std::exp(sc[i] - M));
  }
  st[0] = M;
  st[1] = st[1] * alpha + total;
  return true;
}

// one row alone, any type and width: its n scores against the block's keys K, folded, and its output o rescaled and
// added Σ p·V
template <typename F>
void plain_row(const F* q, const F* K, const F* V, int64_t n, int64_t D, F scale, F* sc, F* st, F* o) {
  F top = -std::numeric_limits<F>::infinity();
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) {
    const F* kr = K + i * D;
    F s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < D; ++c) s += q[c] * kr[c];
    s *= scale;
    bad |= (s != s) || s == std::numeric_limits<F>::infinity();
    top = s > top ? s : top;
    sc[i] = s;
  }
  F alpha = 1;
  if (!fold(sc, n, top, bad, st, alpha)) return;
  for (int64_t c = 0; c < D; ++c) o[c] *= alpha;
  for (int64_t i = 0; i < n; ++i) {
    const F p = sc[i];
    const F* vr = V + i * D;
#pragma omp simd
    for (int64_t c = 0; c < D; ++c) o[c] += p * vr[c];
  }
}

#if defined(ATTN_VECTOR)
// scores sc[u·l + i] = q_u·k_i·scale of RR rows (q[u]) and the block's first n keys K, D = a multiple of LANES: 8/RR
// keys a step, the 8 products' lane sums reduced together; each row's highest score and NaN or +inf flag
// (scores and weigh are kept out of their caller: inlined into the task loop, GCC spilled their accumulators to the
// stack, 7.0 against 5.4 ms a block of NSA's rows in the core's cache)
template <int RR>
__attribute__((noinline)) void scores(const float* const* q, const float* K, int64_t n, int64_t D, int64_t l,
                                      float scale, float* sc, float* top, bool* bad) {
  constexpr int U = 8 / RR;
  float high[8], s8[8];  // lane u·U + k: row u's k-th key of each step; its highest score, and NaN or +inf seen
  int odd[8];
  for (int a = 0; a < 8; ++a) high[a] = NEG32, odd[a] = 0;
  int64_t i = 0;
  for (; i + U <= n; i += U) {
    vec x[8];
    for (int a = 0; a < 8; ++a) x[a] = vset(0.0f);
    for (int64_t c = 0; c < D; c += LANES) {
      if constexpr (RR == 1) {
        const vec qv = vload(q[0] + c);
        for (int k = 0; k < U; ++k) x[k] = vfmadd(qv, vload(K + (i + k) * D + c), x[k]);
      } else {
        vec kv[U];
        for (int k = 0; k < U; ++k) kv[k] = vload(K + (i + k) * D + c);
        for (int u = 0; u < RR; ++u) {
          const vec qv = vload(q[u] + c);
          for (int k = 0; k < U; ++k) x[u * U + k] = vfmadd(qv, kv[k], x[u * U + k]);
        }
      }
    }
    sums8(x, s8);
    for (int a = 0; a < 8; ++a) {  // lane by lane, as one vector: no branch a score
      const float sa = s8[a] * scale;
      high[a] = sa > high[a] ? sa : high[a];
      odd[a] |= !(sa < -NEG32);  // NaN or +inf
      s8[a] = sa;
    }
    for (int u = 0; u < RR; ++u)
      for (int k = 0; k < U; ++k) sc[u * l + i + k] = s8[u * U + k];
  }
  for (; i < n; ++i)
    for (int u = 0; u < RR; ++u) {
      vec x = vset(0.0f);
      for (int64_t c = 0; c < D; c += LANES) x = vfmadd(vload(q[u] + c), vload(K + i * D + c), x);
      const float sa = vsum(x) * scale;
      high[u * U] = sa > high[u * U] ? sa : high[u * U];
      odd[u * U] |= !(sa < -NEG32);
      sc[u * l + i] = sa;
    }
  for (int u = 0; u < RR; ++u) {
    top[u] = NEG32, bad[u] = false;
    for (int k = 0; k < U; ++k) top[u] = std::max(top[u], high[u * U + k]), bad[u] |= odd[u * U + k] != 0;
  }
}

// o[u] ← alpha[u]·o[u] + Σ_i p[u][i]·V_i for RR rows over the block's first n value rows, two vectors of columns a
// step (then one): each value row loaded serves RR rows
template <int RR>
__attribute__((noinline)) void weigh(float* const* o, const float* const* p, const float* alpha, const float* V,
                                     int64_t n, int64_t D) {
  int64_t c = 0;
  for (; c + 2 * LANES <= D; c += 2 * LANES) {
    vec a[RR][2];
    for (int u = 0; u < RR; ++u) {
      const vec va = vset(alpha[u]);
      a[u][0] = vmul(va, vload(o[u] + c));
      a[u][1] = vmul(va, vload(o[u] + c + LANES));
    }
    for (int64_t i = 0; i < n; ++i) {
      const vec v0 = vload(V + i * D + c), v1 = vload(V + i * D + c + LANES);
      for (int u = 0; u < RR; ++u) {
        const vec pp = vset(p[u][i]);
        a[u][0] = vfmadd(pp, v0, a[u][0]);
        a[u][1] = vfmadd(pp, v1, a[u][1]);
      }
    }
    for (int u = 0; u < RR; ++u) vstore(o[u] + c, a[u][0]), vstore(o[u] + c + LANES, a[u][1]);
  }
  for (; c < D; c += LANES) {
    vec a[RR];
    for (int u = 0; u < RR; ++u) a[u] = vmul(vset(alpha[u]), vload(o[u] + c));
    for (int64_t i = 0; i < n; ++i) {
      const vec v0 = vload(V + i * D + c);
      for (int u = 0; u < RR; ++u) a[u] = vfmadd(vset(p[u][i]), v0, a[u]);
    }
    for (int u = 0; u < RR; ++u) vstore(o[u] + c, a[u]);
  }
}

// RR rows of one block (distinct rows, each reading its first n keys), float32: scores, each row's fold, then the
// rows the block adds to weighed together (all of them), or one by one
template <int RR>
void vector_rows(const float* const* q, const float* K, const float* V, int64_t n, int64_t D, int64_t l, float scale,
                 float* sc, float* const* st, float* const* o) {
  float top[RR], alpha[RR];
  bool bad[RR], adds[RR];
  scores<RR>(q, K, n, D, l, scale, sc, top, bad);
  const float* p[RR];
  bool all = true;
  for (int u = 0; u < RR; ++u) {
    alpha[u] = 1.0f;
    adds[u] = fold(sc + u * l, n, top[u], bad[u], st[u], alpha[u]);
    all &= adds[u];
    p[u] = sc + u * l;
  }
  if (all) return weigh<RR>(o, p, alpha, V, n, D);
  for (int u = 0; u < RR; ++u)
    if (adds[u]) weigh<1>(o + u, p + u, alpha + u, V, n, D);
}
#endif

// whether the vector form takes rows of this type and width on this machine
template <typename F>
bool vector_takes(int64_t D) {
#if defined(ATTN_VECTOR)
  return std::is_same<F, float>::value && D % LANES == 0 && D > 0;
#else
  (void)D;
  return false;
#endif
}

// `count` rows (≤ ROWS_AT_ONCE, distinct, each reading the block's first n keys) of one query head
template <typename F>
void rows_of_block(const F* const* q, const F* K, const F* V, int count, int64_t n, int64_t D, int64_t l, F scale,
                   F* sc, F* const* st, F* const* o) {
#if defined(ATTN_VECTOR)
  if constexpr (std::is_same<F, float>::value) {
    if (vector_takes<F>(D)) {
      if (count == 4) return vector_rows<4>(q, K, V, n, D, l, scale, sc, st, o);
      int u = 0;
      if (count >= 2) vector_rows<2>(q, K, V, n, D, l, scale, sc, st, o), u = 2;
      if (u < count) vector_rows<1>(q + u, K, V, n, D, l, scale, sc, st + u, o + u);
      return;
    }
  }
#endif
  (void)l;  // the vector form's stride between rows' scores; one row at a time needs none
  for (int u = 0; u < count; ++u) plain_row<F>(q[u], K, V, n, D, scale, sc, st[u], o[u]);
}

// the next block's keys and values (n numbers each) asked into the core's own cache (L2) while this block's rows
// run: without it, the value rows' first reads (four passes of columns over the block) waited on the shared cache
// for 40% of the kernel's time
template <typename F>
inline void ahead(const F* K, const F* V, int64_t n) {
  constexpr int64_t LINE = 64 / sizeof(F);
  for (int64_t i = 0; i < n; i += LINE) __builtin_prefetch(K + i, 0, 2), __builtin_prefetch(V + i, 0, 2);
}

template <typename F>
void blocks(const F* q, const int64_t* qs, const F* k, const F* v, const int64_t* kvs, const int64_t* sel,
            const Shape& d, F scale, const F* sinks, int64_t threads, F* scratch, int64_t* lists, F* out) {
  const int64_t g = d.H / d.Hk, tiles = (d.r + d.tile - 1) / d.tile, nblk = (d.m + d.l - 1) / d.l;
  const int64_t tasks = d.B * d.Hk * tiles;
  const int64_t floats = ROWS_AT_ONCE * d.l + 3 * g * d.tile, ints = nblk + 1 + d.tile * d.nb;
#pragma omp parallel num_threads(static_cast<int>(threads))
  {
#if defined(_OPENMP)
    const int64_t me = omp_get_thread_num();
#else
    const int64_t me = 0;
#endif
    F* sc = scratch + me * floats;
    F* state = sc + ROWS_AT_ONCE * d.l;  // (g, tile, 3)
    int64_t* ends = lists + me * ints;   // nblk + 1: where each block's rows end in `rows`
    int64_t* rows = ends + nblk + 1;     // tile · nb: the rows that read each block, block by block
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / (d.Hk * tiles), hk = task / tiles % d.Hk, t0 = task % tiles * d.tile;
      const int64_t t1 = std::min(d.r, t0 + d.tile), s = d.S == 1 ? 0 : hk;
      const int64_t* lst = sel + (b * d.S + s) * d.r * d.nb;
      const F* K = k + b * kvs[0] + hk * kvs[1];
      const F* V = v + b * kvs[2] + hk * kvs[3];
      // the rows of each block (counted, then placed; ascending within a block, as they are read)
      std::fill(ends, ends + nblk + 1, 0);
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t e = 0; e < d.nb; ++e)
          if (reach(d, t, lst[t * d.nb + e]) > 0) ++ends[lst[t * d.nb + e] + 1];
      for (int64_t j = 0; j < nblk; ++j) ends[j + 1] += ends[j];
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t e = 0; e < d.nb; ++e)
          if (reach(d, t, lst[t * d.nb + e]) > 0) rows[ends[lst[t * d.nb + e]]++] = t;
      // now ends[j] is where block j's rows end (and j + 1's begin)
      for (int64_t u = 0; u < g * d.tile; ++u) {
        F* st = state + 3 * u;
        st[0] = -std::numeric_limits<F>::infinity(), st[1] = st[2] = 0;
      }
      for (int64_t h = hk * g; h < hk * g + g; ++h)
        std::fill(out + ((b * d.H + h) * d.r + t0) * d.D, out + ((b * d.H + h) * d.r + t1) * d.D, F(0));
      int64_t next = 0;  // the next block that rows read
      while (next < nblk && ends[next] == (next == 0 ? 0 : ends[next - 1])) ++next;
      for (int64_t j = next; j < nblk; j = next) {
        const int64_t from = j == 0 ? 0 : ends[j - 1], to = ends[j];
        const F* Kj = K + j * d.l * d.D;
        const F* Vj = V + j * d.l * d.D;
        for (++next; next < nblk && ends[next] == ends[next - 1];) ++next;
        if (next < nblk) ahead(K + next * d.l * d.D, V + next * d.l * d.D, std::min(d.l, d.m - next * d.l) * d.D);
        for (int64_t h = hk * g; h < hk * g + g; ++h) {
          const F* qh = q + b * qs[0] + h * qs[1];
          F* oh = out + (b * d.H + h) * d.r * d.D;
          F* sh = state + (h - hk * g) * d.tile * 3;
          for (int64_t i = from; i < to;) {
            // up to four distinct rows that read as many of the block's keys (a row listing it twice comes twice)
            const int64_t n = reach(d, rows[i], j);
            int count = 1;
            while (count < ROWS_AT_ONCE && i + count < to && rows[i + count] != rows[i + count - 1] &&
                   reach(d, rows[i + count], j) == n)
              ++count;
            const F* qr[ROWS_AT_ONCE];
            F* sr[ROWS_AT_ONCE];
            F* orow[ROWS_AT_ONCE];
            for (int u = 0; u < count; ++u) {
              const int64_t t = rows[i + u];
              qr[u] = qh + t * d.D, sr[u] = sh + 3 * (t - t0), orow[u] = oh + t * d.D;
            }
            rows_of_block<F>(qr, Kj, Vj, count, n, d.D, d.l, scale, sc, sr, orow);
            i += count;
          }
        }
      }
      // each row's output over its sum (and its head's sink, e^(a_h − M)); NaN where a NaN or +inf score came
      for (int64_t h = hk * g; h < hk * g + g; ++h) {
        const F sink = sinks ? sinks[h] : -std::numeric_limits<F>::infinity();
        for (int64_t t = t0; t < t1; ++t) {
          const F* st = state + 3 * ((h - hk * g) * d.tile + t - t0);
          F* o = out + ((b * d.H + h) * d.r + t) * d.D;
          if (st[2] != 0) {
            std::fill(o, o + d.D, std::numeric_limits<F>::quiet_NaN());
          } else if (st[1] != 0) {
            const F total = st[1] + std::exp(sink - st[0]);
            for (int64_t c = 0; c < d.D; ++c) o[c] /= total;
          }
        }
      }
    }
  }
}

}  // namespace

extern "C" {

// q: rows of D, its batch and head strides; k, v: rows of D, each with its batch and head strides (m keys);
// sel (B, S, r, nb) int64, every entry in [0, ⌈m / l⌉); first: row 0's position; tile: rows a task;
// sinks: H logits, or null; scratch: threads · (4·l + 3·(H / Hk)·tile); lists: threads · (⌈m / l⌉ + 1 + tile·nb);
// out (B, H, r, D)
void attn_block_softmax_f32(const float* q, int64_t q_batch, int64_t q_head, const float* k, int64_t k_batch,
                            int64_t k_head, const float* v, int64_t v_batch, int64_t v_head, const int64_t* sel,
                            int64_t B, int64_t H, int64_t r, int64_t D, int64_t Hk, int64_t S, int64_t nb, int64_t m,
                            int64_t l, int64_t first, int64_t tile, float scale, const float* sinks, int64_t threads,
                            float* scratch, int64_t* lists, float* out) {
  const int64_t qs[2] = {q_batch, q_head}, kvs[4] = {k_batch, k_head, v_batch, v_head};
  blocks<float>(q, qs, k, v, kvs, sel, Shape{B, H, r, D, Hk, S, nb, m, l, first, tile}, scale, sinks, threads,
                scratch, lists, out);
}

void attn_block_softmax_f64(const double* q, int64_t q_batch, int64_t q_head, const double* k, int64_t k_batch,
                            int64_t k_head, const double* v, int64_t v_batch, int64_t v_head, const int64_t* sel,
                            int64_t B, int64_t H, int64_t r, int64_t D, int64_t Hk, int64_t S, int64_t nb, int64_t m,
                            int64_t l, int64_t first, int64_t tile, double scale, const double* sinks,
                            int64_t threads, double* scratch, int64_t* lists, double* out) {
  const int64_t qs[2] = {q_batch, q_head}, kvs[4] = {k_batch, k_head, v_batch, v_head};
  blocks<double>(q, qs, k, v, kvs, sel, Shape{B, H, r, D, Hk, S, nb, m, l, first, tile}, scale, sinks, threads,
                 scratch, lists, out);
}

}  // extern "C"

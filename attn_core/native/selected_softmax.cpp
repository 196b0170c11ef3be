// Softmax over the keys each query selected, fused: attn_core.mechanisms._sparse.selected_softmax's form for the CPU.
//
// For each batch element b, query head h and query t: the scores q_t·k_s·scale at the kk selected keys s of t's
// selection (one for every head, S = 1, or one per key/value head, S = Hk), −inf where a selected key is not usable;
// softmax over them; and Σ p_s·v_s. A row with no usable key outputs zeros; a row with a NaN or +inf score outputs
// NaN, as softmax over it does. The keys and values are read in place, one row of D a selected key: the scores live
// in one thread's buffer of kk and never leave the core's cache, where the torch form (a sampled product, softmax, a
// bag sum) writes and reads them three times. Forward only (the torch form runs where gradients are wanted).
//
// Rows are split among OpenMP threads a query at a time within each head, so that the threads read the same head's
// keys and values (8 MB at n = 16384, D = 64) from the shared cache. float32 with AVX-512 (D a multiple of 16) or
// AVX2 and FMA (D a multiple of 8): vector products with the query and the output in vector registers (D up to
// 128), and a vector exp (Cephes' expf: a degree-6 polynomial after taking out powers of two, within 2 ulp); else
// plain loops (float64, other widths, other machines). On an AMD EPYC with AVX2 only, top-k's call (n = 16384, H = 8,
// D = 64, causal) took 6.5 s with the plain loops, 5.1 s of it here; with the 8-lane form about 4 s, 2.3 s here;
// with AVX2's 8 scores a step (8 keys' products summed across lanes together, not one reduction each) 3.10 s
// against 3.41 (medians of 6 interleaved calls, 2 threads; SDPA 2.72). On a 2-core Intel Xeon with AVX-512, the same
// call: 1.23× SDPA's time with a reduction of its own for every key, 1.10× with 16 keys' scores reduced together
// (vector.h's vsums), and 1.00–1.07× in three runs with each selected row's cache lines asked for a step ahead
// (`prefetch_row`), against 1.08–1.10× without in the same alternation (5 interleaved calls a run).
// Tested against the softmax written row by row in float64 (tests/native/test_native.py).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "signatures.h"  // each exported function's one declaration (written by the build)
#if defined(_OPENMP)
#include <omp.h>
#endif
#include "vector.h"  // the float32 vector and its e^x, for each instruction set

namespace {

// softmax's NaN (a NaN or +inf score) or nothing usable (zeros) for a row that has no ordinary maximum: true if so
template <typename F>
inline bool degenerate(bool bad, F top, int64_t D, F* out) {
  constexpr F NEG = -std::numeric_limits<F>::infinity();
  if (!bad && top != -NEG && top != NEG) return false;
  const F fill = top == NEG && !bad ? F(0) : std::numeric_limits<F>::quiet_NaN();
  for (int64_t c = 0; c < D; ++c) out[c] = fill;
  return true;
}

// a row's running state (`part`) before its first part: no highest score yet, nothing summed, no NaN, output 0
template <typename F>
inline void begin(F* st, int64_t D) {
  st[0] = -std::numeric_limits<F>::infinity();
  st[1] = st[2] = st[3] = 0;
  for (int64_t c = 0; c < D; ++c) st[4 + c] = 0;
}

// a row's output from its running state after its last part: NaN where a NaN or +inf score came, zeros where nothing
// usable did, else the weighted sum over the sum of the weights, a sink logit `sink` (−inf: none) adding e^(sink − M)
// to that sum and nothing to the weighted one (gpt-oss's attention sinks)
template <typename F>
inline void finish(const F* st, int64_t D, F sink, F* out) {
  if (st[2] != 0 || st[1] == 0) {
    const F fill = st[2] != 0 ? std::numeric_limits<F>::quiet_NaN() : F(0);
    for (int64_t c = 0; c < D; ++c) out[c] = fill;
    return;
  }
  const F total = st[1] + std::exp(sink - st[0]);
  for (int64_t c = 0; c < D; ++c) out[c] = st[4 + c] / total;
}

#if defined(ATTN_VECTOR)
constexpr int64_t AHEAD = 8;  // values' rows asked for this many keys ahead

// the cache lines of one row of D floats asked for now, to be read soon (a selected row's place is not one the
// hardware's prefetchers can guess)
inline void prefetch_row(const float* row, int64_t D) {
  for (int64_t c = 0; c < D; c += 16) _mm_prefetch(reinterpret_cast<const char*>(row + c), _MM_HINT_T0);
}

// a part of one float32 query row, D = LANES·C: its selected entries a … b − 1 (those among one part's keys) folded
// into the row's running state st: [highest score so far, sum of exps below it, a NaN or +inf seen, -, output (D)]
template <int C>
void part(const float* q, const float* K, const float* V, const int64_t* sel, const bool* ok, int64_t a, int64_t b,
          float scale, float* sc, float* st) {
  constexpr int64_t D = LANES * C;
  if (a >= b || st[2] != 0.0f) return;
  vec qv[C];
  for (int c = 0; c < C; ++c) qv[c] = vload(q + LANES * c);
  float top = NEG32;
  bool bad = false;
  const int64_t n = b - a;
  int64_t j = 0;
#if defined(ATTN_KEYS_AT_ONCE)
  {
    const vec vscale = vset(scale), none = vset(NEG32);
    vec vtop = none;
    for (; j + LANES <= n; j += LANES) {
      vec x[LANES];
      for (int u = 0; u < LANES; ++u) {
        if (j + LANES + u < n) prefetch_row(K + sel[a + j + LANES + u] * D, D);
        const float* kr = K + sel[a + j + u] * D;
        x[u] = vmul(qv[0], vload(kr));
        for (int c = 1; c < C; ++c) x[u] = vfmadd(qv[c], vload(kr + LANES * c), x[u]);
      }
      vec s = vmul(vsums(x), vscale);
      if (ok) s = vunless(s, ok + a + j, none);
      bad |= vany_bad(s);
      vtop = vmax(vtop, s);
      vstore(sc + j, s);
    }
    top = vmax_lanes(vtop);
  }
#endif
  for (; j < n; ++j) {
    const float* kr = K + sel[a + j] * D;
    vec x = vmul(qv[0], vload(kr));
    for (int c = 1; c < C; ++c) x = vfmadd(qv[c], vload(kr + LANES * c), x);
    float s = vsum(x) * scale;
    s = (ok && !ok[a + j]) ? NEG32 : s;
    bad |= (s != s) || s == -NEG32;
    top = s > top ? s : top;
    sc[j] = s;
  }
  if (bad) { st[2] = 1.0f; return; }  // the row's output is NaN, whatever follows
  if (top == NEG32) return;  // nothing usable here
  const float M = top > st[0] ? top : st[0];
  const float alpha = std::exp(st[0] - M);  // the state so far, rescaled to the new highest (0 before any)
  const float total = exp_less(sc, n, M);
  vec o[C];
  const vec va = vset(alpha);
  for (int c = 0; c < C; ++c) o[c] = vmul(va, vload(st + 4 + LANES * c));
  for (int64_t i = 0; i < n; ++i) {
    if (i + AHEAD < n) prefetch_row(V + sel[a + i + AHEAD] * D, D);
    const vec p = vset(sc[i]);
    const float* vr = V + sel[a + i] * D;
    for (int c = 0; c < C; ++c) o[c] = vfmadd(p, vload(vr + LANES * c), o[c]);
  }
  for (int c = 0; c < C; ++c) vstore(st + 4 + LANES * c, o[c]);
  st[0] = M;
  st[1] = st[1] * alpha + total;
}

// part<C> for C = 1 … 128 / LANES (D up to 128), by D / LANES − 1
using Part = void (*)(const float*, const float*, const float*, const int64_t*, const bool*, int64_t, int64_t, float,
                      float*, float*);
template <int... C>
constexpr std::array<Part, sizeof...(C)> part_table(std::integer_sequence<int, C...>) {
  return {&part<C + 1>...};
}
constexpr auto PARTS = part_table(std::make_integer_sequence<int, 128 / LANES>());

// part for the widths it has (D a multiple of LANES up to 128); false where there is none (whole rows instead)
inline bool part_row(const float* q, const float* K, const float* V, const int64_t* sel, const bool* ok, int64_t a,
                     int64_t b, int64_t D, float scale, float* sc, float* st) {
  if (D % LANES != 0 || D < LANES || D > 128) return false;
  PARTS[D / LANES - 1](q, K, V, sel, ok, a, b, scale, sc, st);
  return true;
}
#endif

// one query row, any type and width: q (D), keys and values (rows of D), its selection sel (kk) and flags ok (kk,
// or null: all usable). float32 at part's widths: the whole row as one part; else plain loops
template <typename F>
void one_row(const F* q, const F* K, const F* V, const int64_t* sel, const bool* ok, int64_t kk, int64_t D,
             F scale, F sink, F* sc, F* out) {
#if defined(ATTN_VECTOR)
  if constexpr (std::is_same<F, float>::value) {
    float st[4 + 128];
    begin(st, std::min<int64_t>(D, 128));
    if (part_row(q, K, V, sel, ok, 0, kk, D, scale, sc, st)) return finish(st, D, sink, out);
  }
#endif
  constexpr F NEG = -std::numeric_limits<F>::infinity();
  F top = NEG;
  bool bad = false;
  for (int64_t j = 0; j < kk; ++j) {
    const F* kr = K + sel[j] * D;
    F s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < D; ++c) s += q[c] * kr[c];
    s *= scale;
    s = (ok && !ok[j]) ? NEG : s;
    bad |= s != s;
    top = s > top ? s : top;
    sc[j] = s;
  }
  if (degenerate<F>(bad, top, D, out)) return;
  F total = std::exp(sink - top);  // the sink's share of the denominator (0 without one)
  for (int64_t j = 0; j < kk; ++j) total += (sc[j] = std::exp(sc[j] - top));
  for (int64_t c = 0; c < D; ++c) out[c] = 0;
  for (int64_t i = 0; i < kk; ++i) {
    const F p = sc[i];
    const F* vr = V + sel[i] * D;
#pragma omp simd
    for (int64_t c = 0; c < D; ++c) out[c] += p * vr[c];
  }
  for (int64_t c = 0; c < D; ++c) out[c] /= total;
}

// whether part takes rows of this type and width on this machine
template <typename F>
bool parts_take(int64_t D) {
#if defined(ATTN_VECTOR)
  return std::is_same<F, float>::value && D % LANES == 0 && D <= 128;
#else
  (void)D;
  return false;
#endif
}

template <typename F>
void selected(const F* q, const int64_t* qs, const F* k, const F* v, const int64_t* kvs, const int64_t* idx,
              const bool* ok, const int64_t* dims, F scale, const F* sinks, int64_t threads, F* scratch, F* state,
              int64_t* bounds, F* out) {
  const int64_t B = dims[0], H = dims[1], r = dims[2], D = dims[3], Hk = dims[4], S = dims[5], kk = dims[6];
  const int64_t m = dims[7], width = parts_take<F>(D) ? dims[8] : 0;
  const int64_t P = width > 0 ? (m + width - 1) / width : 0, row_state = D + 4;
  const int64_t g = H / Hk;  // query heads a key/value head serves
#pragma omp parallel num_threads(static_cast<int>(threads))
  {
    F* sc = thread_slice(scratch, kk);
    if (P > 0) {  // where each row's entries of each part begin (-1: a row not in increasing order, run whole)
#pragma omp for schedule(static)
      for (int64_t row = 0; row < B * S * r; ++row) {
        const int64_t* sel = idx + row * kk;
        int64_t* at = bounds + row * (P + 1);
        int64_t j = 0;
        bool sorted = true;
        for (int64_t i = 1; i < kk; ++i) sorted &= sel[i - 1] <= sel[i];
        for (int64_t p = 0; p < P; ++p) {
          while (j < kk && sel[j] < p * width) ++j;
          at[p] = j;
        }
        at[P] = kk;
        if (!sorted) at[0] = -1;
      }
    }
    // Every loop over a head's rows below is static over the same r rows, so each thread gets the same rows in each
    // (OpenMP's rule for static schedules of one count in one parallel region): a row's parts, its running state
    // and its output stay with one thread, and the loops need no barrier between them (nowait). With other
    // programs on the cores each barrier waits for whichever thread they hold: 2 + parts of them a head, 144 a
    // block of top-k at n = 16384 (beside two spinning programs on the 2-core EPYC the call measured no faster
    // without them, 10.2 s against 9.5, within its spread; kept, as they order nothing).
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H, s = S == 1 ? 0 : h / g;
      const F* K = k + b * kvs[0] + (h / g) * kvs[1];
      const F* V = v + b * kvs[2] + (h / g) * kvs[3];
      const int64_t* sel = idx + (b * S + s) * r * kk;
      const bool* flags = ok ? ok + (b * S + s) * r * kk : nullptr;
      const F* qh = q + b * qs[0] + h * qs[1];
      F* oh = out + bh * r * D;
      const F sink = sinks ? sinks[h] : -std::numeric_limits<F>::infinity();  // head h's sink logit, or none
      if (P == 0) {
#pragma omp for schedule(static) nowait
        for (int64_t t = 0; t < r; ++t)
          one_row<F>(qh + t * D, K, V, sel + t * kk, flags ? flags + t * kk : nullptr, kk, D, scale, sink, sc,
                     oh + t * D);
        continue;
      }
      const int64_t* at = bounds + (b * S + s) * r * (P + 1);
      // a part at a time over every row: the part's keys and values (`width` rows of each) stay in the core's cache
#pragma omp for schedule(static) nowait
      for (int64_t t = 0; t < r; ++t) begin(state + t * row_state, D);
      for (int64_t p = 0; p < P; ++p) {
#pragma omp for schedule(static) nowait
        for (int64_t t = 0; t < r; ++t) {
          const int64_t* here = at + t * (P + 1);
          if (here[0] < 0) continue;
#if defined(ATTN_VECTOR)  // (parts_take: P is 0 elsewhere)
          if constexpr (std::is_same<F, float>::value)
            part_row(qh + t * D, K, V, sel + t * kk, flags ? flags + t * kk : nullptr, here[p], here[p + 1], D, scale,
                     sc, state + t * row_state);
#endif
        }
      }
#pragma omp for schedule(static) nowait
      for (int64_t t = 0; t < r; ++t) {
        if (at[t * (P + 1)] < 0)  // not in increasing order: the whole row at once
          one_row<F>(qh + t * D, K, V, sel + t * kk, flags ? flags + t * kk : nullptr, kk, D, scale, sink, sc,
                     oh + t * D);
        else
          finish(state + t * row_state, D, sink, oh + t * D);
      }
    }
  }
}

}  // namespace

extern "C" {

// q: rows of D, its batch and head strides; k, v: rows of D, each with its batch and head strides;
// idx (B, S, r, kk) int64, every entry in [0, m); ok: the same shape, or null (every key usable);
// width: keys a part (0, or a type or width part lacks, for whole rows);
// sinks: H logits, one a query head, or null (none); scratch: threads · kk; state: r · (D + 4);
// bounds: B · S · r · (⌈m / width⌉ + 1); out (B, H, r, D)
void attn_selected_softmax_f32(const float* q, int64_t q_batch, int64_t q_head, const float* k, int64_t k_batch,
                               int64_t k_head, const float* v, int64_t v_batch, int64_t v_head, const int64_t* idx,
                               const bool* ok, int64_t B, int64_t H, int64_t r, int64_t D, int64_t Hk, int64_t S,
                               int64_t kk, int64_t m, int64_t width, float scale, const float* sinks, int64_t threads,
                               float* scratch, float* state, int64_t* bounds, float* out) {
  const int64_t qs[2] = {q_batch, q_head}, kvs[4] = {k_batch, k_head, v_batch, v_head};
  const int64_t dims[9] = {B, H, r, D, Hk, S, kk, m, width};
  selected<float>(q, qs, k, v, kvs, idx, ok, dims, scale, sinks, threads, scratch, state, bounds, out);
}

void attn_selected_softmax_f64(const double* q, int64_t q_batch, int64_t q_head, const double* k, int64_t k_batch,
                               int64_t k_head, const double* v, int64_t v_batch, int64_t v_head, const int64_t* idx,
                               const bool* ok, int64_t B, int64_t H, int64_t r, int64_t D, int64_t Hk, int64_t S,
                               int64_t kk, int64_t m, int64_t width, double scale, const double* sinks,
                               int64_t threads, double* scratch, double* state, int64_t* bounds, double* out) {
  const int64_t qs[2] = {q_batch, q_head}, kvs[4] = {k_batch, k_head, v_batch, v_head};
  const int64_t dims[9] = {B, H, r, D, Hk, S, kk, m, width};
  selected<double>(q, qs, k, v, kvs, idx, ok, dims, scale, sinks, threads, scratch, state, bounds, out);
}

}  // extern "C"

// The decode kernel (attention_decode.h): M ≤ 16 queries against N cached keys.
//
// Shape letters: B batch, M queries, N keys, Hq query heads, Hkv kv heads, G = Hq/Hkv, D head dim,
// R = G·M the query rows of one kv head (row r = g·M + i: query i of head kh·G + g).
//
// Per task (batch row b, key part [j0, j1)): the R query rows of every kv head, scaled and rotated
// (rotary encodings: q only, the keys carry their rotation: keys_rotated) in double and rounded once
// to float, Q [Hkv, R, D]. Then per block of nb keys (block_keys: 64 KiB of 16-bit K rows, rope2d
// mixed 128 KiB), while
// the next block's K and V rows are prefetched in memory order (the hardware prefetchers follow one
// sequential stream; the loads of the cache overlap the arithmetic), per kv head:
//   S [R, nb] = Q·Kᵀ on each row's visible keys, the K rows read from the cache and converted in
//   registers (F16C / AVX-512 conversions on float16, a shift on bfloat16), four keys × the rows
//   that share their keys (four on AVX-512) at a time, one reduction for the four keys of a row
//   (attention_decode_kernels-inl.h);
//   + the bias of the row's head at kp − qp (ALiBi, T5, KERPLE, Sandwich, FIRE), computed here per
//     key: −m·|Δ|; T5's weights tabulated over Δ ∈ [−(max_distance + 1), max_distance + 1] (the
//     bucket is constant beyond: those keys add one constant over their run); KERPLE and Sandwich from per-distance tables in double kept across
//     calls (kerple_table, sandwich_table: a decode step meets the last step's distances and one
//     more); FIRE's MLP on x = ψ(|Δ|)/ψ(max(L, qp)), the hidden units shared by a kv head's G heads;
//   xl: Q = scale·(q + u_h), and + Ỹ_r·s(j) per key j = kp − k_off, Ỹ_r = scale·(q + v_h)·W_h with
//     each (sin, cos) pair rotated by the query's angles (prepare_xl; the identities of
//     attention_xl_cpu.cc); per 16 keys of a block, every kv head's rows at once, a tile product
//     C·Ỹ'ᵀ (tile_gemm.h) of the task's table C of s(m), m < nt (sinusoidal_table), Ỹ' = Ỹ turned
//     by the angles of t0, the first key of the keys' window of xl_table_keys (attention_decode_xl.h),
//     transposed;
//   rope2d mixed (unrotated keys): the rows turned back by the y and high x angles of each run of
//     keys sharing them, each key turned in registers by its low x angle per head, from a table of
//     kLow rows per head (attention_decode_rope2d-inl.h: TurnBackY, TurnBackX, MixedLogits4);
//   cope (blocks walked from the last, a row's count carried across them in double): + z, the
//     interpolation of qe = q·E [R, ncol] (a tile product) at the row's count of gates σ(a) from
//     this key to its last; a row whose count reached npos − 1 adds qe[npos − 1] to every key left
//     of it without gates; a key part first counts the gates of the keys right of it (CopeCarry);
//   online softmax per row (running max m, sum l, o rescaled), o += P·V (V converted in registers,
//   shared by the rows that share their keys).
// Every K and V row is read from memory once per call, whatever G and M.
//
// Threads (flash-decoding): with B ≥ T threads each batch row is one task; else each row's keys are
// cut into P = ⌈T/B⌉ parts (at least kMinPart keys each), whose (m, l, o) are merged exactly:
// m = max m_p, l = Σ l_p·e^{m_p − m}, o = Σ o_p·e^{m_p − m}, in part order (the result depends on
// T, not on which thread ran what). out = o/l, lse = m + log l (−inf, out 0: no key).
//
// Non-finite inputs: the kernel gives up (returns false) when a logit it reads is NaN or +inf or an
// output row with finite lse is not finite; the dispatcher then runs the tile kernel, whose careful
// steps handle them (attention_tiles.h). Finite inputs pay one compare per logit and per output.
// Memory: per thread O(nb·(R + D) + Hkv·R·D) floats (xl: + nt·(X + 2·Hkv·R) + 2·Hkv·R·X, nt = xl_table_keys;
// cope: + Hkv·R·ncol); the part buffers B·P·Hkv·R·(D + 2) floats when P > 1;
// the kept tables Hq·(largest distance) floats (KERPLE), one float per distance (Sandwich), and
// rope2d mixed's, at most kMixedTableBytes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "attention/attention_decode.h"
#include "attention/attention_decode_rope2d.h"
#include "attention/attention_decode_task.h"
#include "attention/attention_tiles.h"
#include "attention/tile_gemm_bf16.h"
#include "core/fast_common.h"
#include "enc/bias/alibi/alibi_math.h"
#include "enc/bias/fire/fire_check.h"
#include "enc/bias/fire/fire_math.h"
#include "enc/bias/kerple/kerple_math.h"
#include "enc/bias/sandwich/sandwich_math.h"
#include "enc/bias/t5/t5_math.h"
#include "enc/bias/xl/xl_math.h"
#include "enc/contextual/cope/cope_math.h"
#include "enc/rotary/rotary_plan.h"
#include "posenc/half.h"
#include "posenc/threads.h"

namespace posenc {

namespace decode {
namespace {

using decode_impl::Bias;
using decode_impl::BiasKind;
using decode_impl::I;
inline std::size_t ix(I i) { return static_cast<std::size_t>(i); }

constexpr I kMaxDistance = I{1} << 24;  // |kp − qp| below this: exact in float
constexpr I kMinPart = 256;             // keys per part at least, when a unit is split

// Sandwich's head-independent part Σ_k cos(Δ·ω_k) − d̄/2 at |Δ| = 0 … n − 1 (sandwich_math.h, in
// double, rounded once), kept for the process's last (d̄, base) and grown on demand: a decode step
// meets the previous step's distances and one more, so the table costs O(d̄) a step.
std::shared_ptr<const std::vector<float>> sandwich_table(const SandwichParams& sp, I n, int threads) {
  static std::mutex mu;
  static std::shared_ptr<const std::vector<float>> table;
  static I dim = -1;
  static double base = 0;
  const std::lock_guard<std::mutex> lock(mu);
  if (dim != sp.sinusoid_dim || base != sp.base) table.reset();
  if (table && static_cast<I>(table->size()) >= n) return table;
  const I have = table ? static_cast<I>(table->size()) : 0;
  const I want = std::max(n, 2 * have);
  auto next = std::make_shared<std::vector<float>>(ix(want));
  if (have) std::copy(table->begin(), table->end(), next->begin());
  const std::vector<double> w = sandwich::freqs(sp.sinusoid_dim, sp.base);
  const int th = want - have > 4096 ? threads : 1;
#pragma omp parallel for num_threads(th) schedule(static) if (th > 1)
  for (I e = have; e < want; ++e) (*next)[ix(e)] = static_cast<float>(sandwich::shifted_inner_product(static_cast<double>(e), w));
  table = next;
  dim = sp.sinusoid_dim;
  base = sp.base;
  return table;
}

// KERPLE's bias per head at |Δ| = 0 … w − 1, [Hq, w] (kerple_math.h, in double, rounded once), kept
// for the process's last (kernel, r1, r2) and rebuilt wider on demand, as sandwich_table.
struct KerpleTable {
  std::shared_ptr<const std::vector<float>> tab;
  I w = 0;
};
KerpleTable kerple_table(bool power, const std::vector<double>& r1, const std::vector<double>& r2, I n, int threads) {
  static std::mutex mu;
  static KerpleTable kept;
  static bool kept_power = false;
  static std::vector<double> kept_r1, kept_r2;
  const std::lock_guard<std::mutex> lock(mu);
  if (kept.tab && kept_power == power && kept_r1 == r1 && kept_r2 == r2 && kept.w >= n) return kept;
  const I w = kept.tab && kept_power == power && kept_r1 == r1 && kept_r2 == r2 ? std::max(n, 2 * kept.w) : n;
  const I H = static_cast<I>(r1.size());
  auto t = std::make_shared<std::vector<float>>(ix(H * w));
  const int th = H * w > 65536 ? threads : 1;
#pragma omp parallel for num_threads(th) schedule(static) if (th > 1)
  for (I e = 0; e < w; ++e)
    for (I h = 0; h < H; ++h)
      (*t)[ix(h * w + e)] = static_cast<float>(kerple::bias(power, r1[ix(h)], r2[ix(h)], static_cast<double>(e)));
  kept = KerpleTable{t, w};
  kept_power = power;
  kept_r1 = r1;
  kept_r2 = r2;
  return kept;
}

// The largest |kp − qp| of a call, + 1: the width of a per-distance table.
I distances(const attn::Dims& d) {
  const I a = std::abs(d.k_off - d.q_off - (d.M - 1)), z = std::abs(d.k_off + d.N - 1 - d.q_off);
  return std::max(a, z) + 1;
}

// What a call's bias reads, owned (Bias points into it).
struct BiasData {
  Bias b;
  std::vector<double> slopes, sig;
  std::vector<float> t5, hs, w1, b1, w2, b2, inv;
  std::shared_ptr<const std::vector<float>> sw;
  KerpleTable kt;
};

void prepare_bias(const AttentionParams& p, const attn::Dims& d, const EncodingTensors& t, int threads,
                  BiasData* bd) {
  Bias& b = bd->b;
  const I Hq = d.Hq;
  switch (p.encoding) {
    case Encoding::kAlibi:
      if (p.alibi.variant == AlibiVariant::kLearned) {
        const std::vector<double> w = to_doubles(t.weights);  // [2, Hq]
        bd->sig.resize(w.size());
        for (std::size_t e = 0; e < w.size(); ++e) bd->sig[e] = alibi::sigmoid(w[e]);
        b.kind = BiasKind::kLearned;
        b.sig = bd->sig.data();
        b.Hq = Hq;
      } else {
        bd->slopes = t.slopes.present() ? to_doubles(t.slopes)
                                        : alibi::rule_slopes(Hq, p.alibi.variant == AlibiVariant::kNonsymmetric);
        b.kind = BiasKind::kSlopes;
        b.slopes = bd->slopes.data();
      }
      break;
    case Encoding::kT5: {
      const I nb = p.t5.num_buckets, half = p.t5.max_distance + 1, w = 2 * half + 1;
      const std::vector<double> wt = to_doubles(t.weights);  // [nb, Hq]
      bd->t5.resize(ix(Hq * w));
      for (I e = 0; e < w; ++e) {
        const I bk = t5::bucket(e - half, p.t5.bidirectional, nb, p.t5.max_distance);
        for (I h = 0; h < Hq; ++h) bd->t5[ix(h * w + e)] = static_cast<float>(wt[ix(bk * Hq + h)]);
      }
      b.kind = BiasKind::kT5;
      b.t5 = bd->t5.data();
      b.t5_half = half;
      break;
    }
    case Encoding::kKerple: {
      const bool power = p.kerple.kernel == KerpleKernel::kPower;
      bd->kt = kerple_table(power, to_doubles(t.r1), to_doubles(t.r2), distances(d), threads);
      b.kind = power ? BiasKind::kKerplePower : BiasKind::kKerpleLog;
      b.kt = bd->kt.tab->data();
      b.kt_w = bd->kt.w;
      break;
    }
    case Encoding::kSandwich: {
      bd->sw = sandwich_table(p.sandwich, distances(d), threads);
      bd->hs.resize(ix(Hq));
      for (I h = 0; h < Hq; ++h) bd->hs[ix(h)] = static_cast<float>(sandwich::head_scale(h, Hq));
      b.kind = BiasKind::kSandwich;
      b.sw = bd->sw->data();
      b.hs = bd->hs.data();
      break;
    }
    case Encoding::kFire: {
      const fire::Values v = fire::values(t.fire);
      bd->w1.assign(v.w1.begin(), v.w1.end());
      bd->b1.assign(v.b1.begin(), v.b1.end());
      bd->w2.assign(v.w2.begin(), v.w2.end());
      bd->b2.assign(v.b2.begin(), v.b2.end());
      bd->inv.resize(ix(d.M));
      for (I i = 0; i < d.M; ++i)
        bd->inv[ix(i)] = static_cast<float>(1.0 / fire::psi(v.c, fire::norm_arg(v.L, d.q_off + i)));
      b.kind = BiasKind::kFire;
      b.w1 = bd->w1.data();
      b.b1 = bd->b1.data();
      b.w2 = bd->w2.data();
      b.b2 = bd->b2.data();
      b.W = static_cast<I>(v.w1.size());
      b.c = static_cast<float>(v.c);
      b.inv = bd->inv.data();
      break;
    }
    default: break;
  }
}

// What xl and cope add to a call, prepared once: xl's u, v [Hq, D] in double and W [Hq, D, X] in
// float (read in place where it is a contiguous float32 tensor: a decode step reads it once); cope's
// table E [npos, D] in float.
struct PosData {
  I X = 0;                  // xl: the sinusoid's dimension (0: not xl)
  std::vector<double> u, v;
  std::vector<float> own;   // W converted, where it is not read in place
  const float* w = nullptr;
  I npos = 0, ncol = 0;     // cope: table rows (0: not cope), the rows a count reaches
  std::vector<float> e;
  attn_fast::TileGemmFn gemm = nullptr;  // the product's: tile_gemm_for(X) (xl), (D) (cope)
  attn_fast::TileTransposeFn tr = nullptr;  // xl: tile_transpose_fn()
  std::optional<attn_fast::BlasOneThread> one;  // where that is OpenBLAS: one thread in each task

  PosData(const AttentionParams& p, const attn::Dims& d, const EncodingTensors& t) {
    if (p.encoding == Encoding::kXL) {
      X = d.R;
      u = to_doubles(t.u);
      v = to_doubles(t.v);
      gemm = attn_fast::tile_gemm_for(X);
      tr = attn_fast::tile_transpose_fn();
      if (t.rel_proj.dtype == DType::kF32 && t.rel_proj.is_contiguous()) {
        w = static_cast<const float*>(t.rel_proj.data);
      } else {
        const std::vector<double> x = to_doubles(t.rel_proj);
        own.assign(x.begin(), x.end());
        w = own.data();
      }
    } else if (p.encoding == Encoding::kCope) {
      npos = d.npos;
      ncol = cope::rows_reached(npos, d.N);
      const std::vector<double> x = to_doubles(t.table);
      e.assign(x.begin(), x.begin() + ncol * d.D);
      gemm = attn_fast::tile_gemm_for(d.D);
    } else {
      return;
    }
    if (!gemm) one.emplace();
  }
};

// xl's query rows of (b, kh) from x [M, G, D] (q, in double): Q = scale·(q + u_h) and Ỹ (columns of
// Ỹᵀ [X, Hkv·R]): Y =
// (q + v_h)·W_h (a float tile product, as the tile kernel's), each (sin, cos) pair rotated by the
// query's angles α = ω·(qp − k_off) and scaled, so that Ỹ·s(j) = scale·Y·s(qp − kp) for key j = kp −
// k_off (the angle-difference identities; docs/attention.md).
void prepare_xl(const attn::Dims& d, const PosData& xl, I kh, const std::vector<double>& x, float* Q, float* Qu, float* Yt) {
  const I ldy = d.Hkv * d.G * d.M;  // Ỹ is kept transposed, [X, Hkv·R]: Yt points at (kh·R)'s column
  const I M = d.M, G = d.G, D = d.D, X = d.R;
  std::vector<float> qv(ix(M * D)), y(ix(M * X));
  std::vector<double> s(ix(M * X));
  for (I i = 0; i < M; ++i)
    for (I c = 0; c < X; ++c)
      s[ix(i * X + c)] = sinusoid::value(static_cast<double>(d.q_off + i - d.k_off), c, X, xl::kBase);
  for (I g = 0; g < G; ++g) {
    const I h = kh * G + g;
    for (I i = 0; i < M; ++i)
      for (I e = 0; e < D; ++e) {
        const double xe = x[ix((i * G + g) * D + e)];
        Q[(g * M + i) * D + e] = static_cast<float>(d.scale * (xe + xl.u[ix(h * D + e)]));
        if (Qu) Qu[(g * M + i) * D + e] = static_cast<float>(xe + xl.u[ix(h * D + e)]);
        qv[ix(i * D + e)] = static_cast<float>(xe + xl.v[ix(h * D + e)]);
      }
    attn_fast::tile_gemm(xl.gemm, attn_fast::GemmForm::kNP, M, X, D, 1.f, qv.data(), D, xl.w + h * D * X, X, y.data(), X);
    for (I i = 0; i < M; ++i)
      for (I c = 0; c < X; c += 2) {  // s = (sin α, cos α)
        double t0, t1;
        xl::to_key_frame<double>(y[ix(i * X + c)], y[ix(i * X + c + 1)], s[ix(i * X + c)], s[ix(i * X + c + 1)], &t0, &t1);
        float* o = Yt + c * ldy + g * M + i;
        o[0] = static_cast<float>(d.scale * t0);
        o[ldy] = static_cast<float>(d.scale * t1);
      }
  }
}

// cope's qe [R, ncol] of (b, kh) from x [M, G, D] (q, in double): q_i·e_c at row g·M + i (q
// unscaled; a float tile product, as the tile kernel's).
void prepare_cope(const attn::Dims& d, const PosData& pd, const std::vector<double>& x, float* qe) {
  const I M = d.M, G = d.G, D = d.D;
  std::vector<float> qf(ix(G * M * D));
  for (I i = 0; i < M; ++i)
    for (I g = 0; g < G; ++g)
      for (I e = 0; e < D; ++e) qf[ix((g * M + i) * D + e)] = static_cast<float>(x[ix((i * G + g) * D + e)]);
  attn_fast::tile_gemm(pd.gemm, attn_fast::GemmForm::kNT, G * M, pd.ncol, D, 1.f, qf.data(), D, pd.e.data(), D, qe, pd.ncol);
}

// Q [R, D] of (b, kh): q_i of head kh·G + g, rotated (rotary encodings; in double, as the reference)
// and scaled, at row g·M + i; Qu (unless null): the same rows unscaled; xl: its Q and Ỹ (prepare_xl);
// cope: qe [R, ncol] (prepare_cope).
void prepare_q(const attn::Dims& d, const View& q, I b, I kh, const PosData& pd, float* Q, float* Qu, float* Yt,
               float* qe) {
  const I M = d.M, G = d.G, D = d.D;
  std::vector<double> x(ix(M * G * D));  // [1, M, G, D]
  std::vector<float> row(ix(M * D));       // head kh·G + g's M rows
  for (I g = 0; g < G; ++g) {
    attn_fast::load_rows(q, D, b, 0, M, kh * G + g, row.data());
    for (I i = 0; i < M; ++i)
      for (I e = 0; e < D; ++e) x[ix((i * G + g) * D + e)] = row[ix(i * D + e)];
  }
  if (d.rotary) {  // (rope2d mixed's keys, rotated in the task, carry no scale: its plan's a is 1)
    const I A = static_cast<I>(d.q_ids.size()) / (d.B * M);
    const std::vector<I> ids(d.q_ids.begin() + b * A * M, d.q_ids.begin() + (b + 1) * A * M);
    rotary::rotate_ref(d.rot, &x, 1, M, G, D, ids, +1, +1, kh * G);
  }
  if (pd.X) return prepare_xl(d, pd, kh, x, Q, Qu, Yt);
  if (pd.npos) prepare_cope(d, pd, x, qe);
  for (I i = 0; i < M; ++i)
    for (I g = 0; g < G; ++g)
      for (I e = 0; e < D; ++e) {
        const double xe = x[ix((i * G + g) * D + e)];
        Q[(g * M + i) * D + e] = static_cast<float>(d.scale * xe);
        if (Qu) Qu[(g * M + i) * D + e] = static_cast<float>(xe);
      }
}

// The bfloat16 rate of a call as decode_impl::Task::dp: 1 VDPBF16PS, 2 its emulation, 0 none.
int bf16_rate(const AttentionParams& p, const attn::Dims& d, DType dt) {
  const std::string name = bf16_products(p, d.D, dt);
  return name == "vdpbf16" ? 1 : name == "emulated" ? 2 : 0;
}

// x [n] as hi + lo, each rounded to bfloat16 (to nearest even); returns whether every lo is 0.
bool split_bf16(const float* x, I n, std::uint16_t* hi, std::uint16_t* lo) {
  bool exact = true;
  for (I e = 0; e < n; ++e) {
    const bf16 h = to_bf16(x[e]), l = to_bf16(x[e] - to_float(h));
    hi[e] = h.bits, lo[e] = l.bits;
    exact = exact && to_float(l) == 0.f;
  }
  return exact;
}

}  // namespace

// bfloat16 q, k, v with bf16_rate, an even D, not rope2d mixed (its keys turned per head), and the
// VDPBF16PS kernels chosen for this CPU (tile_gemm_bf16.h: AMD CPUs with AVX512_BF16, or their
// emulation for tests).
std::string bf16_products(const AttentionParams& p, I D, DType dt) {
  const bool mixed = p.encoding == Encoding::kRope2d && p.rope2d.variant == Rope2dVariant::kMixed;
  const attn_fast::Bf16Ops* ops = attn_fast::bf16_ops();
  if (dt != DType::kBF16 || !p.bf16_rate || D % 2 != 0 || mixed || !ops) return "";
  const std::string name = ops->name;
  return name == "vdpbf16" || name == "emulated" ? name : "";
}

bool covers(const AttentionParams& p, const attn::Dims& d, const View& q, const View& k, const View& v) {
  if (d.M < 1 || d.M > kMaxQueries || d.N < 1) return false;
  switch (p.encoding) {
    case Encoding::kNope: case Encoding::kAlibi: case Encoding::kT5: case Encoding::kKerple:
    case Encoding::kSandwich: case Encoding::kFire: case Encoding::kXL: case Encoding::kCope:
      break;
    case Encoding::kRope2d:  // mixed: the keys rotated per head here (keys_rotated is refused for it)
      if (p.rope2d.variant == Rope2dVariant::kMixed) {
        if (!decode_impl::mixed_fits(d)) return false;
        break;
      }
      [[fallthrough]];
    case Encoding::kRope: case Encoding::kXpos: case Encoding::kMrope:
      if (!p.keys_rotated) return false;
      break;
    default: return false;
  }
  if (!fast::fast_dtype(q.dtype)) return false;
  if ((k.strides[3] != 1 || v.strides[3] != 1) && d.D > 1) return false;
  const I lo = d.k_off - d.q_off - (d.M - 1), hi = d.k_off + d.N - 1 - d.q_off;
  return std::abs(lo) < kMaxDistance && std::abs(hi) < kMaxDistance;
}

int threads_for(const attn::Dims& d) {
  return d.B * d.Hkv * d.N * d.D < fast::kParallelMin ? 1 : std::max(1, num_threads());
}

bool forward(const AttentionParams& p, const attn::Dims& d, const View& q, const View& k, const View& v,
             const EncodingTensors& t, const View& out, const View& lse, int threads) {
  const I B = d.B, M = d.M, N = d.N, G = d.G, D = d.D, Hkv = d.Hkv, R = G * M;
  BiasData bd;
  prepare_bias(p, d, t, threads, &bd);
  const PosData pd(p, d, t);
  const I X = pd.X, ncol = pd.ncol;
  const bool mixed = d.rotary && d.rot.per_head();  // rope2d mixed: the tables of the keys' rotations
  const std::shared_ptr<const decode_impl::MixedData> md = mixed ? decode_impl::mixed_tables(d, threads) : nullptr;
  const int dp = bf16_rate(p, d, q.dtype);
  // visible keys per row r = g·M + i (and head): causal / nonsymmetric ALiBi's halves
  std::vector<I> lo(ix(Hkv * R)), hi(ix(Hkv * R));
  const bool nonsym = p.encoding == Encoding::kAlibi && p.alibi.variant == AlibiVariant::kNonsymmetric;
  for (I kh = 0; kh < Hkv; ++kh)
    for (I r = 0; r < R; ++r) {
      const I h = kh * G + r / M, qp = d.q_off + r % M;
      const bool past = p.causal || (nonsym && h < d.Hq / 2), fut = nonsym && h >= d.Hq / 2;
      lo[ix(kh * R + r)] = fut ? std::clamp<I>(qp - d.k_off, 0, N) : 0;
      hi[ix(kh * R + r)] = past ? std::clamp<I>(qp - d.k_off + 1, 0, N) : N;
    }
  // tasks: (batch row, key part); a row's keys are split in P parts when there are fewer rows than
  // threads (flash-decoding)
  I P = 1;
  if (B < threads) P = std::max<I>(1, std::min<I>((threads + B - 1) / B, N / kMinPart));
  const I tasks = B * P, HR = Hkv * R, per = HR * (D + 2);  // per: a task's m, l [HR], o [HR, D]
  std::vector<float> parts(P > 1 ? ix(tasks * per) : 0);
  std::atomic<bool> bad{false};
  const std::size_t esz = dtype_size(q.dtype);
  const int th = static_cast<int>(std::min<I>(threads, tasks));
  // a task's finished rows (o normalised in place) into out and lse
  const auto store = [&](I b, I kh, I r, float mr, float lr, float* o) {
    const I h = kh * G + r / M, i = r % M;
    double ls = -HUGE_VAL;
    if (lr > 0) {
      const float inv = 1.f / lr;
      for (I e = 0; e < D; ++e) {
        o[e] *= inv;
        if (!std::isfinite(o[e])) bad = true;
      }
      ls = static_cast<double>(mr) + std::log(static_cast<double>(lr));
    } else {
      std::fill(o, o + D, 0.f);
    }
    attn_fast::store_row(out, D, b, i, h, o);
    if (lse.present())
      static_cast<double*>(lse.data)[b * lse.strides[0] + h * lse.strides[1] + i * lse.strides[2]] = ls;
  };
#pragma omp parallel num_threads(th) if (th > 1)
  {
    std::vector<float> scratch(ix(decode_impl::scratch_floats(Hkv, D, R, X, mixed))), Q(ix(HR * D)), Yt(ix(HR * X));
    std::vector<float> qe(ix(HR * ncol)), mine(P > 1 ? 0 : ix(per)), Qu(dp ? ix(HR * D) : 0);
    std::vector<std::uint16_t> qhi(Qu.size()), qlo(Qu.size());
#pragma omp for schedule(static)
    for (I task = 0; task < tasks; ++task) {
      if (bad.load(std::memory_order_relaxed)) continue;
      const I b = task / P, part = task % P;
      for (I kh = 0; kh < Hkv; ++kh)
        prepare_q(d, q, b, kh, pd, &Q[ix(kh * R * D)], dp ? &Qu[ix(kh * R * D)] : nullptr, X ? Yt.data() + kh * R : nullptr,
                  ncol ? qe.data() + kh * R * ncol : nullptr);
      decode_impl::Task tk{D, G, M, d.Hq, Hkv, q.dtype, Q.data(),
                           static_cast<const char*>(k.data) + ix(b * k.strides[0]) * esz,
                           static_cast<const char*>(v.data) + ix(b * v.strides[0]) * esz,
                           k.strides[1], k.strides[2], v.strides[1], v.strides[2],
                           N * part / P, N * (part + 1) / P, lo.data(), hi.data(), d.q_off, d.k_off, &bd.b};
      tk.X = X, tk.yt = Yt.data(), tk.gemm = pd.gemm, tk.tr = pd.tr;
      tk.npos = pd.npos, tk.ncol = ncol, tk.qe = qe.data();
      const decode_impl::MixedKeys mk = mixed ? md->row(d, b) : decode_impl::MixedKeys{};
      if (mixed) tk.mixed = &mk;
      if (dp) {
        tk.dp = dp, tk.qscale = static_cast<float>(d.scale), tk.qhi = qhi.data();
        tk.qlo = split_bf16(Qu.data(), HR * D, qhi.data(), qlo.data()) ? nullptr : qlo.data();
      }
      float* res = P > 1 ? &parts[ix(task * per)] : mine.data();
      if (!decode_impl::run_task(tk, scratch.data(), res, res + HR, res + 2 * HR)) {
        bad = true;
        continue;
      }
      if (P == 1)
        for (I x = 0; x < HR; ++x) store(b, x / R, x % R, res[x], res[HR + x], res + 2 * HR + x * D);
    }
  }
  if (bad) return false;
  if (P > 1) {  // merge the parts of each batch row, in part order
    std::vector<float> o(ix(D));
    for (I b = 0; b < B; ++b)
      for (I x = 0; x < HR; ++x) {
        float mx = -HUGE_VALF, l = 0;
        for (I pt = 0; pt < P; ++pt) mx = std::max(mx, parts[ix((b * P + pt) * per + x)]);
        std::fill(o.begin(), o.end(), 0.f);
        if (mx > -HUGE_VALF)
          for (I pt = 0; pt < P; ++pt) {
            const float* res = &parts[ix((b * P + pt) * per)];
            if (res[x] == -HUGE_VALF) continue;
            const float c = std::exp(res[x] - mx);
            l += res[HR + x] * c;
            const float* op = res + 2 * HR + x * D;
            for (I e = 0; e < D; ++e) o[ix(e)] += op[e] * c;
          }
        store(b, x / R, x % R, mx, l, o.data());
      }
    if (bad) return false;
  }
  return true;
}

Status attention_forward(const AttentionParams& p, const View& q, const View& k, const View& v,
                         const EncodingTensors& t, const View& out, const View& lse) {
  attn::Dims d;
  POSENC_RETURN_IF_ERROR(attn::validate_forward(p, q, k, v, t, out, lse, &d));
  if (!covers(p, d, q, k, v))
    return Status::Invalid("encoding", "the decode kernel does not take " + attn::describe(p) + " on " +
                                           dtype_name(q.dtype) + " with M = " + std::to_string(d.M));
  const attn_fast::BlasOneThread one;
  if (!forward(p, d, q, k, v, t, out, lse, std::max(1, num_threads())))
    return Status::Invalid("k", "a NaN or infinite value: the decode kernel leaves such calls to the tile kernel");
  return Status::Ok();
}

}  // namespace decode
}  // namespace posenc

// The decode kernel's per-call preparation (attention_decode_prep.h): the bias's tables and the query
// rows of each kv head.
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
#include "attention/attention_decode_prep.h"

namespace posenc::decode_prep {
namespace {

using decode_impl::BiasKind;
inline std::size_t ix(I i) { return static_cast<std::size_t>(i); }

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

}  // namespace

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

}  // namespace posenc::decode_prep

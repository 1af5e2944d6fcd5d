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
//     of it without gates (every row there: the blocks left walked in memory order); a key part
//     first counts the gates of the keys right of it (CopeCarry);
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
#include <optional>
#include <string>

#include "attention/attention_decode.h"
#include "attention/attention_decode_prep.h"
#include "attention/attention_decode_rope2d.h"
#include "attention/attention_decode_task.h"
#include "attention/attention_tiles.h"
#include "attention/tile_gemm_bf16.h"
#include "core/fast_common.h"
#include "enc/rotary/rotary_plan.h"
#include "posenc/half.h"
#include "posenc/threads.h"

namespace posenc {

namespace decode {
namespace {

using decode_impl::I;
using decode_prep::BiasData;
using decode_prep::PosData;
using decode_prep::prepare_bias;
using decode_prep::prepare_q;
inline std::size_t ix(I i) { return static_cast<std::size_t>(i); }

constexpr I kMaxDistance = I{1} << 24;  // |kp − qp| below this: exact in float
constexpr I kMinPart = 256;             // keys per part at least, when a unit is split

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
  if (d.B < 1 || d.M < 1 || d.M > kMaxQueries || d.N < 1) return false;  // B = 0: nothing to do (the general path)
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

namespace {

// Each row's visible keys [lo, hi), row r = g·M + i of kv head kh at kh·R + r: causal, or
// nonsymmetric ALiBi's halves (the first half of the heads the past, the second the future).
void visible_keys(const AttentionParams& p, const attn::Dims& d, std::vector<I>* lo, std::vector<I>* hi) {
  const I G = d.G, M = d.M, N = d.N, R = G * M;
  lo->assign(ix(d.Hkv * R), 0);
  hi->assign(ix(d.Hkv * R), 0);
  const bool nonsym = p.encoding == Encoding::kAlibi && p.alibi.variant == AlibiVariant::kNonsymmetric;
  for (I kh = 0; kh < d.Hkv; ++kh)
    for (I r = 0; r < R; ++r) {
      const I h = kh * G + r / M, qp = d.q_off + r % M;
      const bool past = p.causal || (nonsym && h < d.Hq / 2), fut = nonsym && h >= d.Hq / 2;
      (*lo)[ix(kh * R + r)] = fut ? std::clamp<I>(qp - d.k_off, 0, N) : 0;
      (*hi)[ix(kh * R + r)] = past ? std::clamp<I>(qp - d.k_off + 1, 0, N) : N;
    }
}

// A task's finished row (batch row b, row r of kv head kh: m = mr, l = lr, o unnormalised, normalised
// in place) into out and lse. false where o comes out not finite.
bool store_result(const attn::Dims& d, const View& out, const View& lse, I b, I kh, I r, float mr, float lr, float* o) {
  const I D = d.D, h = kh * d.G + r / d.M, i = r % d.M;
  bool finite = true;
  double ls = -HUGE_VAL;
  if (lr > 0) {
    const float inv = 1.f / lr;
    for (I e = 0; e < D; ++e) {
      o[e] *= inv;
      if (!std::isfinite(o[e])) finite = false;
    }
    ls = static_cast<double>(mr) + std::log(static_cast<double>(lr));
  } else {
    std::fill(o, o + D, 0.f);
  }
  attn_fast::store_row(out, D, b, i, h, o);
  if (lse.present())
    static_cast<double*>(lse.data)[b * lse.strides[0] + h * lse.strides[1] + i * lse.strides[2]] = ls;
  return finite;
}

// The P parts of each batch row's keys (parts: task b·P + part's m, l [HR] and o [HR, D]) merged in
// part order and stored. false where a row comes out not finite.
bool merge_parts(const attn::Dims& d, const View& out, const View& lse, I P, const std::vector<float>& parts) {
  const I D = d.D, R = d.G * d.M, HR = d.Hkv * R, per = HR * (D + 2);
  bool finite = true;
  std::vector<float> o(ix(D));
  for (I b = 0; b < d.B; ++b)
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
      if (!store_result(d, out, lse, b, x / R, x % R, mx, l, o.data())) finite = false;
    }
  return finite;
}

}  // namespace

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
  std::vector<I> lo, hi;
  visible_keys(p, d, &lo, &hi);
  // tasks: (batch row, key part); a row's keys are split in P parts when there are fewer rows than
  // threads (flash-decoding)
  I P = 1;
  if (B < threads) P = std::max<I>(1, std::min<I>((threads + B - 1) / B, N / kMinPart));
  const I tasks = B * P, HR = Hkv * R, per = HR * (D + 2);  // per: a task's m, l [HR], o [HR, D]
  std::vector<float> parts(P > 1 ? ix(tasks * per) : 0);
  std::atomic<bool> bad{false};
  const std::size_t esz = dtype_size(q.dtype);
  const int th = static_cast<int>(std::min<I>(threads, tasks));
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
        for (I x = 0; x < HR; ++x)
          if (!store_result(d, out, lse, b, x / R, x % R, res[x], res[HR + x], res + 2 * HR + x * D)) bad = true;
    }
  }
  if (bad) return false;
  return P == 1 || merge_parts(d, out, lse, P, parts);
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

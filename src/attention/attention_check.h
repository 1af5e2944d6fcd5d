// Private: the validation that the reference (attention_ref.cc) and the fused dispatcher
// (attention_cpu.cc) share, so both give the same Status for the same bad input. Checks everything
// before anything is written; fills Dims (sizes, scale, offsets, per-encoding sizes).
#pragma once

#include <algorithm>
#include <climits>
#include <initializer_list>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "core/format.h"
#include "core/overlap.h"
#include "enc/bias/fire/fire_check.h"
#include "enc/bias/kerple/kerple_check.h"
#include "enc/rotary/rope/rope_check.h"
#include "enc/rotary/rotary_plan.h"
#include "posenc/attention.h"

namespace posenc::attn {

using I = std::int64_t;

inline std::string str(I x) { return std::to_string(x); }

struct Dims {
  I B = 0, M = 0, N = 0, Hq = 0, Hkv = 0, D = 0, G = 1;
  double scale = 1;
  I q_off = 0, k_off = 0;
  // Rotary encodings (rope, rope2d, mrope, xpos): the call's plan (rotary_plan.h; call length: the
  // largest query or key position component + 1) and the positions it reads, [B, axes, M] and
  // [B, axes, N]; *_batched: the positions differ per batch row (else every row holds row 0's).
  bool rotary = false;
  rotary::Plan rot;
  std::vector<I> q_ids, k_ids;
  bool q_batched = false, k_batched = false;
  I R = 0;     // xl: sinusoid dimension
  I npos = 0;  // cope: table rows
  I fire_w = 0;  // fire: hidden units of the MLP
};

// ---- validation --------------------------------------------------------------------------------
inline Status require_tensor(const char* arg, const View& t, std::initializer_list<std::int64_t> shape) {
  POSENC_RETURN_IF_ERROR(require_float(arg, t, static_cast<int>(shape.size())));
  return require_shape(arg, t, shape);
}

// Which encoding tensors (and so which gradients) an encoding reads.
struct Reads {
  bool slopes = false, weights = false, xl = false, table = false;
  bool kerple = false, fire = false;
  bool freqs = false, positions = false;  // rope2d mixed; rope2d and mrope
};
inline Reads reads(const AttentionParams& p) {
  Reads r;
  const bool alibi = p.encoding == Encoding::kAlibi;
  r.slopes = alibi && p.alibi.variant != AlibiVariant::kLearned;
  r.weights = (alibi && p.alibi.variant == AlibiVariant::kLearned) || p.encoding == Encoding::kT5;
  r.xl = p.encoding == Encoding::kXL;
  r.table = p.encoding == Encoding::kCope;
  r.kerple = p.encoding == Encoding::kKerple;
  r.fire = p.encoding == Encoding::kFire;
  r.freqs = p.encoding == Encoding::kRope2d && p.rope2d.variant == Rope2dVariant::kMixed;
  r.positions = p.encoding == Encoding::kRope2d || p.encoding == Encoding::kMrope;
  return r;
}
inline bool is_rotary(Encoding e) {
  return e == Encoding::kRope || e == Encoding::kRope2d || e == Encoding::kMrope || e == Encoding::kXpos;
}
inline std::string describe(const AttentionParams& p) {
  std::string s = encoding_info(p.encoding).name;
  if (p.encoding == Encoding::kAlibi) s += std::string(" (") + alibi_variant_name(p.alibi.variant) + ")";
  if (p.encoding == Encoding::kKerple) s += std::string(" (") + kerple_kernel_name(p.kerple.kernel) + ")";
  if (p.encoding == Encoding::kRope2d) s += std::string(" (") + rope2d_variant_name(p.rope2d.variant) + ")";
  return s;
}

// The positions a rotary encoding reads and its plan (see docs/attention.md): 1D q_off + i, k_off + j, or
// the multi-dimensional q_positions / k_positions of rope2d and mrope (absent: the 1D position in
// every component).
inline Status check_rotary(const AttentionParams& p, const EncodingTensors& t, Dims* d) {
  const int axes = p.encoding == Encoding::kRope2d ? 2 : p.encoding == Encoding::kMrope ? 3 : 1;
  auto side = [&](const char* arg, const View& ids, I off, I n, std::vector<I>* out, bool* batched) -> Status {
    if (axes > 1) {
      auto e = expand_positions_axes(arg, Positions{ids, ids.present() ? 0 : off}, axes, d->B, n);
      if (!e.ok()) return e.status();
      *out = std::move(e).value();
      *batched = ids.present() && ids.ndim == 3;
    } else {
      out->resize(static_cast<std::size_t>(d->B * n));
      for (I b = 0; b < d->B; ++b)
        for (I i = 0; i < n; ++i) (*out)[static_cast<std::size_t>(b * n + i)] = off + i;
      *batched = false;
    }
    return Status::Ok();
  };
  POSENC_RETURN_IF_ERROR(side("q_positions", t.q_positions, d->q_off, d->M, &d->q_ids, &d->q_batched));
  POSENC_RETURN_IF_ERROR(side("k_positions", t.k_positions, d->k_off, d->N, &d->k_ids, &d->k_batched));
  // The call's own length: the largest query or key position (component) + 1 (see docs/rope.md).
  const I call_len = std::max<I>(0, std::max(rotary::call_length(d->q_ids), rotary::call_length(d->k_ids)));
  auto build = [&]() -> Expected<rotary::Plan> {
    switch (p.encoding) {
      case Encoding::kRope2d: return rotary::rope2d_plan(p.rope2d, d->D, call_len, t.freqs, d->Hq);
      case Encoding::kMrope: return rotary::mrope_plan(p.mrope, d->D, call_len);
      case Encoding::kXpos: {
        // The centre cancels in q·k; by default the middle of the call's positions, lo + ⌈(hi + 1 −
        // lo)/2⌉ (torchscale's ⌈n/2⌉ when they start at 0), so that a window far from 0 keeps its
        // scales near 1. With seq_len, ⌈seq_len/2⌉ as in xpos_forward.
        XposParams xp = p.xpos;
        if (!xp.center && xp.rope.seq_len == 0 && d->M + d->N > 0) {
          I lo = INT64_MAX, hi = INT64_MIN;
          for (const std::vector<I>* ids : {&d->q_ids, &d->k_ids})
            for (I v : *ids) lo = std::min(lo, v), hi = std::max(hi, v);
          xp.center = lo + (hi - lo + 2) / 2;
        }
        return rotary::xpos_plan(xp, d->D, call_len);
      }
      default: return rotary::rope_plan(p.rope, d->D, call_len);
    }
  };
  Expected<rotary::Plan> pl = build();
  if (!pl.ok()) return pl.status();
  d->rot = std::move(pl).value();
  d->rotary = true;
  return Status::Ok();
}

// The limits on a call's sizes (docs/reliability.md, Limits): a head dimension D beyond kMaxHeadDim,
// or a tensor or workspace of more than kMaxElements elements, is refused before anything is
// allocated. The workspaces: the keys expanded to every query head, [B, N, Hq, D] (the reference),
// and one row per query head and distance, [Hq, M + N] (the bias tables).
constexpr I kMaxHeadDim = I{1} << 12;
constexpr I kMaxElements = I{1} << 40;

// The product of xs when it is at most kMaxElements, else -1 (an overflow included).
inline I bounded_product(std::initializer_list<I> xs) {
  I n = 1;
  for (I x : xs)
    if (__builtin_mul_overflow(n, x, &n) || n > kMaxElements) return -1;
  return n;
}

inline Status check_sizes(const Dims& d) {
  if (d.D > kMaxHeadDim)
    return Status::OutOfRange("q", "head dimension D = " + str(d.D) + " is beyond the limit 4096 (2^12)");
  const std::pair<const char*, I> sizes[] = {
      {"q", bounded_product({d.B, d.M, d.Hq, d.D})},
      {"k", bounded_product({d.B, d.N, d.Hkv, d.D})},
      {"k", bounded_product({d.B, d.N, d.Hq, d.D})},
      {"k", bounded_product({d.Hq, d.M + d.N})}};
  const char* what[] = {"q has more than 2^40 elements", "k has more than 2^40 elements",
                        "k expanded to the Hq query heads ([B, N, Hq, D]) has more than 2^40 elements",
                        "the distance tables [Hq, M + N] have more than 2^40 elements"};
  for (std::size_t i = 0; i < 4; ++i)
    if (sizes[i].second < 0)
      return Status::OutOfRange(sizes[i].first, std::string(what[i]) + " (the limit of one call; shape " +
                                                    "B = " + str(d.B) + ", M = " + str(d.M) + ", N = " +
                                                    str(d.N) + ", Hq = " + str(d.Hq) + ", D = " + str(d.D) + ")");
  return Status::Ok();
}

// The encoding is one attention takes; q, k, v are float [B, M, Hq, D], [B, N, Hkv, D], [B, N, Hkv, D]
// of one dtype within the size limits: d's shape letters.
inline Status check_shapes(const AttentionParams& p, const View& q, const View& k, const View& v, Dims* d) {
  switch (p.encoding) {
    case Encoding::kNope: case Encoding::kRope: case Encoding::kAlibi: case Encoding::kT5:
    case Encoding::kXL: case Encoding::kCope:
    case Encoding::kKerple: case Encoding::kSandwich: case Encoding::kFire:
    case Encoding::kRope2d: case Encoding::kMrope: case Encoding::kXpos:
      break;
    case Encoding::kLearned: case Encoding::kSinusoidal:
      return Status::Invalid("encoding", encoding_info(p.encoding).name +
                                             " is absolute: add it to the embeddings (posenc apply), "
                                             "not inside attention");
    default:
      return Status::Invalid("encoding", "unknown encoding id " + str(static_cast<int>(p.encoding)));
  }
  POSENC_RETURN_IF_ERROR(require_float("q", q, 4));
  POSENC_RETURN_IF_ERROR(require_float("k", k, 4));
  POSENC_RETURN_IF_ERROR(require_float("v", v, 4));
  d->B = q.dim(0);
  d->M = q.dim(1);
  d->Hq = q.dim(2);
  d->D = q.dim(3);
  d->N = k.dim(1);
  d->Hkv = k.dim(2);
  if (d->Hq < 1) return Status::Invalid("q", "expected at least one head, got shape " + q.shape_str());
  if (d->D < 1)
    return Status::Invalid("q", "expected head dimension D >= 1, got shape " + q.shape_str());
  POSENC_RETURN_IF_ERROR(require_shape("k", k, {d->B, -1, -1, d->D}));
  if (d->Hkv < 1) return Status::Invalid("k", "expected at least one head, got shape " + k.shape_str());
  if (d->Hq % d->Hkv != 0)
    return Status::Invalid("k", "query heads Hq = " + str(d->Hq) +
                                    " must be a multiple of key/value heads Hkv = " + str(d->Hkv));
  d->G = d->Hq / d->Hkv;
  POSENC_RETURN_IF_ERROR(require_shape("v", v, {d->B, d->N, d->Hkv, d->D}));
  POSENC_RETURN_IF_ERROR(require_same_dtype("k", k, q, "q"));
  POSENC_RETURN_IF_ERROR(require_same_dtype("v", v, q, "q"));
  POSENC_RETURN_IF_ERROR(check_sizes(*d));

  return Status::Ok();
}

// scale, k_offset, q_offset and keys_rotated: d's scale and offsets.
inline Status check_positions(const AttentionParams& p, Dims* d) {
  d->scale = 1.0 / std::sqrt(static_cast<double>(d->D));
  if (p.scale) {
    if (!std::isfinite(*p.scale) || *p.scale <= 0)
      return Status::Invalid("scale", "expected a finite value > 0, got " + format_number(*p.scale));
    d->scale = *p.scale;
  }
  constexpr I kMaxOffset = I{1} << 53;  // positions stay exact in double and far from overflow
  // every position, the first and the last of each call, within [-2^53, 2^53]
  d->k_off = p.k_offset;
  if (d->k_off < -kMaxOffset || d->k_off > kMaxOffset - std::max<I>(d->N - 1, 0))
    return Status::OutOfRange("k_offset", "expected k_offset in [-2^53, 2^53 - (N - 1)] (every key's position within "
                                          "+-2^53), got " + str(d->k_off) + " with N = " + str(d->N));
  d->q_off = p.q_offset ? *p.q_offset : d->k_off + d->N - d->M;
  if (d->q_off < -kMaxOffset || d->q_off > kMaxOffset - std::max<I>(d->M - 1, 0))
    return Status::OutOfRange("q_offset", "expected q_offset in [-2^53, 2^53 - (M - 1)] (every query's position "
                                          "within +-2^53), got " + str(d->q_off) + " with M = " + str(d->M));

  if (p.keys_rotated && !is_rotary(p.encoding))
    return Status::Invalid("keys_rotated", "only for a rotary encoding (rope, rope2d, mrope, xpos), got " +
                                               describe(p));
  if (p.keys_rotated && p.encoding == Encoding::kRope2d && p.rope2d.variant == Rope2dVariant::kMixed)
    return Status::Invalid("keys_rotated", "rope2d mixed rotates a key per query head (its frequencies are "
                                           "per head): expected false");
  return Status::Ok();
}

// The encoding's own parameters and tensors (d's R, npos, fire_w, rotary plan where it has them).
inline Status check_encoding(const AttentionParams& p, const EncodingTensors& t, Dims* d) {
  switch (p.encoding) {
    case Encoding::kRope: case Encoding::kRope2d: case Encoding::kMrope: case Encoding::kXpos:
      POSENC_RETURN_IF_ERROR(check_rotary(p, t, d));
      break;
    case Encoding::kAlibi: {
      const AlibiVariant var = p.alibi.variant;
      if (var != AlibiVariant::kSymmetric && var != AlibiVariant::kNonsymmetric &&
          var != AlibiVariant::kLearned)
        return Status::Invalid("variant", "unknown ALiBi variant id " + str(static_cast<int>(var)));
      if (var == AlibiVariant::kNonsymmetric && d->Hq % 2 != 0)
        return Status::Invalid("q", "nonsymmetric ALiBi gives half the heads the past and half the "
                                    "future: expected an even number of query heads, got " + str(d->Hq));
      if (var == AlibiVariant::kLearned) {
        POSENC_RETURN_IF_ERROR(require_tensor("weights", t.weights, {2, d->Hq}));
        POSENC_RETURN_IF_ERROR(require_finite("weights", t.weights));
      } else if (t.slopes.present()) {
        POSENC_RETURN_IF_ERROR(require_tensor("slopes", t.slopes, {d->Hq}));
        const std::vector<double> m = to_doubles(t.slopes);
        for (std::size_t h = 0; h < m.size(); ++h)
          if (!std::isfinite(m[h]))
            return Status::Invalid("slopes", "expected finite values, got " + format_number(m[h]) +
                                                 " at head " + std::to_string(h));
      }
      break;
    }
    case Encoding::kT5: {
      const I nb = p.t5.num_buckets;
      const I min_nb = p.t5.bidirectional ? 4 : 2;
      if (nb < min_nb)
        return Status::Invalid("num_buckets", "expected >= " + str(min_nb) +
                                                  (p.t5.bidirectional ? " (bidirectional)" : "") +
                                                  ", got " + str(nb));
      const I max_exact = (p.t5.bidirectional ? nb / 2 : nb) / 2;
      if (p.t5.max_distance <= max_exact)
        return Status::Invalid("max_distance", "expected > " + str(max_exact) +
                                                   " (the exact buckets), got " + str(p.t5.max_distance));
      POSENC_RETURN_IF_ERROR(require_tensor("weights", t.weights, {nb, d->Hq}));
      POSENC_RETURN_IF_ERROR(require_finite("weights", t.weights));
      break;
    }
    case Encoding::kXL: {
      POSENC_RETURN_IF_ERROR(require_tensor("u", t.u, {d->Hq, d->D}));
      POSENC_RETURN_IF_ERROR(require_tensor("v_bias", t.v, {d->Hq, d->D}));
      POSENC_RETURN_IF_ERROR(require_tensor("rel_proj", t.rel_proj, {d->Hq, d->D, -1}));
      d->R = t.rel_proj.dim(2);
      if (d->R < 2 || d->R % 2 != 0)
        return Status::Invalid("rel_proj", "expected an even sinusoid dimension R >= 2 in [Hq, D, R], "
                                           "got shape " + t.rel_proj.shape_str());
      POSENC_RETURN_IF_ERROR(require_finite("u", t.u));
      POSENC_RETURN_IF_ERROR(require_finite("v_bias", t.v));
      POSENC_RETURN_IF_ERROR(require_finite("rel_proj", t.rel_proj));
      break;
    }
    case Encoding::kCope: {
      POSENC_RETURN_IF_ERROR(require_tensor("table", t.table, {-1, d->D}));
      d->npos = t.table.dim(0);
      if (d->npos < 1)
        return Status::Invalid("table", "expected at least one row in [npos, D], got shape " +
                                            t.table.shape_str());
      POSENC_RETURN_IF_ERROR(require_finite("table", t.table));
      break;
    }
    case Encoding::kKerple:
      POSENC_RETURN_IF_ERROR(kerple::check_params(p.kerple, t.r1, t.r2, d->Hq));
      break;
    case Encoding::kSandwich:
      POSENC_RETURN_IF_ERROR(sandwich_validate(p.sandwich));
      break;
    case Encoding::kFire:
      POSENC_RETURN_IF_ERROR(fire::check_tensors(t.fire, d->Hq, &d->fire_w));
      break;
    default:
      break;
  }
  return Status::Ok();
}

// Checks everything forward and backward share; fills d. A tensor the encoding does not read is
// a mistake worth reporting, not silently ignoring.
inline Status check_common(const AttentionParams& p, const View& q, const View& k, const View& v,
                           const EncodingTensors& t, Dims* d) {
  POSENC_RETURN_IF_ERROR(check_shapes(p, q, k, v, d));
  POSENC_RETURN_IF_ERROR(check_positions(p, d));
  POSENC_RETURN_IF_ERROR(check_encoding(p, t, d));
  const Reads r = reads(p);
  const std::pair<const char*, std::pair<bool, const View*>> given[] = {
      {"slopes", {r.slopes, &t.slopes}}, {"weights", {r.weights, &t.weights}}, {"u", {r.xl, &t.u}},
      {"v_bias", {r.xl, &t.v}},          {"rel_proj", {r.xl, &t.rel_proj}},     {"table", {r.table, &t.table}},
      {"r1", {r.kerple, &t.r1}},         {"r2", {r.kerple, &t.r2}},             {"mlp_w1", {r.fire, &t.fire.w1}},
      {"mlp_b1", {r.fire, &t.fire.b1}},  {"mlp_w2", {r.fire, &t.fire.w2}},      {"mlp_b2", {r.fire, &t.fire.b2}},
      {"c", {r.fire, &t.fire.c}},        {"threshold", {r.fire, &t.fire.threshold}},
      {"freqs", {r.freqs, &t.freqs}},    {"q_positions", {r.positions, &t.q_positions}},
      {"k_positions", {r.positions, &t.k_positions}}};
  for (const auto& [arg, use] : given)
    if (use.second->present() && !use.first)
      return Status::Invalid(arg, "not read by " + describe(p) + "; expected an absent view");
  return Status::Ok();
}

// A present output (or gradient) view: float, the given shape and, when `like` is given, its dtype.
inline Status check_output(const char* arg, const View& o, std::initializer_list<std::int64_t> shape,
                    const View* like, const char* like_arg) {
  POSENC_RETURN_IF_ERROR(require_tensor(arg, o, shape));
  if (like) POSENC_RETURN_IF_ERROR(require_same_dtype(arg, o, *like, like_arg));
  return Status::Ok();
}

// Forward's arguments: the common checks, out, and lse (float64 [B, Hq, M]) when present.
inline Status validate_forward(const AttentionParams& p, const View& q, const View& k, const View& v,
                               const EncodingTensors& t, const View& out, const View& lse, Dims* dp) {
  Dims& d = *dp;
  POSENC_RETURN_IF_ERROR(check_common(p, q, k, v, t, dp));
  POSENC_RETURN_IF_ERROR(check_output("out", out, {d.B, d.M, d.Hq, d.D}, &q, "q"));
  POSENC_RETURN_IF_ERROR(require_output("out", out, 4));
  if (lse.present()) {
    POSENC_RETURN_IF_ERROR(require_tensor("lse", lse, {d.B, d.Hq, d.M}));
    if (lse.dtype != DType::kF64)
      return Status::Invalid("lse", std::string("expected float64, got ") + dtype_name(lse.dtype));
    POSENC_RETURN_IF_ERROR(require_output("lse", lse, 3));
  }
  return fast::check_disjoint({{"out", &out}, {"lse", &lse}});
}

// Backward's arguments: the common checks, dout, the optional dq/dk/dv and parameter gradients.
inline Status validate_backward(const AttentionParams& p, const View& q, const View& k, const View& v,
                                const EncodingTensors& t, const View& dout, const View& dq,
                                const View& dk, const View& dv, const EncodingGrads& g, Dims* dp) {
  Dims& d = *dp;
  POSENC_RETURN_IF_ERROR(check_common(p, q, k, v, t, dp));
  POSENC_RETURN_IF_ERROR(check_output("dout", dout, {d.B, d.M, d.Hq, d.D}, nullptr, nullptr));
  if (dq.present()) POSENC_RETURN_IF_ERROR(check_output("dq", dq, {d.B, d.M, d.Hq, d.D}, &q, "q"));
  if (dk.present()) POSENC_RETURN_IF_ERROR(check_output("dk", dk, {d.B, d.N, d.Hkv, d.D}, &q, "q"));
  if (dv.present()) POSENC_RETURN_IF_ERROR(check_output("dv", dv, {d.B, d.N, d.Hkv, d.D}, &q, "q"));
  // Gradients: each present one must belong to a tensor the encoding reads (else it would go
  // unwritten) and have that tensor's shape.
  const Reads r = reads(p);
  const std::pair<const char*, std::pair<bool, const View*>> grads[] = {
      {"dweights", {r.weights, &g.weights}}, {"du", {r.xl, &g.u}}, {"dv_bias", {r.xl, &g.v}},
      {"drel_proj", {r.xl, &g.rel_proj}},   {"dtable", {r.table, &g.table}},
      {"dr1", {r.kerple, &g.r1}},            {"dr2", {r.kerple, &g.r2}},
      {"dmlp_w1", {r.fire, &g.fire.w1}},     {"dmlp_b1", {r.fire, &g.fire.b1}},
      {"dmlp_w2", {r.fire, &g.fire.w2}},     {"dmlp_b2", {r.fire, &g.fire.b2}},
      {"dc", {r.fire, &g.fire.c}},           {"dthreshold", {r.fire, &g.fire.threshold}},
      {"dfreqs", {r.freqs, &g.freqs}}};
  for (const auto& [arg, use] : grads)
    if (use.second->present() && !use.first)
      return Status::Invalid(arg, describe(p) + " has no such learned tensor; expected an absent view");
  if (g.weights.present())
    POSENC_RETURN_IF_ERROR(check_output("dweights", g.weights, {t.weights.dim(0), d.Hq}, nullptr, nullptr));
  if (g.u.present()) POSENC_RETURN_IF_ERROR(check_output("du", g.u, {d.Hq, d.D}, nullptr, nullptr));
  if (g.v.present()) POSENC_RETURN_IF_ERROR(check_output("dv_bias", g.v, {d.Hq, d.D}, nullptr, nullptr));
  if (g.rel_proj.present())
    POSENC_RETURN_IF_ERROR(check_output("drel_proj", g.rel_proj, {d.Hq, d.D, d.R}, nullptr, nullptr));
  if (g.table.present()) POSENC_RETURN_IF_ERROR(check_output("dtable", g.table, {d.npos, d.D}, nullptr, nullptr));
  if (g.r1.present()) POSENC_RETURN_IF_ERROR(check_output("dr1", g.r1, {d.Hq}, nullptr, nullptr));
  if (g.r2.present()) POSENC_RETURN_IF_ERROR(check_output("dr2", g.r2, {d.Hq}, nullptr, nullptr));
  if (r.fire) POSENC_RETURN_IF_ERROR(fire::check_grads(g.fire, d.Hq, d.fire_w));
  if (g.freqs.present())
    POSENC_RETURN_IF_ERROR(check_output("dfreqs", g.freqs, {2, d.Hq, d.rot.half}, nullptr, nullptr));
  const std::initializer_list<std::pair<const char*, const View*>> outs = {
      {"dq", &dq},           {"dk", &dk},           {"dv", &dv},           {"dweights", &g.weights},
      {"du", &g.u},          {"dv_bias", &g.v},     {"drel_proj", &g.rel_proj}, {"dtable", &g.table},
      {"dr1", &g.r1},        {"dr2", &g.r2},        {"dmlp_w1", &g.fire.w1}, {"dmlp_b1", &g.fire.b1},
      {"dmlp_w2", &g.fire.w2}, {"dmlp_b2", &g.fire.b2}, {"dc", &g.fire.c}, {"dthreshold", &g.fire.threshold},
      {"dfreqs", &g.freqs}};
  for (const auto& [arg, o] : outs)
    if (o->present()) POSENC_RETURN_IF_ERROR(require_output(arg, *o, o->ndim));
  return fast::check_disjoint(outs);
}

// The RopeParams a rotary encoding reads (rope, rope2d, mrope, xpos), else null; P is AttentionParams
// or const AttentionParams.
template <class P>
auto rope_of(P& p) -> decltype(&p.rope) {
  switch (p.encoding) {
    case Encoding::kRope: return &p.rope;
    case Encoding::kRope2d: return &p.rope2d.rope;
    case Encoding::kMrope: return &p.mrope.rope;
    case Encoding::kXpos: return &p.xpos.rope;
    default: return nullptr;
  }
}

// attention_backward_saved: validate_backward's checks; out [B, M, Hq, D] of q's dtype; lse float64
// [B, Hq, M].
inline Status validate_backward_saved(const AttentionParams& p, const View& q, const View& k, const View& v,
                                      const EncodingTensors& t, const View& out, const View& lse,
                                      const View& dout, const View& dq, const View& dk, const View& dv,
                                      const EncodingGrads& g, Dims* dp) {
  POSENC_RETURN_IF_ERROR(validate_backward(p, q, k, v, t, dout, dq, dk, dv, g, dp));
  const Dims& d = *dp;
  POSENC_RETURN_IF_ERROR(check_output("out", out, {d.B, d.M, d.Hq, d.D}, &q, "q"));
  POSENC_RETURN_IF_ERROR(require_tensor("lse", lse, {d.B, d.Hq, d.M}));
  if (lse.dtype != DType::kF64)
    return Status::Invalid("lse", std::string("expected float64, got ") + dtype_name(lse.dtype));
  return Status::Ok();
}

// attention_backward_from_stats: validate_backward_saved's checks, and an encoding whose logits of a
// key shard depend on that shard's keys only.
inline Status validate_backward_from_stats(const AttentionParams& p, const View& q, const View& k,
                                           const View& v, const EncodingTensors& t, const View& out,
                                           const View& lse, const View& dout, const View& dq,
                                           const View& dk, const View& dv, const EncodingGrads& g,
                                           Dims* dp) {
  if (p.encoding == Encoding::kCope)
    return Status::Invalid("encoding",
                           "cope cannot be split over its keys: the position of a key counts the gates of "
                           "every later key of the row, so a shard's logits depend on keys it does not see");
  // The length-dependent RoPE schemes (dynamic, longrope by length) read the call's own length
  // unless seq_len is set; a call over a shard of the keys must be given the whole sequence's.
  if (const RopeParams* r = rope_of(p);
      r && r->seq_len == 0 &&
      (r->rope_type == RopeType::kDynamic ||
       (r->rope_type == RopeType::kLongrope && r->longrope_factors == LongropeFactors::kByLength)))
    return Status::Invalid("seq_len", std::string(rope_type_name(r->rope_type)) +
                                          " reads the sequence length: over a shard of the keys, set "
                                          "seq_len to the whole sequence's");
  return validate_backward_saved(p, q, k, v, t, out, lse, dout, dq, dk, dv, g, dp);
}

}  // namespace posenc::attn

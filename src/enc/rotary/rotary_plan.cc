// The plans of the rotary encodings (rotary_plan.h): validation of their params and positions, the
// per-pair angle sources and scales, and the plain double reference of the rotation every rotary
// encoding shares. The formulas are those of rope_math.h (through rope::frequencies),
// rope2d_math.h, mrope_math.h and xpos_math.h; see docs/rotary.md.
#include "enc/rotary/rotary_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/format.h"
#include "core/overlap.h"
#include "enc/rotary/mrope/mrope_math.h"
#include "enc/rotary/rope/rope_check.h"
#include "enc/rotary/rope/rope_math.h"

namespace posenc {

// ---- names ----------------------------------------------------------------------------------------
const char* rope2d_variant_name(Rope2dVariant v) { return v == Rope2dVariant::kMixed ? "mixed" : "axial"; }
Expected<Rope2dVariant> parse_rope2d_variant(const std::string& s) {
  if (s == "axial") return Rope2dVariant::kAxial;
  if (s == "mixed") return Rope2dVariant::kMixed;
  return Status::Invalid("variant", "expected axial or mixed, got '" + s + "'");
}
const char* mrope_variant_name(MropeVariant v) {
  return v == MropeVariant::kInterleaved ? "interleaved" : "chunked";
}
Expected<MropeVariant> parse_mrope_variant(const std::string& s) {
  if (s == "chunked") return MropeVariant::kChunked;
  if (s == "interleaved") return MropeVariant::kInterleaved;
  return Status::Invalid("variant", "expected chunked or interleaved, got '" + s + "'");
}
const char* xpos_role_name(XposRole r) { return r == XposRole::kKey ? "key" : "query"; }
Expected<XposRole> parse_xpos_role(const std::string& s) {
  if (s == "query") return XposRole::kQuery;
  if (s == "key") return XposRole::kKey;
  return Status::Invalid("role", "expected query or key, got '" + s + "'");
}

std::int64_t xpos_center(const XposParams& p, std::int64_t n) {
  if (p.center) return *p.center;
  return xpos::auto_center(p.rope.seq_len > 0 ? p.rope.seq_len : n);
}

Expected<std::vector<double>> rope2d_mixed_init(std::int64_t heads, std::int64_t rotary_dim, double theta,
                                                const std::vector<double>& angles) {
  using I = std::int64_t;
  if (heads < 1) return Status::Invalid("heads", "expected at least one head, got " + std::to_string(heads));
  if (rotary_dim < 4 || rotary_dim % 4 != 0)
    return Status::Invalid("rotary_dim", "expected a positive multiple of 4, got " + std::to_string(rotary_dim));
  if (!std::isfinite(theta) || !(theta > 0))
    return Status::Invalid("theta", "expected a finite number > 0, got " + format_number(theta));
  if (static_cast<I>(angles.size()) != heads)
    return Status::Invalid("angles", "expected one angle per head, " + std::to_string(heads) + ", got " +
                                         std::to_string(angles.size()));
  for (double a : angles)
    if (!std::isfinite(a)) return Status::Invalid("angles", "expected finite angles, got " + format_number(a));
  const I half = rotary_dim / 2, q = rotary_dim / 4;
  std::vector<double> f(static_cast<std::size_t>(2 * heads * half));
  constexpr double kHalfPi = 1.57079632679489661923;
  for (I h = 0; h < heads; ++h) {
    const double a = angles[static_cast<std::size_t>(h)];
    for (I j = 0; j < q; ++j) {
      const double mu = rope2d::mixed_magnitude(theta, j, rotary_dim);
      const std::size_t x0 = static_cast<std::size_t>(h * half), y0 = static_cast<std::size_t>((heads + h) * half);
      f[x0 + static_cast<std::size_t>(j)] = mu * std::cos(a);
      f[x0 + static_cast<std::size_t>(q + j)] = mu * std::cos(a + kHalfPi);
      f[y0 + static_cast<std::size_t>(j)] = mu * std::sin(a);
      f[y0 + static_cast<std::size_t>(q + j)] = mu * std::sin(a + kHalfPi);
    }
  }
  return f;
}

namespace rotary {

namespace {

std::string str(I x) { return std::to_string(x); }

Plan base_plan(Kind kind, RopeLayout layout, I r) {
  Plan pl;
  pl.kind = kind;
  pl.layout = layout;
  pl.r = r;
  pl.half = r / 2;
  pl.axis.assign(static_cast<std::size_t>(pl.half), 0);
  pl.rung.resize(static_cast<std::size_t>(pl.half));
  for (I k = 0; k < pl.half; ++k) pl.rung[static_cast<std::size_t>(k)] = k;
  return pl;
}

}  // namespace

Expected<I> rotary_dim(const RopeParams& p, I D, I multiple) {
  const I r = p.rotary_dim == 0 ? D : p.rotary_dim;
  if (r <= 0 || r % multiple != 0 || r > D) return rope::rotary_dim_error(p.rotary_dim, D, multiple);
  return r;
}

I call_length(const std::vector<I>& ids) { return rope::call_length(ids); }

Expected<Plan> rope_plan(const RopeParams& p, I D, I call_len) {
  auto rr = rotary_dim(p, D, 2);
  if (!rr.ok()) return rr.status();
  POSENC_RETURN_IF_ERROR(rope::check_params(p, *rr));
  auto f = rope::frequencies(p, *rr, call_len);
  if (!f.ok()) return f.status();
  Plan pl = base_plan(Kind::kRope, p.layout, *rr);
  pl.f = std::move(f).value();
  pl.factor = pl.f.attention_factor;
  return pl;
}

Expected<Plan> rope2d_plan(const Rope2dParams& p, I D, I call_len, const View& freqs, I heads) {
  if (p.variant != Rope2dVariant::kAxial && p.variant != Rope2dVariant::kMixed)
    return Status::Invalid("variant", "expected axial or mixed, got value " + str(static_cast<int>(p.variant)));
  auto rr = rotary_dim(p.rope, D, 4);
  if (!rr.ok()) return rr.status();
  const I r = *rr;
  // The per-axis ladder has r/4 frequencies: RoPE's for a rotary dimension of r/2.
  POSENC_RETURN_IF_ERROR(rope::check_params(p.rope, r / 2));
  if (p.variant == Rope2dVariant::kAxial) {
    if (freqs.present()) return Status::Invalid("freqs", "not read by rope2d axial; expected an absent view");
    auto f = rope::frequencies(p.rope, r / 2, call_len);
    if (!f.ok()) return f.status();
    Plan pl = base_plan(Kind::kAxial, p.rope.layout, r);
    pl.axes = 2;
    for (I k = 0; k < pl.half; ++k) {
      pl.axis[static_cast<std::size_t>(k)] = rope2d::axial_axis(k, r);
      pl.rung[static_cast<std::size_t>(k)] = rope2d::axial_rung(k, r);
    }
    pl.f = std::move(f).value();
    pl.factor = pl.f.attention_factor;
    return pl;
  }
  // Mixed: the frequencies are the tensor; RoPE's scheme does not apply.
  if (!rope_is_plain(p.rope))
    return Status::Invalid("rope", "rope2d mixed takes its frequencies from freqs: expected only layout, "
                                   "rotary_dim and theta among the RoPE parameters");
  POSENC_RETURN_IF_ERROR(rope::check_call(p.rope, call_len));
  POSENC_RETURN_IF_ERROR(require_float("freqs", freqs, 3));
  POSENC_RETURN_IF_ERROR(require_shape("freqs", freqs, {2, heads, r / 2}));
  Plan pl = base_plan(Kind::kMixed, p.rope.layout, r);
  pl.axes = 2;
  pl.heads = heads;
  pl.mixed = to_doubles(freqs);
  // |θ| <= 2^968 keeps x·θˣ + y·θʸ finite (<= 2^1022) for every |x|, |y| <= 2^53 (kMaxPosition).
  constexpr double kMaxMixedFreq = 0x1p968;
  for (std::size_t i = 0; i < pl.mixed.size(); ++i)
    if (!(std::fabs(pl.mixed[i]) <= kMaxMixedFreq))
      return Status::Invalid("freqs", "expected finite values with |value| <= 2^968 (angles x*fx + y*fy finite "
                                      "for every |position| <= 2^53), got " +
                                          format_number(pl.mixed[i]) + " at " + std::to_string(i));
  return pl;
}

Expected<Plan> mrope_plan(const MropeParams& p, I D, I call_len) {
  if (p.variant != MropeVariant::kChunked && p.variant != MropeVariant::kInterleaved)
    return Status::Invalid("variant", "expected chunked or interleaved, got value " + str(static_cast<int>(p.variant)));
  auto rr = rotary_dim(p.rope, D, 2);
  if (!rr.ok()) return rr.status();
  const I r = *rr, half = r / 2;
  POSENC_RETURN_IF_ERROR(rope::check_params(p.rope, r));
  const std::vector<I>& s = p.mrope_section;
  std::string given;
  for (I v : s) given += (given.empty() ? "" : ",") + str(v);
  if (s.size() != 3)
    return Status::Invalid("mrope_section", "expected three sizes s_t,s_h,s_w (pairs per position row, summing "
                                            "to r/2 = " + str(half) + "), got '" + given + "'");
  if (s[0] < 0 || s[1] < 0 || s[2] < 0 || s[0] + s[1] + s[2] != half)
    return Status::Invalid("mrope_section", "expected three sizes >= 0 summing to r/2 = " + str(half) + ", got " +
                                                given);
  if (p.variant == MropeVariant::kInterleaved && (3 * s[1] > half + 1 || 3 * s[2] > half))
    return Status::Invalid("mrope_section", "interleaved gives h the pairs k = 1 mod 3 below 3*s_h and w those "
                                            "k = 2 mod 3 below 3*s_w: expected 3*s_h <= r/2 + 1 = " +
                                                str(half + 1) + " and 3*s_w <= r/2 = " + str(half) + ", got " +
                                                given);
  auto f = rope::frequencies(p.rope, r, call_len);
  if (!f.ok()) return f.status();
  Plan pl = base_plan(Kind::kMrope, p.rope.layout, r);
  pl.axes = 3;
  for (I k = 0; k < half; ++k)
    pl.axis[static_cast<std::size_t>(k)] = p.variant == MropeVariant::kChunked ? mrope::chunked_axis(k, s.data())
                                                                                : mrope::interleaved_axis(k, s.data());
  pl.f = std::move(f).value();
  pl.factor = pl.f.attention_factor;
  return pl;
}

Expected<Plan> xpos_plan(const XposParams& p, I D, I call_len) {
  auto rr = rotary_dim(p.rope, D, 2);
  if (!rr.ok()) return rr.status();
  const I r = *rr;
  POSENC_RETURN_IF_ERROR(rope::check_params(p.rope, r));
  if (!std::isfinite(p.scale_base) || !(p.scale_base > 0))
    return Status::Invalid("scale_base", "expected a finite number > 0, got " + format_number(p.scale_base));
  if (!std::isfinite(p.gamma) || !(p.gamma > 0))
    return Status::Invalid("gamma", "expected a finite number > 0 (zeta_0 = gamma/(1 + gamma) > 0), got " +
                                        format_number(p.gamma));
  constexpr I kMaxCenter = I{1} << 53;
  if (p.center && (*p.center > kMaxCenter || *p.center < -kMaxCenter))
    return Status::OutOfRange("center", "expected |center| <= 2^53, got " + str(*p.center));
  auto f = rope::frequencies(p.rope, r, call_len);
  if (!f.ok()) return f.status();
  Plan pl = base_plan(Kind::kXpos, p.rope.layout, r);
  pl.f = std::move(f).value();
  pl.factor = pl.f.attention_factor;
  pl.rate.resize(static_cast<std::size_t>(pl.half));
  for (I k = 0; k < pl.half; ++k) pl.rate[static_cast<std::size_t>(k)] = xpos::log_rate(k, r, p.gamma, p.scale_base);
  pl.center = xpos_center(p, call_len);
  return pl;
}

namespace {
// The largest finite value of a floating storage dtype.
double dtype_max(DType t) {
  switch (t) {
    case DType::kF16: return 65504.0;
    case DType::kBF16: return 0x1.fep127;
    case DType::kF32: return 0x1.fffffep127;
    default: return std::numeric_limits<double>::max();
  }
}
// The smallest positive normal value of a floating storage dtype.
double dtype_min_normal(DType t) {
  switch (t) {
    case DType::kF16: return 0x1p-14;
    case DType::kBF16: return 0x1p-126;
    case DType::kF32: return 0x1p-126;
    default: return std::numeric_limits<double>::min();
  }
}
}  // namespace

Status check_xpos_scale(const Plan& pl, const std::vector<I>& ids, int role, DType dtype, const char* arg) {
  if (ids.empty() || !pl.scaled()) return Status::Ok();
  I lo = ids[0], hi = ids[0];
  for (I m : ids) {
    lo = std::min(lo, m);
    hi = std::max(hi, m);
  }
  // ρ_k = ζ_k^(role·(m − c)/s) is monotone in m: its extremes are at lo and hi, for the pair of the
  // smallest ζ_k (k = 0), but every pair is checked as the kernels compute it. Two sides: the scale
  // grows past the dtype's largest value (queries below c, keys above it), or shrinks below its
  // smallest normal one (queries above c, keys below it), where the vector would flush to 0.
  const double mx = dtype_max(dtype), mn = dtype_min_normal(dtype);
  for (const bool over : {true, false}) {
    const int dir = over ? -role : role;  // this side's positions are c + dir·d, d > 0
    const auto inside = [&](double v) { return over ? v <= mx : v >= mn; };
    // The end of the call nearest c first: the message names the first position out of range.
    const I ends[2] = {dir > 0 ? lo : hi, dir > 0 ? hi : lo};
    for (I m : ends)
      for (I k = 0; k < pl.half; ++k) {
        const double v = pl.scale(m, k, role);
        if (inside(v)) continue;
        // The last distance on this side at which every scale stays in range: c + dir·lim.
        const double r0 = std::fabs(pl.rate[0]);
        const double estimate = std::log(over ? mx / pl.factor : pl.factor / mn) / r0;
        I lim = r0 > 0 ? static_cast<I>(std::clamp(estimate, 0.0, 0x1p60)) : 0;
        auto fits = [&](I d) {
          for (I kk = 0; kk < pl.half; ++kk)
            if (!inside(pl.scale(pl.center + dir * d, kk, role))) return false;
          return true;
        };
        while (lim > 0 && !fits(lim)) --lim;
        while (fits(lim + 1)) ++lim;
        const std::string c = str(pl.center), verb = over ? " overflows " : " underflows ";
        if (lim == 0)  // one position from c is already out: no call could use this scale base
          return Status::OutOfRange(
              "scale_base", "the xPos scale zeta_k^(1/scale_base)" + verb + dtype_name(dtype) +
                                " one position from c = " + c + " (pair k = " + str(k) +
                                "): expected a larger scale_base (the paper's is 512)");
        return Status::OutOfRange(
            arg, std::string("the xPos ") +
                     (role > 0 ? "query scale zeta_k^((m-c)/scale_base)" : "key scale zeta_k^(-(m-c)/scale_base)") +
                     verb + dtype_name(dtype) + " at position m = " + str(m) + " (pair k = " + str(k) + ", c = " +
                     c + ": " + format_number(v) +
                     (over ? " > " + format_number(mx) : " < " + format_number(mn) + ", the smallest normal value") +
                     "): expected " +
                     (dir < 0 ? "m >= c - " + str(lim) + " = " + str(pl.center - lim)
                              : "m <= c + " + str(lim) + " = " + str(pl.center + lim)));
      }
  }
  return Status::Ok();
}

Status check_io(const char* in_arg, const View& in, const char* out_arg, const View& out) {
  POSENC_RETURN_IF_ERROR(require_float(in_arg, in, 4));
  POSENC_RETURN_IF_ERROR(require_output(out_arg, out, 4));
  POSENC_RETURN_IF_ERROR(require_shape(out_arg, out, {in.dim(0), in.dim(1), in.dim(2), in.dim(3)}));
  return require_same_dtype(out_arg, out, in, in_arg);
}

namespace {

Call dims_of(const View& in) {
  Call c;
  c.B = in.dim(0);
  c.L = in.dim(1);
  c.H = in.dim(2);
  c.D = in.dim(3);
  return c;
}

// c (its dims set) with rope2d's positions [B, 2, L] and plan.
Expected<Call> rope2d_call(const Rope2dParams& p, Call c, const Positions& pos, const View& freqs) {
  auto ids = expand_positions_axes("positions", pos, 2, c.B, c.L);
  if (!ids.ok()) return ids.status();
  c.ids = std::move(ids).value();
  auto pl = rope2d_plan(p, c.D, call_length(c.ids), freqs, c.H);
  if (!pl.ok()) return pl.status();
  c.plan = std::move(pl).value();
  return c;
}

}  // namespace

Expected<Call> prepare_rope2d(const Rope2dParams& p, const char* in_arg, const View& in, const char* out_arg,
                              const View& out, const Positions& pos, const View& freqs) {
  POSENC_RETURN_IF_ERROR(check_io(in_arg, in, out_arg, out));
  return rope2d_call(p, dims_of(in), pos, freqs);
}

Expected<Call> prepare_rope2d_backward(const Rope2dParams& p, const View& dy, const Positions& pos,
                                       const View& freqs, const View& dx, const View& x, const View& dfreqs) {
  POSENC_RETURN_IF_ERROR(require_float("dy", dy, 4));
  if (dx.present()) POSENC_RETURN_IF_ERROR(check_io("dy", dy, "dx", dx));
  if (!dx.present() && !dfreqs.present())
    return Status::Invalid("dx", "expected an output: dx, dfreqs (mixed) or both");
  if (dfreqs.present()) {
    if (p.variant != Rope2dVariant::kMixed)
      return Status::Invalid("dfreqs", "rope2d axial has no learned frequencies; expected an absent view");
    if (!x.present()) return Status::Invalid("x", "dfreqs needs the forward's input x [B, L, H, D]");
  }
  if (x.present()) {
    POSENC_RETURN_IF_ERROR(require_float("x", x, 4));
    POSENC_RETURN_IF_ERROR(require_shape("x", x, {dy.dim(0), dy.dim(1), dy.dim(2), dy.dim(3)}));
    if (!dfreqs.present()) return Status::Invalid("x", "read only for dfreqs; expected an absent view");
  }
  auto call = rope2d_call(p, dims_of(dy), pos, freqs);
  if (!call.ok()) return call.status();
  Call c = std::move(call).value();
  if (dfreqs.present()) {
    POSENC_RETURN_IF_ERROR(require_output("dfreqs", dfreqs, 3));
    POSENC_RETURN_IF_ERROR(require_shape("dfreqs", dfreqs, {2, c.H, c.plan.half}));
    POSENC_RETURN_IF_ERROR(fast::check_disjoint({{"dx", &dx}, {"dfreqs", &dfreqs}}));
  }
  return c;
}

Expected<Call> prepare_mrope(const MropeParams& p, const char* in_arg, const View& in, const char* out_arg,
                             const View& out, const Positions& pos) {
  POSENC_RETURN_IF_ERROR(check_io(in_arg, in, out_arg, out));
  Call c = dims_of(in);
  auto ids = expand_positions_axes("positions", pos, 3, c.B, c.L);
  if (!ids.ok()) return ids.status();
  c.ids = std::move(ids).value();
  auto pl = mrope_plan(p, c.D, call_length(c.ids));
  if (!pl.ok()) return pl.status();
  c.plan = std::move(pl).value();
  return c;
}

Expected<Call> prepare_xpos(const XposParams& p, XposRole role, const char* in_arg, const View& in,
                            const char* out_arg, const View& out, const Positions& pos) {
  if (role != XposRole::kQuery && role != XposRole::kKey)
    return Status::Invalid("role", "expected query or key, got value " + str(static_cast<int>(role)));
  POSENC_RETURN_IF_ERROR(check_io(in_arg, in, out_arg, out));
  Call c = dims_of(in);
  auto ids = expand_positions("positions", pos, c.B, c.L);
  if (!ids.ok()) return ids.status();
  c.ids = std::move(ids).value();
  auto pl = xpos_plan(p, c.D, call_length(c.ids));
  if (!pl.ok()) return pl.status();
  c.plan = std::move(pl).value();
  POSENC_RETURN_IF_ERROR(check_xpos_scale(c.plan, c.ids, role_sign(role), out.dtype, "positions"));
  return c;
}

// ---- tables ----------------------------------------------------------------------------------------

namespace {

Expected<RotaryTable> table_of(const Plan& pl, const std::vector<I>& ids, I L, int role) {
  RotaryTable t;
  t.heads = pl.per_head() ? pl.heads : 1;
  t.length = L;
  t.pairs = pl.half;
  t.angle.resize(static_cast<std::size_t>(t.heads * L * pl.half));
  t.scale.resize(t.angle.size());
  I p[3] = {0, 0, 0};
  for (I h = 0; h < t.heads; ++h)
    for (I l = 0; l < L; ++l) {
      for (I a = 0; a < pl.axes; ++a) p[a] = ids[static_cast<std::size_t>(a * L + l)];
      for (I k = 0; k < pl.half; ++k) {
        const std::size_t at = static_cast<std::size_t>((h * L + l) * pl.half + k);
        t.angle[at] = pl.angle(p, k, h);
        t.scale[at] = pl.scale(p[0], k, role);
      }
    }
  return t;
}

Status check_table(I head_dim, I length) {
  if (head_dim < 1) return Status::Invalid("head_dim", "expected a head dimension D >= 1, got " + str(head_dim));
  if (length < 0) return Status::Invalid("length", "expected a length >= 0, got " + str(length));
  return Status::Ok();
}

}  // namespace

}  // namespace rotary

Expected<RotaryTable> rope2d_table(const Rope2dParams& p, std::int64_t head_dim, std::int64_t length,
                                   const Positions& pos, const View& freqs) {
  using namespace rotary;
  POSENC_RETURN_IF_ERROR(check_table(head_dim, length));
  auto ids = expand_positions_axes("positions", pos, 2, 1, length);
  if (!ids.ok()) return ids.status();
  const I heads = freqs.present() && freqs.ndim == 3 ? freqs.dim(1) : 1;
  auto pl = rope2d_plan(p, head_dim, call_length(*ids), freqs, heads);
  if (!pl.ok()) return pl.status();
  return table_of(*pl, *ids, length, +1);
}

Expected<RotaryTable> mrope_table(const MropeParams& p, std::int64_t head_dim, std::int64_t length,
                                  const Positions& pos) {
  using namespace rotary;
  POSENC_RETURN_IF_ERROR(check_table(head_dim, length));
  auto ids = expand_positions_axes("positions", pos, 3, 1, length);
  if (!ids.ok()) return ids.status();
  auto pl = mrope_plan(p, head_dim, call_length(*ids));
  if (!pl.ok()) return pl.status();
  return table_of(*pl, *ids, length, +1);
}

Expected<RotaryTable> xpos_table(const XposParams& p, XposRole role, std::int64_t head_dim, std::int64_t length,
                                 const Positions& pos, std::optional<DType> scale_dtype) {
  using namespace rotary;
  if (role != XposRole::kQuery && role != XposRole::kKey)
    return Status::Invalid("role", "expected query or key, got value " + std::to_string(static_cast<int>(role)));
  POSENC_RETURN_IF_ERROR(check_table(head_dim, length));
  auto ids = expand_positions("positions", pos, 1, length);
  if (!ids.ok()) return ids.status();
  auto pl = xpos_plan(p, head_dim, call_length(*ids));
  if (!pl.ok()) return pl.status();
  if (scale_dtype) POSENC_RETURN_IF_ERROR(check_xpos_scale(*pl, *ids, role_sign(role), *scale_dtype, "positions"));
  return table_of(*pl, *ids, length, role_sign(role));
}

namespace rotary {

// ---- the reference ------------------------------------------------------------------------------

void rotate_ref(const Plan& pl, std::vector<double>* x, I B, I L, I H, I D, const std::vector<I>& ids, int dir,
                int role, I h0) {
  const I A = pl.axes, half = pl.half;
  I p[3] = {0, 0, 0};
  std::vector<double> c(static_cast<std::size_t>(half)), s(static_cast<std::size_t>(half));
  auto trig = [&](I h) {
    for (I k = 0; k < half; ++k) {
      const double phi = dir * pl.angle(p, k, h), sc = pl.scale(p[0], k, role);
      c[static_cast<std::size_t>(k)] = sc * std::cos(phi);
      s[static_cast<std::size_t>(k)] = sc * std::sin(phi);
    }
  };
  for (I b = 0; b < B; ++b)
    for (I l = 0; l < L; ++l) {
      for (I a = 0; a < A; ++a) p[a] = ids[static_cast<std::size_t>((b * A + a) * L + l)];
      if (!pl.per_head()) trig(0);
      for (I h = 0; h < H; ++h) {
        if (pl.per_head()) trig(h0 + h);
        double* row = x->data() + ((b * L + l) * H + h) * D;
        for (I k = 0; k < half; ++k) {
          I ia = 0, ib = 0;
          rope::pair(pl.layout, k, pl.r, &ia, &ib);
          const double xa = row[ia], xb = row[ib];
          const double ck = c[static_cast<std::size_t>(k)], sk = s[static_cast<std::size_t>(k)];
          row[ia] = xa * ck - xb * sk;
          row[ib] = xa * sk + xb * ck;
        }
      }
    }
}

void mixed_freq_grad_ref(const Plan& pl, const std::vector<double>& y, const std::vector<double>& g, I B, I L,
                         I H, I D, const std::vector<I>& ids, std::vector<double>* dfreqs) {
  const I half = pl.half;
  for (I b = 0; b < B; ++b)
    for (I l = 0; l < L; ++l) {
      const double px = static_cast<double>(ids[static_cast<std::size_t>((b * 2 + 0) * L + l)]);
      const double py = static_cast<double>(ids[static_cast<std::size_t>((b * 2 + 1) * L + l)]);
      for (I h = 0; h < H; ++h) {
        const std::size_t row = static_cast<std::size_t>(((b * L + l) * H + h) * D);
        for (I k = 0; k < half; ++k) {
          I ia = 0, ib = 0;
          rope::pair(pl.layout, k, pl.r, &ia, &ib);
          const double d = rope2d::dphi(y[row + static_cast<std::size_t>(ia)], y[row + static_cast<std::size_t>(ib)],
                                        g[row + static_cast<std::size_t>(ia)], g[row + static_cast<std::size_t>(ib)]);
          (*dfreqs)[static_cast<std::size_t>(h * half + k)] += px * d;
          (*dfreqs)[static_cast<std::size_t>((pl.heads + h) * half + k)] += py * d;
        }
      }
    }
}

}  // namespace rotary
}  // namespace posenc

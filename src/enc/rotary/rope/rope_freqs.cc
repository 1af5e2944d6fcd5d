// The frequencies of a RoPE call: validation of RopeParams and the one computation of ω_k and the
// attention factor that every consumer reads (the references, the fast elementwise path, both
// attentions, the CLI and the benchmarks). The formulas are rope_math.h's; see docs/rope.md.
#include <cmath>
#include <string>

#include "core/format.h"
#include "enc/rotary/rope/rope_check.h"
#include "enc/rotary/rope/rope_math.h"
#include "posenc/rope.h"

namespace posenc {

namespace {

std::string num(double x) { return format_number(x); }
std::string str(std::int64_t x) { return std::to_string(x); }

Status not_read(const char* field, RopeType t, const std::string& want, const std::string& got) {
  return Status::Invalid(field, std::string("rope_type ") + rope_type_name(t) + " does not read it (expected " +
                                    want + ", got " + got + ")");
}

Status check_list(const char* field, const std::vector<double>& v, std::int64_t r, bool allow_zero) {
  if (static_cast<std::int64_t>(v.size()) != r / 2)
    return Status::Invalid(field, "expected r/2 = " + str(r / 2) + " values (one per pair), got " +
                                      str(static_cast<std::int64_t>(v.size())));
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]) || v[i] < 0 || (!allow_zero && v[i] == 0))
      return Status::Invalid(field, std::string("expected finite values ") + (allow_zero ? ">= 0" : "> 0") +
                                        ", got " + num(v[i]) + " at " + str(static_cast<std::int64_t>(i)));
  return Status::Ok();
}

// The largest ω_k whose angle stays finite at every position |m| <= 2^53 (kMaxPosition): m·ω_k in
// double (accurate: 2^53·2^969 = 2^1022), or the float32 product fl32(ω_k·fl32(m)) (hf: 2^53·2^74 =
// 2^127 < FLT_MAX).
constexpr double kMaxFreq = 0x1p969;
constexpr double kMaxFreqF32 = 0x1p74;

// The first ω_k of f (in the call's mode) that is not finite or above the bound, or -1.
std::int64_t first_bad_freq(const RopeFrequencies& f) {
  const bool hf = f.angles == RopeAngles::kHf;
  const std::vector<double>& w = hf ? f.inv_freq_f32 : f.inv_freq;
  const double bound = hf ? kMaxFreqF32 : kMaxFreq;
  for (std::size_t k = 0; k < w.size(); ++k)
    if (!(std::fabs(w[k]) <= bound)) return static_cast<std::int64_t>(k);
  return -1;
}

Status bad_freq(const char* field, const RopeFrequencies& f, std::int64_t k) {
  const bool hf = f.angles == RopeAngles::kHf;
  const double w = (hf ? f.inv_freq_f32 : f.inv_freq)[static_cast<std::size_t>(k)];
  return Status::OutOfRange(
      field, std::string(hf ? "expected float32 frequencies omega_k <= 2^74 (angles --angles hf forms as "
                              "fl32(omega_k*m), finite for every m <= 2^53)"
                            : "expected frequencies omega_k <= 2^969 (angles m*omega_k finite for every "
                              "|m| <= 2^53)") +
                 ", got omega_" + str(k) + " = " + num(w));
}

bool reads_factor(RopeType t) { return t != RopeType::kDefault; }
bool reads_original(RopeType t) {
  return t == RopeType::kDynamic || t == RopeType::kYarn || t == RopeType::kLlama3 || t == RopeType::kLongrope;
}

}  // namespace

namespace rope {

Status rotary_dim_error(std::int64_t rotary_dim, std::int64_t D, std::int64_t multiple) {
  const std::string kind = multiple == 2 ? "an even number" : "a multiple of " + str(multiple);
  if (rotary_dim == 0)
    return Status::Invalid("rotary_dim", "expected a head dimension D that is " + kind + " (rotary_dim 0 rotates "
                                         "all of it), got D = " + str(D));
  return Status::Invalid("rotary_dim", "expected " + kind + " in [" + str(multiple) + ", D = " + str(D) +
                                           "] (0 means D), got " + str(rotary_dim));
}

Status check_params(const RopeParams& p, std::int64_t r) {
  if (p.layout != RopeLayout::kInterleaved && p.layout != RopeLayout::kHalf)
    return Status::Invalid("layout", "expected interleaved or half, got value " +
                                         std::to_string(static_cast<int>(p.layout)));
  if (!std::isfinite(p.theta) || !(p.theta > 0))
    return Status::Invalid("theta", "expected a finite number > 0, got " + num(p.theta));
  const RopeType t = p.rope_type;
  if (static_cast<int>(t) < 0 || static_cast<int>(t) > static_cast<int>(RopeType::kLongrope))
    return Status::Invalid("rope_type", "unknown value " + std::to_string(static_cast<int>(t)));
  if (p.angles != RopeAngles::kAccurate && p.angles != RopeAngles::kHf)
    return Status::Invalid("angles", "expected accurate or hf, got value " + std::to_string(static_cast<int>(p.angles)));
  if (p.seq_len < 0) return Status::Invalid("seq_len", "expected a length >= 0 (0: derived), got " + str(p.seq_len));

  // Each scheme's fields: valid where read, default where not.
  if (reads_factor(t)) {
    if (!std::isfinite(p.factor) || !(p.factor > 0))
      return Status::Invalid("factor", "expected a finite number > 0, got " + num(p.factor));
  } else if (p.factor != 1.0) {
    return not_read("factor", t, "1", num(p.factor));
  }
  if (reads_original(t)) {
    if (p.original_max_position < 1)
      return Status::Invalid("original_max_position",
                             std::string("rope_type ") + rope_type_name(t) +
                                 " needs the trained context length L >= 1, got " + str(p.original_max_position));
  } else if (p.original_max_position != 0) {
    return not_read("original_max_position", t, "0", str(p.original_max_position));
  }
  if (t == RopeType::kYarn) {
    for (auto [field, v] : {std::pair{"beta_fast", p.beta_fast}, std::pair{"beta_slow", p.beta_slow}})
      if (!std::isfinite(v) || !(v > 0)) return Status::Invalid(field, "expected a finite number > 0, got " + num(v));
    for (auto [field, v] : {std::pair{"mscale", p.mscale}, std::pair{"mscale_all_dim", p.mscale_all_dim}})
      if (!std::isfinite(v)) return Status::Invalid(field, "expected a finite number (0: absent), got " + num(v));
  } else {
    if (p.beta_fast != 32.0) return not_read("beta_fast", t, "32", num(p.beta_fast));
    if (p.beta_slow != 1.0) return not_read("beta_slow", t, "1", num(p.beta_slow));
    if (!p.truncate) return not_read("truncate", t, "true", "false");
    if (p.mscale != 0.0) return not_read("mscale", t, "0", num(p.mscale));
    if (p.mscale_all_dim != 0.0) return not_read("mscale_all_dim", t, "0", num(p.mscale_all_dim));
  }
  if (t == RopeType::kLlama3) {
    if (!std::isfinite(p.low_freq_factor) || !(p.low_freq_factor > 0))
      return Status::Invalid("low_freq_factor", "expected a finite number > 0, got " + num(p.low_freq_factor));
    if (!std::isfinite(p.high_freq_factor) || !(p.high_freq_factor > p.low_freq_factor))
      return Status::Invalid("high_freq_factor", "expected a finite number > low_freq_factor = " +
                                                     num(p.low_freq_factor) + ", got " + num(p.high_freq_factor));
  } else {
    if (p.low_freq_factor != 1.0) return not_read("low_freq_factor", t, "1", num(p.low_freq_factor));
    if (p.high_freq_factor != 4.0) return not_read("high_freq_factor", t, "4", num(p.high_freq_factor));
  }
  if (t == RopeType::kLongrope) {
    POSENC_RETURN_IF_ERROR(check_list("short_factor", p.short_factor, r, false));
    POSENC_RETURN_IF_ERROR(check_list("long_factor", p.long_factor, r, false));
    if (p.longrope_factors != LongropeFactors::kByLength && p.longrope_factors != LongropeFactors::kShort &&
        p.longrope_factors != LongropeFactors::kLong)
      return Status::Invalid("longrope_factors", "expected by-length, short or long, got value " +
                                                     std::to_string(static_cast<int>(p.longrope_factors)));
  } else {
    if (!p.short_factor.empty()) return not_read("short_factor", t, "no values", str(static_cast<std::int64_t>(p.short_factor.size())) + " values");
    if (!p.long_factor.empty()) return not_read("long_factor", t, "no values", str(static_cast<std::int64_t>(p.long_factor.size())) + " values");
    if (p.longrope_factors != LongropeFactors::kByLength)
      return not_read("longrope_factors", t, "by-length", longrope_factors_name(p.longrope_factors));
  }
  if ((t == RopeType::kNtk || t == RopeType::kDynamic) && r < 4)
    return Status::Invalid("rotary_dim", std::string("rope_type ") + rope_type_name(t) +
                                             " scales the base by s^(r/(r-2)): expected r >= 4, got " + str(r));
  if (p.attention_factor && (!std::isfinite(*p.attention_factor) || !(*p.attention_factor > 0)))
    return Status::Invalid("attention_factor", "expected a finite number > 0, got " + num(*p.attention_factor));
  if (!p.freq_factors.empty()) POSENC_RETURN_IF_ERROR(check_list("freq_factors", p.freq_factors, r, false));
  if (!p.inv_freq.empty()) {
    POSENC_RETURN_IF_ERROR(check_list("inv_freq", p.inv_freq, r, true));
    if (t != RopeType::kDefault)
      return Status::Invalid("inv_freq", std::string("gives the frequencies outright: expected rope_type default, got ") +
                                             rope_type_name(t));
    if (!p.freq_factors.empty())
      return Status::Invalid("inv_freq", "gives the frequencies outright: expected no freq_factors with it");
  }
  return Status::Ok();
}

std::int64_t length_key(const RopeParams& p, std::int64_t n) {
  switch (p.rope_type) {
    case RopeType::kDynamic: return std::max(n, p.original_max_position);
    case RopeType::kLongrope: return n > p.original_max_position ? 1 : 0;
    default: return 0;
  }
}

Status check_call(const RopeParams& p, std::int64_t call_len) {
  if (p.seq_len > 0 && p.seq_len < call_len)
    return Status::Invalid("seq_len", "expected 0 (derived) or at least the call's largest position + 1 = " +
                                          str(call_len) + ", got " + str(p.seq_len));
  return Status::Ok();
}

namespace {

// f's inv_freq and inv_freq_f32 [r/2] (and theta, attention_factor, long_factors where the scheme
// sets them) by p's scheme, for a call whose length is f.seq_len.
void scheme_frequencies(const RopeParams& p, std::int64_t r, RopeFrequencies* out) {
  RopeFrequencies& f = *out;
  const std::int64_t half = r / 2, n = f.seq_len;
  auto set = [&](std::int64_t k, double accurate, F32 hf) {
    f.inv_freq[static_cast<std::size_t>(k)] = accurate;
    f.inv_freq_f32[static_cast<std::size_t>(k)] = value(hf);
  };
  const double s = p.factor;
  const double L = static_cast<double>(p.original_max_position);
  switch (p.rope_type) {
    case RopeType::kDefault:
      for (std::int64_t k = 0; k < half; ++k) {
        if (!p.inv_freq.empty()) {
          const double w = p.inv_freq[static_cast<std::size_t>(k)];
          set(k, w, F32(w));
        } else {
          set(k, default_inv<double>(p.theta, k, r), default_inv<F32>(p.theta, k, r));
        }
      }
      break;
    case RopeType::kLinear:  // inv_freq /= factor (Chen et al. 2023: positions divided by s)
      for (std::int64_t k = 0; k < half; ++k)
        set(k, default_inv<double>(p.theta, k, r) / s, default_inv<F32>(p.theta, k, r) / F32(s));
      break;
    case RopeType::kNtk:
      f.theta = ntk_base(p.theta, s, r);
      for (std::int64_t k = 0; k < half; ++k)
        set(k, default_inv<double>(f.theta, k, r), default_inv<F32>(f.theta, k, r));
      break;
    case RopeType::kDynamic:
      if (n > p.original_max_position) {
        f.theta = dynamic_base<double>(p.theta, s, n, p.original_max_position, r);
        const F32 b32 = dynamic_base<F32>(p.theta, s, n, p.original_max_position, r);
        for (std::int64_t k = 0; k < half; ++k)
          set(k, 1.0 / base_pow_t<double>(f.theta, k, r), F32(1.0) / base_pow_t<F32>(b32, k, r));
      } else {
        // Inside the trained window the base is theta (transformers: the frequencies of its
        // initialisation, computed with Python floats, theta·1^(r/(r−2)) = theta).
        for (std::int64_t k = 0; k < half; ++k)
          set(k, default_inv<double>(p.theta, k, r), default_inv<F32>(p.theta, k, r));
      }
      break;
    case RopeType::kYarn: {
      double lo = 0, hi = 0;
      yarn_range(p.beta_fast, p.beta_slow, r, p.theta, L, p.truncate, &lo, &hi);
      for (std::int64_t k = 0; k < half; ++k)
        set(k, yarn_inv<double>(p.theta, s, lo, hi, k, r), yarn_inv<F32>(p.theta, s, lo, hi, k, r));
      f.attention_factor = yarn_attention_factor(s, p.mscale, p.mscale_all_dim);
      break;
    }
    case RopeType::kLlama3:
      for (std::int64_t k = 0; k < half; ++k)
        set(k, llama3_inv<double>(p.theta, s, p.low_freq_factor, p.high_freq_factor, L, k, r),
            llama3_inv<F32>(p.theta, s, p.low_freq_factor, p.high_freq_factor, L, k, r));
      break;
    case RopeType::kLongrope: {
      f.long_factors = p.longrope_factors == LongropeFactors::kLong ||
                       (p.longrope_factors == LongropeFactors::kByLength && n > p.original_max_position);
      const std::vector<double>& ext = f.long_factors ? p.long_factor : p.short_factor;
      for (std::int64_t k = 0; k < half; ++k) {
        const double e = ext[static_cast<std::size_t>(k)];
        set(k, longrope_inv<double>(p.theta, e, k, r), longrope_inv<F32>(p.theta, e, k, r));
      }
      f.attention_factor = longrope_attention_factor(s, L);
      break;
    }
  }
}

// The field to blame for frequency k of f overflowing its angles: RoFormer's ω⁰ (theta) first,
// then the list or the scheme's own field.
const char* overflow_field(const RopeParams& p, const RopeFrequencies& f, std::int64_t r, std::int64_t call_len) {
  if (!p.inv_freq.empty()) return "inv_freq";
  if (p.rope_type == RopeType::kDefault) return "theta";
  RopeParams plain;
  plain.theta = p.theta;
  plain.angles = p.angles;
  if (!frequencies(plain, r, call_len).ok()) return "theta";  // ω⁰ already fails
  if (p.rope_type == RopeType::kLongrope) return f.long_factors ? "long_factor" : "short_factor";
  return "factor";
}

}  // namespace

Expected<RopeFrequencies> frequencies(const RopeParams& p, std::int64_t r, std::int64_t call_len) {
  if (call_len < 0) call_len = 0;
  POSENC_RETURN_IF_ERROR(check_call(p, call_len));
  RopeFrequencies f;
  f.rotary_dim = r;
  f.seq_len = p.seq_len > 0 ? p.seq_len : call_len;
  f.angles = p.angles;
  f.theta = p.theta;
  const std::int64_t half = r / 2;
  f.inv_freq.resize(static_cast<std::size_t>(half));
  f.inv_freq_f32.resize(static_cast<std::size_t>(half));
  scheme_frequencies(p, r, &f);
  // Frequencies whose angles would overflow (a tiny theta, factor or list entry): an error naming
  // the field that made them.
  if (const std::int64_t k = first_bad_freq(f); k >= 0) return bad_freq(overflow_field(p, f, r, call_len), f, k);
  if (!p.freq_factors.empty())
    for (std::int64_t k = 0; k < half; ++k) {
      const std::size_t i = static_cast<std::size_t>(k);
      const double ff = p.freq_factors[i];
      f.inv_freq[i] /= ff;
      f.inv_freq_f32[i] = value(F32(f.inv_freq_f32[i]) / F32(ff));
    }
  if (const std::int64_t k = first_bad_freq(f); k >= 0) return bad_freq("freq_factors", f, k);
  if (p.attention_factor) f.attention_factor = *p.attention_factor;
  return f;
}

}  // namespace rope

Expected<RopeFrequencies> rope_frequencies(const RopeParams& p, std::int64_t head_dim, std::int64_t call_len) {
  if (head_dim < 1) return Status::Invalid("head_dim", "expected a head dimension D >= 1, got " + str(head_dim));
  const std::int64_t r = p.rotary_dim == 0 ? head_dim : p.rotary_dim;
  if (r <= 0 || r % 2 != 0 || r > head_dim) return rope::rotary_dim_error(p.rotary_dim, head_dim, 2);
  POSENC_RETURN_IF_ERROR(rope::check_params(p, r));
  return rope::frequencies(p, r, call_len);
}

const char* rope_layout_name(RopeLayout l) { return l == RopeLayout::kHalf ? "half" : "interleaved"; }

Expected<RopeLayout> parse_rope_layout(const std::string& s) {
  if (s == "interleaved") return RopeLayout::kInterleaved;
  if (s == "half") return RopeLayout::kHalf;
  return Status::Invalid("layout", "expected interleaved or half, got '" + s + "'");
}

namespace {
constexpr const char* kTypeNames[] = {"default", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope"};
}

bool rope_is_plain(const RopeParams& p) {
  RopeParams plain;
  plain.layout = p.layout;
  plain.rotary_dim = p.rotary_dim;
  plain.theta = p.theta;
  return p == plain;
}

const char* rope_type_name(RopeType t) {
  const int i = static_cast<int>(t);
  return i >= 0 && i < 7 ? kTypeNames[i] : "?";
}

Expected<RopeType> parse_rope_type(const std::string& s) {
  for (int i = 0; i < 7; ++i)
    if (s == kTypeNames[i]) return static_cast<RopeType>(i);
  return Status::Invalid("rope_type",
                         "expected default, linear, ntk, dynamic, yarn, llama3 or longrope, got '" + s + "'");
}

const char* rope_angles_name(RopeAngles a) { return a == RopeAngles::kHf ? "hf" : "accurate"; }

Expected<RopeAngles> parse_rope_angles(const std::string& s) {
  if (s == "accurate") return RopeAngles::kAccurate;
  if (s == "hf") return RopeAngles::kHf;
  return Status::Invalid("angles", "expected accurate or hf, got '" + s + "'");
}

const char* longrope_factors_name(LongropeFactors f) {
  switch (f) {
    case LongropeFactors::kShort: return "short";
    case LongropeFactors::kLong: return "long";
    default: return "by-length";
  }
}

Expected<LongropeFactors> parse_longrope_factors(const std::string& s) {
  if (s == "by-length") return LongropeFactors::kByLength;
  if (s == "short") return LongropeFactors::kShort;
  if (s == "long") return LongropeFactors::kLong;
  return Status::Invalid("longrope_factors", "expected by-length, short or long, got '" + s + "'");
}

}  // namespace posenc

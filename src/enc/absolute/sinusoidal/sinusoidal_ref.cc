// The plain reference of the sinusoidal absolute encoding (scalar, double accumulation).
//
//   PE[p, 2i]   = sin(p / base^(2i/D))
//   PE[p, 2i+1] = cos(p / base^(2i/D)),       i = 0 .. D/2 − 1, D even
//   forward   y = x + PE[pos]                 x, y: [B, L, D]
//   backward  dx = dy                         (PE has no parameters)
//
// Source: Vaswani et al. 2017, "Attention Is All You Need", §3.5 (base 10000); four of the source
// articles (docs/articles.md) write the same formula (“三角函数式位置编码”'s worked example uses base
// n = 100, d = 4). The code of “位置编码” divides by 10000^(j/D) for every dimension j, which is not the paper's formula (see
// sinusoidal_math.h, where the formula is written once).
#include <cmath>
#include <sstream>

#include "enc/absolute/sinusoidal/sinusoidal_math.h"
#include "posenc/absolute.h"
#include "core/format.h"
#include "posenc/reference.h"
#include "enc/absolute/sinusoidal/sinusoidal_check.h"

namespace posenc {
namespace sinusoid {

Status check_base(const SinusoidalParams& p) {
  if (!std::isfinite(p.base) || !(p.base > 0))
    return Status::Invalid("base", "expected a finite number > 0, got " + format_number(p.base));
  return Status::Ok();
}

double max_freq(const SinusoidalParams& p, std::int64_t D) {
  return p.base >= 1 || D < 2 ? 1.0 : inv_freq(D / 2 - 1, D, p.base);
}

Status check_freqs(const SinusoidalParams& p, std::int64_t D) {
  const double w = max_freq(p, D);
  if (!(w <= 0x1p969))
    return Status::OutOfRange("base", "expected frequencies base^(-2i/D) <= 2^969 (angles p*w finite for every "
                                      "|p| <= 2^53), got " + format_number(w) + " at i = " +
                                          std::to_string(D / 2 - 1) + " (base " + format_number(p.base) + ")");
  return Status::Ok();
}

// The last dimension holds D/2 (sin, cos) pairs.
Status check_even_d(const char* arg, const View& v) {
  if (v.dim(v.ndim - 1) % 2 != 0)
    return Status::Invalid(arg, "expected an even last dimension D (sin/cos pairs), got shape " +
                                    v.shape_str());
  return Status::Ok();
}

// in, out: [B, L, D] of one dtype; D even.
Status check_io(const char* in_arg, const View& in, const char* out_arg, const View& out) {
  POSENC_RETURN_IF_ERROR(require_float(in_arg, in, 3));
  POSENC_RETURN_IF_ERROR(check_even_d(in_arg, in));
  POSENC_RETURN_IF_ERROR(require_output(out_arg, out, 3));
  POSENC_RETURN_IF_ERROR(require_shape(out_arg, out, {in.dim(0), in.dim(1), in.dim(2)}));
  return require_same_dtype(out_arg, out, in, in_arg);
}

}  // namespace sinusoid

namespace reference {

using sinusoid::check_base;
using sinusoid::check_even_d;
using sinusoid::check_io;

Status sinusoidal_table(const SinusoidalParams& p, const Positions& pos, const View& out) {
  POSENC_RETURN_IF_ERROR(check_base(p));
  POSENC_RETURN_IF_ERROR(require_output("out", out, 2));
  POSENC_RETURN_IF_ERROR(check_even_d("out", out));
  POSENC_RETURN_IF_ERROR(sinusoid::check_freqs(p, out.dim(1)));
  const std::int64_t L = out.dim(0), D = out.dim(1);
  auto ids = expand_positions("positions", pos, 1, L);  // [1, L]
  if (!ids.ok()) return ids.status();

  std::vector<double> pe(static_cast<std::size_t>(L * D));  // [L, D]
  for (std::int64_t l = 0; l < L; ++l) {
    const double m = static_cast<double>((*ids)[static_cast<std::size_t>(l)]);
    for (std::int64_t d = 0; d < D; ++d)
      pe[static_cast<std::size_t>(l * D + d)] = sinusoid::value(m, d, D, p.base);
  }
  from_doubles(pe, out);
  return Status::Ok();
}

Status sinusoidal_forward(const SinusoidalParams& p, const View& x, const Positions& pos, const View& y) {
  POSENC_RETURN_IF_ERROR(check_base(p));
  POSENC_RETURN_IF_ERROR(check_io("x", x, "y", y));
  POSENC_RETURN_IF_ERROR(sinusoid::check_freqs(p, x.dim(2)));
  const std::int64_t B = x.dim(0), L = x.dim(1), D = x.dim(2);
  auto ids = expand_positions("positions", pos, B, L);  // [B, L]
  if (!ids.ok()) return ids.status();

  std::vector<double> v = to_doubles(x);  // [B, L, D]; read in full before y (which may alias x)
  for (std::int64_t t = 0; t < B * L; ++t) {
    const double m = static_cast<double>((*ids)[static_cast<std::size_t>(t)]);
    for (std::int64_t d = 0; d < D; ++d)
      v[static_cast<std::size_t>(t * D + d)] += sinusoid::value(m, d, D, p.base);
  }
  from_doubles(v, y);
  return Status::Ok();
}

Status sinusoidal_backward(const SinusoidalParams& p, const View& dy, const Positions& pos, const View& dx) {
  POSENC_RETURN_IF_ERROR(check_base(p));
  POSENC_RETURN_IF_ERROR(check_io("dy", dy, "dx", dx));
  POSENC_RETURN_IF_ERROR(sinusoid::check_freqs(p, dy.dim(2)));
  // Positions do not enter the gradient, but they are validated as in the forward.
  auto ids = expand_positions("positions", pos, dy.dim(0), dy.dim(1));
  if (!ids.ok()) return ids.status();
  from_doubles(to_doubles(dy), dx);
  return Status::Ok();
}

}  // namespace reference

}  // namespace posenc

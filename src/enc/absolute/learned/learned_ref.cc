// The plain reference of the learned absolute encoding (scalar, double accumulation).
//
//   forward   y[b,l,:] = x[b,l,:] + E[pos(b,l), :]          E = table: [max_len, D]
//   backward  dx = dy;   dE[p, :] = Σ_{(b,l): pos(b,l) = p} dy[b,l,:]   (scatter-add; rows no token
//             sits at are 0)
//
// Source: BERT (Devlin et al. 2019) and GPT-2's position embeddings, a torch.nn.Embedding(max_len, D)
// looked up at arange(L) (as “位置编码” and “语言模型为什么需要位置编码” describe it,
// docs/articles.md). A position ≥ max_len is an error, never wrapped:
// the table has no row for it.
#include <string>

#include "posenc/absolute.h"
#include "posenc/reference.h"
#include "enc/absolute/learned/learned_check.h"

namespace posenc {
namespace learned {

// Validates the positions against the table's rows and returns them expanded to [B, L].
Expected<std::vector<std::int64_t>> checked_positions(const Positions& pos, std::int64_t B, std::int64_t L,
                                                      std::int64_t max_len) {
  auto ids = expand_positions("positions", pos, B, L);
  if (!ids.ok()) return ids.status();
  for (std::int64_t t = 0; t < B * L; ++t) {
    const std::int64_t m = (*ids)[static_cast<std::size_t>(t)];
    if (m < 0 || m >= max_len)  // a negative offset without ids places tokens before row 0
      return Status::OutOfRange("positions", "expected positions in [0, max_len = " + std::to_string(max_len) +
                                                 ") (the rows of table), got " + std::to_string(m) +
                                                 " at (b=" + std::to_string(t / L) +
                                                 ", l=" + std::to_string(t % L) + ")");
  }
  return ids;
}

// x [B, L, D], table [max_len, D], y like x.
Status check_forward(const View& x, const View& table, const View& y) {
  POSENC_RETURN_IF_ERROR(require_float("x", x, 3));
  const std::int64_t B = x.dim(0), L = x.dim(1), D = x.dim(2);
  POSENC_RETURN_IF_ERROR(require_float("table", table, 2));
  POSENC_RETURN_IF_ERROR(require_shape("table", table, {-1, D}));
  POSENC_RETURN_IF_ERROR(require_output("y", y, 3));
  POSENC_RETURN_IF_ERROR(require_shape("y", y, {B, L, D}));
  POSENC_RETURN_IF_ERROR(require_same_dtype("y", y, x, "x"));
  return Status::Ok();
}

}  // namespace learned

namespace reference {

using learned::checked_positions;

Status learned_forward(const LearnedParams&, const View& x, const View& table, const Positions& pos,
                       const View& y) {
  POSENC_RETURN_IF_ERROR(learned::check_forward(x, table, y));
  const std::int64_t B = x.dim(0), L = x.dim(1), D = x.dim(2);
  auto ids = checked_positions(pos, B, L, table.dim(0));  // [B, L]
  if (!ids.ok()) return ids.status();

  std::vector<double> v = to_doubles(x);  // [B, L, D]; read in full before y (which may alias x)
  for (std::int64_t t = 0; t < B * L; ++t) {
    const std::int64_t m = (*ids)[static_cast<std::size_t>(t)];
    for (std::int64_t d = 0; d < D; ++d) v[static_cast<std::size_t>(t * D + d)] += table.get(m * D + d);
  }
  from_doubles(v, y);
  return Status::Ok();
}

Status learned_backward(const LearnedParams&, const View& dy, const View& table, const Positions& pos,
                        const View& dx, const View& dtable) {
  POSENC_RETURN_IF_ERROR(require_float("dy", dy, 3));
  const std::int64_t B = dy.dim(0), L = dy.dim(1), D = dy.dim(2);
  POSENC_RETURN_IF_ERROR(require_float("table", table, 2));
  POSENC_RETURN_IF_ERROR(require_shape("table", table, {-1, D}));
  const std::int64_t max_len = table.dim(0);
  if (dx.present()) {
    POSENC_RETURN_IF_ERROR(require_output("dx", dx, 3));
    POSENC_RETURN_IF_ERROR(require_shape("dx", dx, {B, L, D}));
    POSENC_RETURN_IF_ERROR(require_same_dtype("dx", dx, dy, "dy"));
  }
  if (dtable.present()) {
    POSENC_RETURN_IF_ERROR(require_output("dtable", dtable, 2));
    POSENC_RETURN_IF_ERROR(require_shape("dtable", dtable, {max_len, D}));
    POSENC_RETURN_IF_ERROR(require_same_dtype("dtable", dtable, table, "table"));
  }
  auto ids = checked_positions(pos, B, L, max_len);  // [B, L]
  if (!ids.ok()) return ids.status();

  const std::vector<double> g = to_doubles(dy);  // [B, L, D]; read before any output is written
  if (dtable.present()) {
    std::vector<double> acc(static_cast<std::size_t>(max_len * D), 0.0);  // [max_len, D]
    for (std::int64_t t = 0; t < B * L; ++t) {
      const std::int64_t m = (*ids)[static_cast<std::size_t>(t)];
      for (std::int64_t d = 0; d < D; ++d)
        acc[static_cast<std::size_t>(m * D + d)] += g[static_cast<std::size_t>(t * D + d)];
    }
    from_doubles(acc, dtable);
  }
  if (dx.present()) from_doubles(g, dx);
  return Status::Ok();
}

}  // namespace reference

}  // namespace posenc

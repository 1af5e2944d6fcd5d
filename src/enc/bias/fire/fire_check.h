// Validation shared by FIRE's bias reference (fire_ref.cc), its fast dispatcher (fire_cpu.cc) and
// the attention (attention_check.h), so that all give the same Status for the same bad input.
// Argument names: mlp_w1, mlp_b1, mlp_w2, mlp_b2, c, threshold (gradients: d + the name).
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "core/format.h"
#include "core/overlap.h"
#include "posenc/bias.h"

namespace posenc::fire {

inline Status check_one(const char* arg, const View& v, std::initializer_list<std::int64_t> shape) {
  POSENC_RETURN_IF_ERROR(require_float(arg, v, static_cast<int>(shape.size())));
  return require_shape(arg, v, shape);
}

inline Status check_finite(const char* arg, const View& v) {
  const std::vector<double> x = to_doubles(v);
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!std::isfinite(x[i]))
      return Status::Invalid(arg, "expected finite values, got " + format_number(x[i]) + " at index " +
                                      std::to_string(i));
  return Status::Ok();
}

// The six tensors for H heads: w1 [W] (W ≥ 1), b1 [W], w2 [H, W], b2 [H], c [1], threshold [1];
// finite; c > 0 and L > 0. Sets *W.
inline Status check_tensors(const FireTensors& t, std::int64_t H, std::int64_t* W) {
  POSENC_RETURN_IF_ERROR(require_float("mlp_w1", t.w1, 1));
  *W = t.w1.dim(0);
  if (*W < 1)
    return Status::Invalid("mlp_w1", "expected at least one hidden unit in [W], got shape " + t.w1.shape_str());
  POSENC_RETURN_IF_ERROR(check_one("mlp_b1", t.b1, {*W}));
  POSENC_RETURN_IF_ERROR(check_one("mlp_w2", t.w2, {H, *W}));
  POSENC_RETURN_IF_ERROR(check_one("mlp_b2", t.b2, {H}));
  POSENC_RETURN_IF_ERROR(check_one("c", t.c, {1}));
  POSENC_RETURN_IF_ERROR(check_one("threshold", t.threshold, {1}));
  const std::pair<const char*, const View*> all[] = {{"mlp_w1", &t.w1}, {"mlp_b1", &t.b1}, {"mlp_w2", &t.w2},
                                                     {"mlp_b2", &t.b2}, {"c", &t.c}, {"threshold", &t.threshold}};
  for (const auto& [arg, v] : all) POSENC_RETURN_IF_ERROR(check_finite(arg, *v));
  const double c = t.c.get(0), L = t.threshold.get(0);
  if (!(c > 0))
    return Status::Invalid("c", "expected a value > 0 (ψ(x) = log(c·x + 1)), got " + format_number(c) +
                                    " (taken as given: keep it positive during training)");
  if (!(L > 0))
    return Status::Invalid("threshold", "expected a value > 0 (the normaliser's threshold L), got " +
                                            format_number(L) + " (taken as given: keep it positive during training)");
  return Status::Ok();
}

// Gradients: each absent, or a float view shaped like its tensor.
inline Status check_grads(const FireTensors& g, std::int64_t H, std::int64_t W) {
  for (const auto& [arg, v] : {std::pair{"dmlp_w1", &g.w1}, std::pair{"dmlp_b1", &g.b1}, std::pair{"dmlp_w2", &g.w2},
                               std::pair{"dmlp_b2", &g.b2}, std::pair{"dc", &g.c}, std::pair{"dthreshold", &g.threshold}})
    if (v->present()) POSENC_RETURN_IF_ERROR(require_output(arg, *v, v->ndim));
  if (g.w1.present()) POSENC_RETURN_IF_ERROR(check_one("dmlp_w1", g.w1, {W}));
  if (g.b1.present()) POSENC_RETURN_IF_ERROR(check_one("dmlp_b1", g.b1, {W}));
  if (g.w2.present()) POSENC_RETURN_IF_ERROR(check_one("dmlp_w2", g.w2, {H, W}));
  if (g.b2.present()) POSENC_RETURN_IF_ERROR(check_one("dmlp_b2", g.b2, {H}));
  if (g.c.present()) POSENC_RETURN_IF_ERROR(check_one("dc", g.c, {1}));
  if (g.threshold.present()) POSENC_RETURN_IF_ERROR(check_one("dthreshold", g.threshold, {1}));
  return fast::check_disjoint({{"dmlp_w1", &g.w1}, {"dmlp_b1", &g.b1}, {"dmlp_w2", &g.w2}, {"dmlp_b2", &g.b2},
                               {"dc", &g.c}, {"dthreshold", &g.threshold}});
}

inline bool any_grad(const FireTensors& g) {
  return g.w1.present() || g.b1.present() || g.w2.present() || g.b2.present() || g.c.present() ||
         g.threshold.present();
}

// Every argument of fire_bias / fire_bias_backward, in the order the reference checks them (defined
// in fire_ref.cc). *W: the hidden width.
Status check_forward(const BiasGeometry& g, const FireTensors& t, const View& out, std::int64_t* W);
Status check_backward(const BiasGeometry& g, const FireTensors& t, const View& dbias,
                      const FireTensors& grads, std::int64_t* W);

// The tensors as doubles.
struct Values {
  std::vector<double> w1, b1, w2, b2;
  double c = 0, L = 0;
};
inline Values values(const FireTensors& t) {
  Values v;
  v.w1 = to_doubles(t.w1);
  v.b1 = to_doubles(t.b1);
  v.w2 = to_doubles(t.w2);
  v.b2 = to_doubles(t.b2);
  v.c = t.c.get(0);
  v.L = t.threshold.get(0);
  return v;
}

// Writes the six gradients (each when present) from doubles.
inline void write_grads(const FireTensors& g, const std::vector<double>& dw1, const std::vector<double>& db1,
                        const std::vector<double>& dw2, const std::vector<double>& db2, double dc, double dL) {
  if (g.w1.present()) from_doubles(dw1, g.w1);
  if (g.b1.present()) from_doubles(db1, g.b1);
  if (g.w2.present()) from_doubles(dw2, g.w2);
  if (g.b2.present()) from_doubles(db2, g.b2);
  if (g.c.present()) from_doubles({dc}, g.c);
  if (g.threshold.present()) from_doubles({dL}, g.threshold);
}

}  // namespace posenc::fire

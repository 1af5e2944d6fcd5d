// posenc/reference.h — the plain references: scalar, double accumulation, the oracle of the fast paths.
// Same signatures, validation and error Status as absolute.h, rope.h, rotary.h and bias.h.
#pragma once

#include "posenc/absolute.h"
#include "posenc/bias.h"
#include "posenc/rope.h"
#include "posenc/rotary.h"

namespace posenc::reference {

Status sinusoidal_table(const SinusoidalParams& p, const Positions& pos, const View& out);
Status sinusoidal_forward(const SinusoidalParams& p, const View& x, const Positions& pos, const View& y);
Status sinusoidal_backward(const SinusoidalParams& p, const View& dy, const Positions& pos, const View& dx);

Status learned_forward(const LearnedParams& p, const View& x, const View& table, const Positions& pos,
                       const View& y);
Status learned_backward(const LearnedParams& p, const View& dy, const View& table, const Positions& pos,
                        const View& dx, const View& dtable);

Status rope_forward(const RopeParams& p, const View& x, const Positions& pos, const View& y);
Status rope_backward(const RopeParams& p, const View& dy, const Positions& pos, const View& dx);

Status rope2d_forward(const Rope2dParams& p, const View& x, const Positions& pos, const View& freqs,
                      const View& y);
Status rope2d_backward(const Rope2dParams& p, const View& dy, const Positions& pos, const View& freqs,
                       const View& dx, const View& x = View{}, const View& dfreqs = View{});
Status mrope_forward(const MropeParams& p, const View& x, const Positions& pos, const View& y);
Status mrope_backward(const MropeParams& p, const View& dy, const Positions& pos, const View& dx);
Status xpos_forward(const XposParams& p, XposRole role, const View& x, const Positions& pos, const View& y);
Status xpos_backward(const XposParams& p, XposRole role, const View& dy, const Positions& pos, const View& dx);

Status alibi_bias(const AlibiParams& p, const BiasGeometry& g, const View& slopes, const View& weights,
                  const View& out);
Status alibi_bias_backward(const AlibiParams& p, const BiasGeometry& g, const View& weights,
                           const View& dbias, const View& dweights);

Status t5_bias(const T5Params& p, const BiasGeometry& g, const View& weights, const View& out);
Status t5_bias_backward(const T5Params& p, const BiasGeometry& g, const View& dbias, const View& dweights);

Status kerple_bias(const KerpleParams& p, const BiasGeometry& g, const View& r1, const View& r2,
                   const View& out);
Status kerple_bias_backward(const KerpleParams& p, const BiasGeometry& g, const View& r1, const View& r2,
                            const View& dbias, const View& dr1, const View& dr2);

Status sandwich_bias(const SandwichParams& p, const BiasGeometry& g, const View& out);

Status fire_bias(const FireParams& p, const BiasGeometry& g, const FireTensors& t, const View& out);
Status fire_bias_backward(const FireParams& p, const BiasGeometry& g, const FireTensors& t,
                          const View& dbias, const FireTensors& grads);

}  // namespace posenc::reference

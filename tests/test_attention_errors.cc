// Bad inputs to attention_forward and attention_backward: a Status naming the argument and what was
// expected, nothing written.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "posenc/attention.h"
#include "posenc/bias.h"
#include "posenc/rope.h"
#include "attention_testing.h"

namespace posenc {
namespace {

using namespace ::posenc::attention_testing;  // NOLINT: the fixtures of these tests

// ==== bad inputs ==================================================================================
struct Bad {
  std::string name, arg;
  Encoding enc;
  std::function<void(Case&, Fwd&, View*, View*, View*, View*, View*, EncodingTensors*)> edit;
};

TEST(AttentionErrors, EveryBadForwardInputNamesItsArgument) {
  using E = EncodingTensors;
  auto f32 = [](View* v) { v->dtype = DType::kF32; };
  std::vector<Bad> bad = {
      {"learned is absolute", "encoding", Encoding::kLearned, [](auto&&...) {}},
      {"sinusoidal is absolute", "encoding", Encoding::kSinusoidal, [](auto&&...) {}},
      {"q absent", "q", Encoding::kNope, [](Case&, Fwd&, View* q, View*, View*, View*, View*, E*) { *q = View{}; }},
      {"q int", "q", Encoding::kNope, [](Case&, Fwd&, View* q, View*, View*, View*, View*, E*) { q->dtype = DType::kI64; }},
      {"q 3-d", "q", Encoding::kNope, [](Case&, Fwd&, View* q, View*, View*, View*, View*, E*) { q->ndim = 3; }},
      {"k batch", "k", Encoding::kNope, [](Case&, Fwd&, View*, View* k, View*, View*, View*, E*) { k->shape[0] = 1; }},
      {"k head dim", "k", Encoding::kNope, [](Case&, Fwd&, View*, View* k, View*, View*, View*, E*) { k->shape[3] = 2; }},
      {"heads not divisible", "k", Encoding::kNope, [](Case&, Fwd&, View*, View* k, View*, View*, View*, E*) { k->shape[2] = 3; }},
      {"k dtype", "k", Encoding::kNope, [=](Case&, Fwd&, View*, View* k, View*, View*, View*, E*) { f32(k); }},
      {"v keys", "v", Encoding::kNope, [](Case&, Fwd&, View*, View*, View* v, View*, View*, E*) { v->shape[1] = 3; }},
      {"v absent", "v", Encoding::kNope, [](Case&, Fwd&, View*, View*, View* v, View*, View*, E*) { *v = View{}; }},
      {"out absent", "out", Encoding::kNope, [](Case&, Fwd&, View*, View*, View*, View* o, View*, E*) { *o = View{}; }},
      {"out shape", "out", Encoding::kNope, [](Case&, Fwd&, View*, View*, View*, View* o, View*, E*) { o->shape[1] = 2; }},
      {"out dtype", "out", Encoding::kNope, [=](Case&, Fwd&, View*, View*, View*, View* o, View*, E*) { f32(o); }},
      {"lse shape", "lse", Encoding::kNope, [](Case&, Fwd&, View*, View*, View*, View*, View* l, E*) { l->shape[2] = 9; }},
      {"lse dtype", "lse", Encoding::kNope, [=](Case&, Fwd&, View*, View*, View*, View*, View* l, E*) { f32(l); }},
      {"scale negative", "scale", Encoding::kNope, [](Case& c, auto&&...) { c.p.scale = -1.0; }},
      {"scale nan", "scale", Encoding::kNope, [](Case& c, auto&&...) { c.p.scale = std::nan(""); }},
      {"q_offset huge", "q_offset", Encoding::kNope, [](Case& c, auto&&...) { c.p.q_offset = std::int64_t{1} << 62; }},
      // the last query (M > 1 here) past 2^53 although the first is not; the same for the last key
      {"last query past 2^53", "q_offset", Encoding::kNope, [](Case& c, auto&&...) { c.p.q_offset = (std::int64_t{1} << 53) - c.M + 2; }},
      {"last key past 2^53", "k_offset", Encoding::kNope, [](Case& c, auto&&...) { c.p.k_offset = (std::int64_t{1} << 53) - c.N + 2; }},
      {"rotary_dim odd", "rotary_dim", Encoding::kRope, [](Case& c, auto&&...) { c.p.rope.rotary_dim = 3; }},
      {"rotary_dim > D", "rotary_dim", Encoding::kRope, [](Case& c, auto&&...) { c.p.rope.rotary_dim = 6; }},
      {"theta", "theta", Encoding::kRope, [](Case& c, auto&&...) { c.p.rope.theta = 0; }},
      {"slopes shape", "slopes", Encoding::kAlibi, [](Case& c, auto&&...) { c.slopes = {1, 2, 3}; }},
      {"nonsymmetric odd heads", "q", Encoding::kAlibi,
       [](Case& c, Fwd&, View* q, View* k, View* v, View* o, View*, E*) {
         c.p.alibi.variant = AlibiVariant::kNonsymmetric;
         q->shape[2] = k->shape[2] = v->shape[2] = o->shape[2] = 1;
       }},
      {"learned weights absent", "weights", Encoding::kAlibi,
       [](Case& c, Fwd&, View*, View*, View*, View*, View*, E* t) {
         c.p.alibi.variant = AlibiVariant::kLearned;
         t->weights = View{};
       }},
      {"t5 weights shape", "weights", Encoding::kT5,
       [](Case&, Fwd&, View*, View*, View*, View*, View*, E* t) { t->weights.shape[0] = 7; }},
      {"t5 num_buckets", "num_buckets", Encoding::kT5, [](Case& c, auto&&...) { c.p.t5.num_buckets = 3; }},
      {"t5 max_distance", "max_distance", Encoding::kT5, [](Case& c, auto&&...) { c.p.t5.max_distance = 2; }},
      {"xl u absent", "u", Encoding::kXL, [](Case&, Fwd&, View*, View*, View*, View*, View*, E* t) { t->u = View{}; }},
      {"xl v shape", "v_bias", Encoding::kXL,
       [](Case&, Fwd&, View*, View*, View*, View*, View*, E* t) { t->v.shape[1] = 3; }},
      {"xl odd R", "rel_proj", Encoding::kXL,
       [](Case&, Fwd&, View*, View*, View*, View*, View*, E* t) { t->rel_proj.shape[2] = 3; }},
      {"slopes not finite", "slopes", Encoding::kAlibi, [](Case& c, auto&&...) { c.slopes = {0.5, std::nan("")}; }},
      {"slopes with the learned variant", "slopes", Encoding::kAlibi,
       [](Case& c, Fwd&, View*, View*, View*, View*, View*, E* t) {
         c.p.alibi.variant = AlibiVariant::kLearned;
         c.weights = randn(4, 1);
         c.slopes = {0.5, 0.25};
         t->weights = V(c.weights, {2, 2});
         t->slopes = V(c.slopes, {2});
       }},
      {"weights with the symmetric variant", "weights", Encoding::kAlibi,
       [](Case& c, Fwd&, View*, View*, View*, View*, View*, E* t) {
         c.weights = randn(4, 1);
         t->weights = V(c.weights, {2, 2});
       }},
      {"a table for rope", "table", Encoding::kRope,
       [](Case& c, Fwd&, View*, View*, View*, View*, View*, E* t) {
         c.table = randn(8, 1);
         t->table = V(c.table, {2, 4});
       }},
      {"cope table absent", "table", Encoding::kCope,
       [](Case&, Fwd&, View*, View*, View*, View*, View*, E* t) { t->table = View{}; }},
      {"cope table D", "table", Encoding::kCope,
       [](Case&, Fwd&, View*, View*, View*, View*, View*, E* t) { t->table.shape[1] = 3; }},
      {"kerple r1 absent", "r1", Encoding::kKerple,
       [](Case&, Fwd&, View*, View*, View*, View*, View*, E* t) { t->r1 = View{}; }},
      {"kerple r2 shape", "r2", Encoding::kKerple,
       [](Case&, Fwd&, View*, View*, View*, View*, View*, E* t) { t->r2.shape[0] = 3; }},
      {"kerple r1 not positive", "r1", Encoding::kKerple, [](Case& c, auto&&...) { c.r1[1] = 0.0; }},
      {"kerple power r2 > 2", "r2", Encoding::kKerple,
       [](Case& c, auto&&...) {
         c.p.kerple.kernel = KerpleKernel::kPower;
         c.r2[0] = 2.5;
       }},
      {"kerple kernel id", "kernel", Encoding::kKerple,
       [](Case& c, auto&&...) { c.p.kerple.kernel = static_cast<KerpleKernel>(9); }},
      {"sandwich odd dim", "sinusoid_dim", Encoding::kSandwich, [](Case& c, auto&&...) { c.p.sandwich.sinusoid_dim = 5; }},
      {"sandwich base", "base", Encoding::kSandwich, [](Case& c, auto&&...) { c.p.sandwich.base = -1; }},
      {"fire w2 shape", "mlp_w2", Encoding::kFire,
       [](Case&, Fwd&, View*, View*, View*, View*, View*, E* t) { t->fire.w2.shape[0] = 3; }},
      {"fire c not positive", "c", Encoding::kFire, [](Case& c, auto&&...) { c.fc[0] = -0.5; }},
      {"fire threshold absent", "threshold", Encoding::kFire,
       [](Case&, Fwd&, View*, View*, View*, View*, View*, E* t) { t->fire.threshold = View{}; }},
      {"r1 given to alibi", "r1", Encoding::kAlibi,
       [](Case& c, Fwd&, View*, View*, View*, View*, View*, E* t) {
         c.r1 = {0.5, 0.5};
         t->r1 = V(c.r1, {2});
       }},
      {"fire tensors given to kerple", "mlp_w1", Encoding::kKerple,
       [](Case& c, Fwd&, View*, View*, View*, View*, View*, E* t) {
         c.fw1 = {0.5, 0.5};
         t->fire.w1 = V(c.fw1, {2});
       }},
      {"kerple tensors given to sandwich", "r2", Encoding::kSandwich,
       [](Case& c, Fwd&, View*, View*, View*, View*, View*, E* t) {
         c.r2 = {0.5, 0.5};
         t->r2 = V(c.r2, {2});
       }},
      // Every learned tensor must be finite, as slopes and kerple's and fire's tensors are: a NaN
      // or ±inf would spread through the softmax to every output of its row.
      {"learned weights not finite", "weights", Encoding::kAlibi,
       [](Case& c, Fwd&, View*, View*, View*, View*, View*, E* t) {
         c.p.alibi.variant = AlibiVariant::kLearned;
         c.weights = {0.5, -0.5, std::nan(""), 1.0};
         t->weights = V(c.weights, {2, 2});
       }},
      {"t5 weights not finite", "weights", Encoding::kT5,
       [](Case& c, auto&&...) { c.weights.back() = -std::numeric_limits<double>::infinity(); }},
      {"xl u not finite", "u", Encoding::kXL, [](Case& c, auto&&...) { c.u[3] = std::nan(""); }},
      {"xl v_bias not finite", "v_bias", Encoding::kXL,
       [](Case& c, auto&&...) { c.vb[0] = std::numeric_limits<double>::infinity(); }},
      {"xl rel_proj not finite", "rel_proj", Encoding::kXL, [](Case& c, auto&&...) { c.W[5] = std::nan(""); }},
      {"cope table not finite", "table", Encoding::kCope,
       [](Case& c, auto&&...) { c.table[2] = std::numeric_limits<double>::infinity(); }},
      {"kerple r2 not finite", "r2", Encoding::kKerple, [](Case& c, auto&&...) { c.r2[1] = std::nan(""); }},
      {"fire mlp_b1 not finite", "mlp_b1", Encoding::kFire, [](Case& c, auto&&...) { c.fb1[0] = std::nan(""); }},
      {"lse inside out", "lse", Encoding::kNope,
       [](Case&, Fwd&, View*, View*, View*, View* out, View* lse, E*) { lse->data = out->data; }},
  };
  for (Bad& b : bad) {
    SCOPED_TRACE(b.name);
    Variant var{"x", b.enc};
    Case c = make_case(var, 2, 3, 4, 2, 2, 4, false, 151);
    if (b.enc == Encoding::kLearned || b.enc == Encoding::kSinusoidal) c.p.encoding = b.enc;
    Fwd r;
    const double guard = 777.0;
    r.out.assign(c.q.size(), guard);
    r.lse.assign(ix(2 * 2 * 3), guard);
    View q = V(c.q, {2, 3, 2, 4}), k = V(c.k, {2, 4, 2, 4}), v = V(c.v, {2, 4, 2, 4});
    View out = V(r.out, {2, 3, 2, 4}), lse = V(r.lse, {2, 2, 3});
    EncodingTensors t = c.tensors();
    b.edit(c, r, &q, &k, &v, &out, &lse, &t);
    if (b.name == "slopes shape") t.slopes = V(c.slopes, {3});
    if (b.name == "slopes not finite") t.slopes = V(c.slopes, {2});
    const Status st = attention_forward(c.p, q, k, v, t, out, lse);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.arg(), b.arg) << st.message();
    EXPECT_FALSE(st.what().empty());
    for (double e : r.out) EXPECT_EQ(e, guard) << "out written before the error";
    for (double e : r.lse) EXPECT_EQ(e, guard) << "lse written before the error";
  }
}

TEST(AttentionErrors, AbsoluteEncodingsPointToApply) {
  Case c = make_case(Variant{"x", Encoding::kNope}, 1, 2, 2, 1, 1, 2, false, 1);
  c.p.encoding = Encoding::kSinusoidal;
  const Fwd f = forward(c);
  ASSERT_FALSE(f.st.ok());
  EXPECT_NE(f.st.what().find("absolute"), std::string::npos) << f.st.message();
  EXPECT_NE(f.st.what().find("apply"), std::string::npos) << f.st.message();
}

TEST(AttentionErrors, EveryBadBackwardInputNamesItsArgument) {
  struct BadB {
    std::string name, arg;
    Encoding enc;
    std::function<void(View*, View*, View*, View*, EncodingGrads*)> edit;  // dout, dq, dk, dv, g
  };
  std::vector<BadB> bad = {
      {"dout absent", "dout", Encoding::kNope, [](View* d, View*, View*, View*, EncodingGrads*) { *d = View{}; }},
      {"dout shape", "dout", Encoding::kNope, [](View* d, View*, View*, View*, EncodingGrads*) { d->shape[2] = 1; }},
      {"dq shape", "dq", Encoding::kNope, [](View*, View* d, View*, View*, EncodingGrads*) { d->shape[1] = 4; }},
      {"dq dtype", "dq", Encoding::kNope, [](View*, View* d, View*, View*, EncodingGrads*) { d->dtype = DType::kF32; }},
      {"dk shape", "dk", Encoding::kNope, [](View*, View*, View* d, View*, EncodingGrads*) { d->shape[1] = 3; }},
      {"dv shape", "dv", Encoding::kNope, [](View*, View*, View*, View* d, EncodingGrads*) { d->shape[3] = 3; }},
      {"t5 dweights", "dweights", Encoding::kT5, [](View*, View*, View*, View*, EncodingGrads* g) { g->weights.shape[0] = 4; }},
      {"xl du", "du", Encoding::kXL, [](View*, View*, View*, View*, EncodingGrads* g) { g->u.ndim = 1; }},
      {"xl dv", "dv_bias", Encoding::kXL, [](View*, View*, View*, View*, EncodingGrads* g) { g->v.shape[0] = 1; }},
      {"xl drel_proj", "drel_proj", Encoding::kXL, [](View*, View*, View*, View*, EncodingGrads* g) { g->rel_proj.shape[2] = 2; }},
      {"cope dtable", "dtable", Encoding::kCope, [](View*, View*, View*, View*, EncodingGrads* g) { g->table.shape[0] = 9; }},
      {"a gradient the encoding has no tensor for", "dtable", Encoding::kXL,
       [](View*, View*, View*, View*, EncodingGrads* g) {
         static Vec spare(8);
         g->table = V(spare, {2, 4});
       }},
      {"cope dtable int", "dtable", Encoding::kCope, [](View*, View*, View*, View*, EncodingGrads* g) { g->table.dtype = DType::kI32; }},
      {"kerple dr1", "dr1", Encoding::kKerple, [](View*, View*, View*, View*, EncodingGrads* g) { g->r1.shape[0] = 3; }},
      {"kerple dr2 int", "dr2", Encoding::kKerple, [](View*, View*, View*, View*, EncodingGrads* g) { g->r2.dtype = DType::kI64; }},
      {"fire dmlp_w2", "dmlp_w2", Encoding::kFire, [](View*, View*, View*, View*, EncodingGrads* g) { g->fire.w2.shape[1] = 2; }},
      {"fire dthreshold", "dthreshold", Encoding::kFire, [](View*, View*, View*, View*, EncodingGrads* g) { g->fire.threshold.shape[0] = 2; }},
      {"a fire gradient for kerple", "dmlp_b1", Encoding::kKerple,
       [](View*, View*, View*, View*, EncodingGrads* g) {
         static Vec spare(5);
         g->fire.b1 = V(spare, {5});
       }},
      {"dv on dk", "dv", Encoding::kNope, [](View*, View*, View* dk, View* dv, EncodingGrads*) { dv->data = dk->data; }},
      {"dv on dk, shifted", "dv", Encoding::kNope,
       [](View*, View*, View* dk, View* dv, EncodingGrads*) { dv->data = static_cast<double*>(dk->data) + 1; }},
      {"t5 dweights inside dv", "dweights", Encoding::kT5,
       [](View*, View*, View*, View* dv, EncodingGrads* g) { g->weights.data = static_cast<double*>(dv->data) + 8; }},
      {"a kerple gradient for sandwich", "dr1", Encoding::kSandwich,
       [](View*, View*, View*, View*, EncodingGrads* g) {
         static Vec spare(2);
         g->r1 = V(spare, {2});
       }},
  };
  for (BadB& b : bad) {
    SCOPED_TRACE(b.name);
    Case c = make_case(Variant{"x", b.enc}, 2, 3, 4, 2, 2, 4, false, 161);
    const double guard = 555.0;
    Vec dout = randn(c.q.size(), 162), dq(c.q.size(), guard), dk(c.k.size(), guard), dv(c.v.size(), guard);
    Vec dw(c.weights.size(), guard), du(c.u.size(), guard), dvb(c.vb.size(), guard), dW(c.W.size(), guard),
        dt(c.table.size(), guard);
    View vd = V(dout, {2, 3, 2, 4}), vq = V(dq, {2, 3, 2, 4}), vk = V(dk, {2, 4, 2, 4}), vv = V(dv, {2, 4, 2, 4});
    EncodingGrads g;
    if (b.enc == Encoding::kT5) g.weights = V(dw, {c.p.t5.num_buckets, 2});
    if (b.enc == Encoding::kXL) g.u = V(du, {2, 4}), g.v = V(dvb, {2, 4}), g.rel_proj = V(dW, {2, 4, c.R});
    if (b.enc == Encoding::kCope) g.table = V(dt, {c.npos, 4});
    Vec d1(2, guard), d2(2, guard), f1(ix(c.fw), guard), f2(ix(c.fw), guard), f3(ix(2 * c.fw), guard), f4(2, guard),
        f5(1, guard), f6(1, guard);
    if (b.enc == Encoding::kKerple) g.r1 = V(d1, {2}), g.r2 = V(d2, {2});
    if (b.enc == Encoding::kFire)
      g.fire = FireTensors{V(f1, {c.fw}), V(f2, {c.fw}), V(f3, {2, c.fw}), V(f4, {2}), V(f5, {1}), V(f6, {1})};
    b.edit(&vd, &vq, &vk, &vv, &g);
    const Status st = attention_backward(c.p, V(c.q, {2, 3, 2, 4}), V(c.k, {2, 4, 2, 4}), V(c.v, {2, 4, 2, 4}),
                                         c.tensors(), vd, vq, vk, vv, g);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.arg(), b.arg) << st.message();
    for (const Vec* x : {&dq, &dk, &dv, &dw, &du, &dvb, &dW, &dt, &d1, &d2, &f1, &f2, &f3, &f4, &f5, &f6})
      for (double e : *x) EXPECT_EQ(e, guard) << "a gradient was written before the error";
  }
}

TEST(AttentionErrors, MessagesSayWhatWasExpectedAndFound) {
  Case c = make_case(Variant{"x", Encoding::kNope}, 2, 3, 4, 4, 2, 4, false, 171);
  Vec out(c.q.size());
  const Status st = attention_forward(c.p, V(c.q, {2, 3, 4, 4}), V(c.k, {2, 4, 3, 4}), V(c.v, {2, 4, 3, 4}), {},
                                      V(out, {2, 3, 4, 4}));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.arg(), "k");
  EXPECT_NE(st.what().find('4'), std::string::npos) << st.message();
  EXPECT_NE(st.what().find('3'), std::string::npos) << st.message();
}

}  // namespace
}  // namespace posenc

// The rotary encodings of rotary.h (rope2d axial and mixed with its dfreqs, mrope chunked and
// interleaved, xpos queries and keys) through RoPE's kernel with a plan, against posenc::reference::
// on every SIMD target here, for float32 / bfloat16 / float16 storage. Never times anything.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fast_elementwise_testing.h"

namespace posenc {
namespace {

using namespace ::posenc::fast_elementwise_testing;  // NOLINT: the fixtures of these tests

// ---- the rotary encodings of rotary.h: RoPE's kernel with a plan ----------------------------------
// rope2d (axial, mixed), mrope (chunked, interleaved) and xpos (query, key) against the reference on
// every target and dtype, odd sizes, strided / misaligned / in-place views with guard bands, shared
// and batched positions of both integer types, forward and backward; mixed's dfreqs (float math,
// summed per thread in double) against the reference's double sums, on one and two threads.
struct RotaryCase {
  std::int64_t B, L, H, D, r;
};
const RotaryCase kRotaryCases[] = {{1, 1, 1, 4, 0}, {2, 3, 2, 12, 8}, {1, 19, 3, 64, 0}, {2, 5, 2, 130, 128},
                                   {1, 21, 2, 68, 64}};

enum class RotaryKind { kAxial, kMixed, kMrope, kMropeInterleaved, kXposQuery, kXposKey };
const char* rotary_kind_name(RotaryKind k) {
  switch (k) {
    case RotaryKind::kAxial: return "rope2d_axial";
    case RotaryKind::kMixed: return "rope2d_mixed";
    case RotaryKind::kMrope: return "mrope_chunked";
    case RotaryKind::kMropeInterleaved: return "mrope_interleaved";
    case RotaryKind::kXposQuery: return "xpos_query";
    default: return "xpos_key";
  }
}

// One call of either side (public or reference) of the encoding `kind`.
// r: rotary_dim (0 = D); r_full: its value (mrope's sections sum to r_full/2).
Status rotary_call(bool fast, RotaryKind kind, RopeLayout layout, std::int64_t r, std::int64_t r_full, bool backward,
                   const View& x, const Positions& pos, const View& freqs, const View& y) {
  if (kind == RotaryKind::kAxial || kind == RotaryKind::kMixed) {
    Rope2dParams p;
    p.variant = kind == RotaryKind::kMixed ? Rope2dVariant::kMixed : Rope2dVariant::kAxial;
    p.rope.layout = layout;
    p.rope.rotary_dim = r;
    if (backward)
      return fast ? rope2d_backward(p, x, pos, freqs, y) : reference::rope2d_backward(p, x, pos, freqs, y);
    return fast ? rope2d_forward(p, x, pos, freqs, y) : reference::rope2d_forward(p, x, pos, freqs, y);
  }
  if (kind == RotaryKind::kMrope || kind == RotaryKind::kMropeInterleaved) {
    MropeParams p;
    p.variant = kind == RotaryKind::kMrope ? MropeVariant::kChunked : MropeVariant::kInterleaved;
    p.rope.layout = layout;
    p.rope.rotary_dim = r;
    const std::int64_t half = r_full / 2, s = half / 3;
    p.mrope_section = {half - 2 * s, s, s};
    p.rope.theta = 1e6;
    if (half % 2 == 0) {  // a scheme with an attention factor on some shapes
      p.rope.rope_type = RopeType::kYarn;
      p.rope.factor = 4;
      p.rope.original_max_position = 256;
    }
    if (backward) return fast ? mrope_backward(p, x, pos, y) : reference::mrope_backward(p, x, pos, y);
    return fast ? mrope_forward(p, x, pos, y) : reference::mrope_forward(p, x, pos, y);
  }
  XposParams p;
  p.rope.layout = layout;
  p.rope.rotary_dim = r;
  const XposRole role = kind == RotaryKind::kXposQuery ? XposRole::kQuery : XposRole::kKey;
  if (backward) return fast ? xpos_backward(p, role, x, pos, y) : reference::xpos_backward(p, role, x, pos, y);
  return fast ? xpos_forward(p, role, x, pos, y) : reference::xpos_forward(p, role, x, pos, y);
}

int rotary_axes(RotaryKind k) {
  return k == RotaryKind::kAxial || k == RotaryKind::kMixed ? 2 : k == RotaryKind::kMrope || k == RotaryKind::kMropeInterleaved ? 3 : 1;
}

TEST(FastElementwiseRotary, MatchesReferenceEveryTargetDtypeOption) {
  int n = 0;
  ForEachTarget([&](const std::string& target) {
    for (RotaryKind kind : {RotaryKind::kAxial, RotaryKind::kMixed, RotaryKind::kMrope, RotaryKind::kMropeInterleaved,
                            RotaryKind::kXposQuery, RotaryKind::kXposKey})
      for (DType dt : kDtypes)
        for (const RotaryCase& c : kRotaryCases) {
          ++n;
          const RopeLayout layout = n % 2 ? RopeLayout::kInterleaved : RopeLayout::kHalf;
          const bool backward = n % 3 == 1, strided = n % 4 == 0, misaligned = n % 5 == 1, in_place = n % 7 == 2,
                     batched = n % 2 == 0, int32 = n % 3 == 0;
          const std::int64_t r = c.r == 0 ? c.D : c.r, A = rotary_axes(kind);
          const std::vector<std::int64_t> shape = {c.B, c.L, c.H, c.D};
          const std::vector<double> xs = randn(static_cast<std::size_t>(c.B * c.L * c.H * c.D), 3100 + n);
          Buf x(dt, shape, strided, misaligned), y(dt, shape, !strided, !misaligned), rx(dt, shape), ry(dt, shape);
          x.fill(xs);
          rx.fill(xs);
          // positions: [A, L] or [B, A, L] (xpos: [L] or [B, L]), values up to ~3000
          const std::int64_t np = (batched ? c.B : 1) * A * c.L;
          const std::vector<double> pr = random_positions(np, 3200 + n, 1500.0);
          std::vector<std::int32_t> i32(static_cast<std::size_t>(np));
          std::vector<std::int64_t> i64(static_cast<std::size_t>(np));
          for (std::size_t i = 0; i < i32.size(); ++i) i32[i] = static_cast<std::int32_t>(pr[i]), i64[i] = static_cast<std::int64_t>(pr[i]);
          std::vector<std::int64_t> pshape;
          if (batched) pshape.push_back(c.B);
          if (A > 1) pshape.push_back(A);
          pshape.push_back(c.L);
          Positions pos;
          pos.ids = View::contiguous(int32 ? static_cast<void*>(i32.data()) : static_cast<void*>(i64.data()),
                                     int32 ? DType::kI32 : DType::kI64, pshape);
          if (n % 11 == 5) pos = Positions{View{}, 777};  // no ids: the offset in every component
          Buf f(dt, {2, c.H, r / 2});
          f.fill(randn(static_cast<std::size_t>(2 * c.H * r / 2), 3300 + n, 0.3));
          const View fv = kind == RotaryKind::kMixed ? f.v : View{};
          const View& out = in_place ? x.v : y.v;
          const Status s = rotary_call(true, kind, layout, c.r, r, backward, x.v, pos, fv, out);
          const Status rs = rotary_call(false, kind, layout, c.r, r, backward, rx.v, pos, fv, ry.v);
          const std::string what = target + " " + rotary_kind_name(kind) + " " + rope_layout_name(layout) + " " +
                                   dtype_name(dt) + " case " + std::to_string(n) + " D=" + std::to_string(c.D) +
                                   (backward ? " backward" : " forward");
          ExpectCallMatches(s, rs, what, dt, in_place, x, y, ry);
        }
  });
  EXPECT_GT(n, 0);
}

TEST(FastElementwiseRotary, MixedFrequencyGradientMatchesReference) {
  int n = 0;
  ForEachTarget([&](const std::string& target) {
    for (DType dt : kDtypes)
      for (const RotaryCase& c : kRotaryCases) {
        ++n;
        const std::int64_t r = c.r == 0 ? c.D : c.r;
        Rope2dParams p;
        p.variant = Rope2dVariant::kMixed;
        p.rope.layout = n % 2 ? RopeLayout::kInterleaved : RopeLayout::kHalf;
        p.rope.rotary_dim = c.r;
        const std::vector<std::int64_t> shape = {c.B, c.L, c.H, c.D};
        Buf x(dt, shape, n % 3 == 0), dy(dt, shape, false, n % 2 == 0), dx(dt, shape, n % 4 == 1);
        x.fill(randn(static_cast<std::size_t>(c.B * c.L * c.H * c.D), 3400 + n));
        dy.fill(randn(static_cast<std::size_t>(c.B * c.L * c.H * c.D), 3500 + n));
        Buf f(DType::kF64, {2, c.H, r / 2}), df(DType::kF64, {2, c.H, r / 2}), wdf(DType::kF64, {2, c.H, r / 2});
        f.fill(randn(static_cast<std::size_t>(2 * c.H * r / 2), 3600 + n, 0.3));
        std::vector<std::int64_t> ids(static_cast<std::size_t>(c.B * 2 * c.L));
        for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>((i * 7) % 23);
        const Positions pos{View::contiguous(ids.data(), DType::kI64, {c.B, 2, c.L}), 0};
        for (int threads : {1, 2}) {
          set_num_threads(threads);
          df.reset();
          const std::string what = target + " " + dtype_name(dt) + " case " + std::to_string(n) + " threads " +
                                   std::to_string(threads);
          ASSERT_TRUE(rope2d_backward(p, dy.v, pos, f.v, dx.v, x.v, df.v).ok()) << what;
          ASSERT_TRUE(reference::rope2d_backward(p, dy.v, pos, f.v, View{}, x.v, wdf.v).ok());
          const std::vector<double> want = wdf.values();
          double amax = 1e-30;
          for (double v : want) amax = std::max(amax, std::fabs(v));
          // float math on the same stored values: each term to ~1e-6 relative, the sums compared
          // relative to their largest entry
          EXPECT_TRUE(AllClose(df.values(), want, 2e-5 * amax, 1e-5)) << what;
          EXPECT_TRUE(df.guards_ok() && dx.guards_ok()) << what;
        }
        set_num_threads(0);
      }
  });
}

}  // namespace
}  // namespace posenc

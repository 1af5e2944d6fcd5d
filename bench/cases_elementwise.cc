// The elementwise cases of `posenc bench`: RoPE and the absolute encodings against memcpy of the same
// bytes, the bias generators against memset of their output.
#include "bench/bench_cases.h"
#include "posenc/absolute.h"
#include "posenc/bias.h"
#include "posenc/rope.h"

namespace posenc::bench_impl {
namespace {

// scheme: "" plain RoPE; "yarn" Qwen2.5's YaRN (theta 10⁶, s = 4, L = 32768: attention factor ≠ 1);
// "hf" plain RoPE with transformers' float32 angles (formed per token).
RopeParams bench_rope_params(const std::string& scheme, RopeLayout layout) {
  RopeParams p;
  p.layout = layout;
  if (scheme == "yarn") {
    p.rope_type = RopeType::kYarn;
    p.theta = 1e6;
    p.factor = 4;
    p.original_max_position = 32768;
  } else if (scheme == "hf") {
    p.angles = RopeAngles::kHf;
  }
  return p;
}

Case rope_case(const std::string& kernel, std::vector<I> shape, DType dt, RopeLayout layout, bool in_place,
               bool backward, const std::string& scheme = "") {
  Case c{kernel + "." + rope_layout_name(layout) + (in_place ? ".inplace" : "") + (scheme.empty() ? "" : "." + scheme),
         "rope", shape_str(shape), dt};
  c.setup = [=](int threads) {
    const I n = numel(shape);
    const std::size_t bytes = ix(n) * dtype_size(dt);
    auto q = std::make_shared<Mem>(bytes, threads), kk = std::make_shared<Mem>(bytes, threads);
    auto qo = std::make_shared<Mem>(bytes, threads), ko = std::make_shared<Mem>(bytes, threads);
    fill_random(q->data(), ix(n), dt);
    fill_random(kk->data(), ix(n), dt);
    const RopeParams p = bench_rope_params(scheme, layout);
    const View qv = View::contiguous(q->data(), dt, shape), kv = View::contiguous(kk->data(), dt, shape);
    const View qov = in_place ? qv : View::contiguous(qo->data(), dt, shape);
    const View kov = in_place ? kv : View::contiguous(ko->data(), dt, shape);
    Positions pos;
    pos.offset = shape[1] == 1 ? 4095 : 0;  // a decode step sits at the end of the context
    auto keep = std::make_shared<Keep>(Keep{q, kk, qo, ko});
    Bound b;
    b.kernel = [=] { (void)rope_apply_qk(p, qv, kv, pos, qov, kov, backward); };
    b.kernel_work = b.baseline_work = 4.0 * static_cast<double>(bytes);  // q, k read and written
    b.baseline = memcpy_baseline(b.kernel_work, baseline_threads(n, threads), keep.get());
    b.baseline_name = "memcpy";
    b.keep = keep;
    return b;
  };
  return c;
}

Case absolute_case(const std::string& enc, std::vector<I> shape, DType dt, bool in_place) {
  Case c{enc + ".forward" + (in_place ? ".inplace" : ""), enc, shape_str(shape), dt};
  c.setup = [=](int threads) {
    const I n = numel(shape);
    const std::size_t bytes = ix(n) * dtype_size(dt);
    auto x = std::make_shared<Mem>(bytes, threads), y = std::make_shared<Mem>(bytes, threads);
    fill_random(x->data(), ix(n), dt);
    const View xv = View::contiguous(x->data(), dt, shape);
    const View yv = in_place ? xv : View::contiguous(y->data(), dt, shape);
    auto keep = std::make_shared<Keep>(Keep{x, y});
    Bound b;
    b.kernel_work = 2.0 * static_cast<double>(bytes);  // x read, y written
    if (enc == "learned") {
      // The table rows of positions 0 .. L−1 are read once per batch element.
      const std::size_t tbytes = ix(shape[1] * shape[2]) * dtype_size(dt);
      auto table = std::make_shared<Mem>(tbytes, threads);
      fill_random(table->data(), ix(shape[1] * shape[2]), dt);
      keep->push_back(table);
      const View tv = View::contiguous(table->data(), dt, {shape[1], shape[2]});
      b.kernel = [=] { (void)learned_forward(LearnedParams{}, xv, tv, Positions{}, yv); };
      b.kernel_work += static_cast<double>(shape[0]) * static_cast<double>(tbytes);
    } else {
      b.kernel = [=] { (void)sinusoidal_forward(SinusoidalParams{}, xv, Positions{}, yv); };
    }
    b.baseline_work = b.kernel_work;
    b.baseline = memcpy_baseline(b.kernel_work, baseline_threads(n, threads), keep.get());
    b.baseline_name = "memcpy";
    b.keep = keep;
    return b;
  };
  return c;
}

Case bias_case(const std::string& enc, std::vector<I> shape, DType dt) {
  Case c{enc + ".bias", enc, shape_str(shape), dt};
  c.setup = [=](int threads) {
    const std::size_t bytes = ix(numel(shape)) * dtype_size(dt);
    auto out = std::make_shared<Mem>(bytes, threads);
    auto w = std::make_shared<Mem>(ix(64 * shape[0]) * dtype_size(dt), 1);  // weights of any of them
    fill_random(w->data(), ix(64 * shape[0]), dt);
    const BiasGeometry g{shape[0], shape[1], shape[2], 0, 0};
    const View ov = View::contiguous(out->data(), dt, shape);
    Bound b;
    const I H = shape[0];
    if (enc == "alibi") {
      b.kernel = [=] { (void)alibi_bias(AlibiParams{}, g, View{}, View{}, ov); };
    } else if (enc == "kerple") {  // log kernel; r1, r2 positive (the buffer's first 2H values)
      const View r1 = View::contiguous(w->data(), dt, {H});
      const View r2 = View::contiguous(static_cast<char*>(w->data()) + ix(H) * dtype_size(dt), dt, {H});
      for (I h = 0; h < H; ++h) r1.set(h, 0.5 + 0.1 * static_cast<double>(h)), r2.set(h, 0.1 + 0.05 * static_cast<double>(h));
      b.kernel = [=] { (void)kerple_bias(KerpleParams{}, g, r1, r2, ov); };
    } else if (enc == "sandwich") {
      b.kernel = [=] { (void)sandwich_bias(SandwichParams{}, g, ov); };
    } else if (enc == "fire") {  // width 32, c = 0.1, L = 512 (the paper's), the MLP from the buffer
      const I W = 32;
      char* base = static_cast<char*>(w->data());
      auto at = [&](I off) { return base + ix(off) * dtype_size(dt); };
      FireTensors f;
      f.w1 = View::contiguous(at(0), dt, {W});
      f.b1 = View::contiguous(at(W), dt, {W});
      f.w2 = View::contiguous(at(2 * W), dt, {H, W});  // 2W + H·W ≤ 64·H for H ≥ 2
      fill_all(f.w1, 7, 1.0);
      fill_all(f.b1, 8, 0.5);
      fill_all(f.w2, 9, 0.3);
      auto extra = std::make_shared<std::vector<double>>(std::vector<double>(ix(H) + 2, 0.1));
      f.b2 = View::contiguous(extra->data(), DType::kF64, {H});
      f.c = View::contiguous(extra->data() + H, DType::kF64, {1});
      f.threshold = View::contiguous(extra->data() + H + 1, DType::kF64, {1});
      (*extra)[ix(H + 1)] = 512.0;
      b.kernel = [=] { (void)fire_bias(FireParams{}, g, f, ov); (void)extra; };
    } else {
      const View wv = View::contiguous(w->data(), dt, {32, shape[0]});
      b.kernel = [=] { (void)t5_bias(T5Params{}, g, wv, ov); };
    }
    const int bt = baseline_threads(numel(shape), threads);
    b.baseline = [=] { par_memset(out->data(), bytes, bt); };
    b.kernel_work = b.baseline_work = static_cast<double>(bytes);  // write-only (the weights are tiny)
    b.baseline_name = "memset";
    b.keep = std::make_shared<Keep>(Keep{out, w});
    return b;
  };
  return c;
}

}  // namespace

std::vector<Case> elementwise_cases() {
  std::vector<Case> cs;
  const std::vector<I> qk = {1, 4096, 32, 128}, dec = {1, 1, 32, 128}, emb = {1, 4096, 4096};
  for (DType dt : {DType::kF32, DType::kBF16})
    for (RopeLayout l : {RopeLayout::kInterleaved, RopeLayout::kHalf}) {
      cs.push_back(rope_case("rope.forward.qk", qk, dt, l, false, false));
      cs.push_back(rope_case("rope.forward.qk", qk, dt, l, true, false));
    }
  cs.push_back(rope_case("rope.decode.qk", dec, DType::kF32, RopeLayout::kHalf, false, false));
  cs.push_back(rope_case("rope.decode.qk", dec, DType::kBF16, RopeLayout::kHalf, false, false));
  cs.push_back(rope_case("rope.backward.qk", qk, DType::kF32, RopeLayout::kHalf, false, true));
  cs.push_back(rope_case("rope.forward.qk", qk, DType::kF32, RopeLayout::kHalf, false, false, "yarn"));
  cs.push_back(rope_case("rope.forward.qk", qk, DType::kF32, RopeLayout::kHalf, false, false, "hf"));
  for (const char* enc : {"sinusoidal", "learned"})
    for (DType dt : {DType::kF32, DType::kBF16}) {
      cs.push_back(absolute_case(enc, emb, dt, false));
      cs.push_back(absolute_case(enc, emb, dt, true));
    }
  cs.push_back(bias_case("alibi", {8, 2048, 2048}, DType::kF32));
  cs.push_back(bias_case("t5", {8, 2048, 2048}, DType::kF32));
  for (const char* enc : {"kerple", "sandwich", "fire"}) cs.push_back(bias_case(enc, {8, 2048, 2048}, DType::kF32));
  return cs;
}

}  // namespace posenc::bench_impl

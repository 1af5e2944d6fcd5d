// Many threads at once (docs/reliability.md, Threads): a deterministic list of calls (every attention
// encoding forward and backward, the rotary, absolute and bias kernels, random shapes, some invalid)
// is run once alone, then by 8 std::threads at once, each with its own outputs; every result must
// equal the lone one bit for bit (the same Status message for an invalid call). The thread count is
// held fixed: some backward sums depend on it (see ThreadCount below). Also: the C ABI's last error
// stays per thread, and the OS threads that concurrent callers start are bounded.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "posenc/posenc.h"
#include "posenc/c_api.h"
#include "posenc/threads.h"

extern "C" int openblas_get_num_threads(void);

namespace posenc {
namespace {

using I = std::int64_t;
using Bytes = std::vector<unsigned char>;

// One output buffer: its dtype and shape; filled with a fixed pattern before every run so that an
// element a call leaves unwritten compares equal too.
struct OutSpec {
  DType dtype;
  std::vector<I> shape;
  std::size_t bytes() const {
    std::size_t n = dtype_size(dtype);
    for (I s : shape) n *= static_cast<std::size_t>(s);
    return n;
  }
};

struct Call {
  std::string name;
  std::vector<OutSpec> outs;
  // Runs the call with views of `bufs` (one per OutSpec) as its outputs.
  std::function<Status(const std::vector<View>& outs)> run;
};

struct Result {
  std::string message;  // "" for ok
  Bytes bytes;          // every output buffer, concatenated
};

Result execute(const Call& c) {
  std::vector<Bytes> bufs;
  std::vector<View> views;
  for (const OutSpec& o : c.outs) {
    bufs.emplace_back(o.bytes(), 0xAB);
    views.push_back(View::contiguous(bufs.back().data(), o.dtype, o.shape));
  }
  const Status s = c.run(views);
  Result r{s.ok() ? "" : s.message(), {}};
  for (const Bytes& b : bufs) r.bytes.insert(r.bytes.end(), b.begin(), b.end());
  return r;
}

// Immutable inputs shared by a call's runs.
struct Store {
  std::vector<std::vector<float>> f;
  std::vector<std::vector<double>> d;
  View add(std::mt19937_64& rng, std::vector<I> shape, double scale = 1.0) {
    std::size_t n = 1;
    for (I s : shape) n *= static_cast<std::size_t>(s);
    std::normal_distribution<float> nd(0.f, static_cast<float>(scale));
    f.emplace_back(n);
    for (float& x : f.back()) x = nd(rng);
    return View::contiguous(f.back().data(), DType::kF32, shape);
  }
  View add32(const std::vector<double>& values, std::vector<I> shape) {
    f.emplace_back(values.begin(), values.end());
    return View::contiguous(f.back().data(), DType::kF32, shape);
  }
  View add64(std::vector<double> values, std::vector<I> shape) {
    d.push_back(std::move(values));
    return View::contiguous(d.back().data(), DType::kF64, shape);
  }
};

std::vector<double> uniform(std::mt19937_64& rng, std::size_t n, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

// An attention call: forward (out, lse) or backward (dq, dk, dv and the parameter gradients).
Call attention_call(Encoding e, std::mt19937_64& rng, bool backward, bool large, bool invalid) {
  auto st = std::make_shared<Store>();
  std::uniform_int_distribution<I> len(1, 40);
  const I B = large ? 1 : 1 + static_cast<I>(rng() % 2), Hkv = 1 + static_cast<I>(rng() % 2),
          Hq = Hkv * (1 + static_cast<I>(rng() % 2)), D0 = large ? 64 : 4 * (1 + static_cast<I>(rng() % 4));
  const I D = e == Encoding::kMrope ? 16 : D0;  // three sections of D/2 pairs
  const I M = large ? 256 : len(rng), N = large ? 256 : M + static_cast<I>(rng() % 8);
  AttentionParams p;
  p.encoding = e;
  p.causal = rng() % 2 == 0;
  EncodingTensors t;
  EncodingGrads g;
  std::vector<OutSpec> outs;
  auto grad = [&](View* slot, const View& like) {
    if (!backward || !like.present()) return;
    *slot = View::contiguous(nullptr, DType::kF64, like.shape_vec());
    outs.push_back({DType::kF64, like.shape_vec()});
  };
  switch (e) {
    case Encoding::kT5:
      p.t5.num_buckets = 16;
      p.t5.max_distance = 40;
      t.weights = st->add64(uniform(rng, static_cast<std::size_t>(16 * Hq), -1, 1), {16, Hq});
      break;
    case Encoding::kXL:
      t.u = st->add64(uniform(rng, static_cast<std::size_t>(Hq * D), -0.5, 0.5), {Hq, D});
      t.v = st->add64(uniform(rng, static_cast<std::size_t>(Hq * D), -0.5, 0.5), {Hq, D});
      t.rel_proj = st->add64(uniform(rng, static_cast<std::size_t>(Hq * D * 8), -0.5, 0.5), {Hq, D, 8});
      break;
    case Encoding::kCope: t.table = st->add64(uniform(rng, static_cast<std::size_t>(12 * D), -1, 1), {12, D}); break;
    case Encoding::kKerple:
      t.r1 = st->add64(uniform(rng, static_cast<std::size_t>(Hq), 0.2, 1.5), {Hq});
      t.r2 = st->add64(uniform(rng, static_cast<std::size_t>(Hq), 0.1, 1.5), {Hq});
      break;
    case Encoding::kFire: {
      const I W = 6;
      t.fire = FireTensors{st->add64(uniform(rng, W, -1, 1), {W}), st->add64(uniform(rng, W, -1, 1), {W}),
                           st->add64(uniform(rng, static_cast<std::size_t>(Hq * W), -1, 1), {Hq, W}),
                           st->add64(uniform(rng, static_cast<std::size_t>(Hq), -1, 1), {Hq}),
                           st->add64({0.2}, {1}), st->add64({30.5}, {1})};
      break;
    }
    case Encoding::kMrope: {
      p.mrope.mrope_section = {4, 2, 2};
      break;
    }
    default: break;
  }
  const View q = st->add(rng, {B, M, Hq, D}), k = st->add(rng, {B, N, Hkv, D}), v = st->add(rng, {B, N, Hkv, D});
  // invalid: v's head dimension off by one (the same message every time)
  const View vv = invalid ? st->add(rng, {B, N, Hkv, D + 1}) : v;
  std::string name = std::string(encoding_info(e).name) + (backward ? " backward" : " forward") +
                     (invalid ? " invalid" : "");
  if (!backward) {
    outs = {{DType::kF32, {B, M, Hq, D}}, {DType::kF64, {B, Hq, M}}};
    return {name, outs, [st, p, t, q, k, vv](const std::vector<View>& o) {
              return attention_forward(p, q, k, vv, t, o[0], o[1]);
            }};
  }
  const View dout = st->add(rng, {B, M, Hq, D});
  outs = {{DType::kF32, {B, M, Hq, D}}, {DType::kF32, {B, N, Hkv, D}}, {DType::kF32, {B, N, Hkv, D}}};
  grad(&g.weights, t.weights);
  grad(&g.u, t.u);
  grad(&g.v, t.v);
  grad(&g.rel_proj, t.rel_proj);
  grad(&g.table, t.table);
  grad(&g.r1, t.r1);
  grad(&g.r2, t.r2);
  for (auto [slot, like] : {std::pair<View*, const View*>{&g.fire.w1, &t.fire.w1}, {&g.fire.b1, &t.fire.b1}, {&g.fire.w2, &t.fire.w2},
                            {&g.fire.b2, &t.fire.b2}, {&g.fire.c, &t.fire.c}, {&g.fire.threshold, &t.fire.threshold}})
    grad(slot, *like);
  return {name, outs, [st, p, t, g, q, k, vv, dout](const std::vector<View>& o) {
            // the gradient views get their buffers: outputs 3.. in the order grad() listed them
            EncodingGrads gg = g;
            std::size_t i = 3;
            for (View* s : {&gg.weights, &gg.u, &gg.v, &gg.rel_proj, &gg.table, &gg.r1, &gg.r2, &gg.fire.w1,
                            &gg.fire.b1, &gg.fire.w2, &gg.fire.b2, &gg.fire.c, &gg.fire.threshold})
              if (s->ndim > 0) *s = o[i++];
            return attention_backward(p, q, k, vv, t, dout, o[0], o[1], o[2], gg);
          }};
}

// The elementwise kernels: RoPE (forward, backward, q and k in one pass), xPos, sinusoidal, learned,
// and the ALiBi, T5, Sandwich and KERPLE biases.
Call elementwise_call(int kind, std::mt19937_64& rng, bool large, bool invalid) {
  auto st = std::make_shared<Store>();
  const I B = 1 + static_cast<I>(rng() % 2), L = large ? 2048 : 1 + static_cast<I>(rng() % 40),
          H = 1 + static_cast<I>(rng() % 3), D = 2 * (1 + static_cast<I>(rng() % 8));
  const I off = static_cast<I>(rng() % 1000);
  const View x = st->add(rng, {B, L, H, D});
  const Positions pos{View{}, invalid ? -off - 1 - kMaxPosition : off};  // invalid: a position out of range
  const std::vector<OutSpec> y{{DType::kF32, {B, L, H, D}}};
  RopeParams rp;
  rp.theta = 1000.0 + static_cast<double>(rng() % 9000);
  if (rng() % 2) rp.layout = RopeLayout::kInterleaved;
  const std::string sfx = invalid ? " invalid" : "";
  switch (kind) {
    case 0: return {"rope forward" + sfx, y, [st, rp, x, pos](const std::vector<View>& o) { return rope_forward(rp, x, pos, o[0]); }};
    case 1: return {"rope backward" + sfx, y, [st, rp, x, pos](const std::vector<View>& o) { return rope_backward(rp, x, pos, o[0]); }};
    case 2: {
      const View k = st->add(rng, {B, L, 1, D});
      return {"rope qk" + sfx, {y[0], {DType::kF32, {B, L, 1, D}}}, [st, rp, x, k, pos](const std::vector<View>& o) {
                return rope_apply_qk(rp, x, k, pos, o[0], o[1], false);
              }};
    }
    case 3: {
      XposParams xp;
      xp.rope = rp;
      const bool bwd = rng() % 2;
      return {"xpos" + sfx, y, [st, xp, x, pos, bwd](const std::vector<View>& o) {
                return bwd ? xpos_backward(xp, XposRole::kKey, x, pos, o[0]) : xpos_forward(xp, XposRole::kQuery, x, pos, o[0]);
              }};
    }
    case 4: {
      const View x3 = st->add(rng, {B, L, D});
      const bool bwd = rng() % 2;
      return {"sinusoidal" + sfx, {{DType::kF32, {B, L, D}}}, [st, x3, pos, bwd](const std::vector<View>& o) {
                return bwd ? sinusoidal_backward({}, x3, pos, o[0]) : sinusoidal_forward({}, x3, pos, o[0]);
              }};
    }
    case 5: {
      const View x3 = st->add(rng, {B, L, D}), table = st->add(rng, {invalid ? L - 1 + off : L + off, D});
      const Positions lp{View{}, off};  // invalid: the table one row short
      return {"learned" + sfx, {{DType::kF32, {B, L, D}}}, [st, x3, table, lp](const std::vector<View>& o) {
                return learned_forward({}, x3, table, lp, o[0]);
              }};
    }
    default: {
      BiasGeometry g{H, large ? 512 : L, large ? 512 : L + static_cast<I>(rng() % 5), std::nullopt, invalid ? -kMaxPosition - 1 : off};
      const std::vector<OutSpec> bias{{DType::kF32, {g.heads, g.q_len, g.k_len}}};
      const int which = static_cast<int>(rng() % 4);
      T5Params t5{true, 16, 40};
      const View w = st->add(rng, {16, H});
      const View r1 = st->add32(uniform(rng, static_cast<std::size_t>(H), 0.2, 1.5), {H}),
                 r2 = st->add32(uniform(rng, static_cast<std::size_t>(H), 0.1, 1.5), {H});
      return {std::string("bias ") + std::to_string(which) + sfx, bias,
              [st, g, which, t5, w, r1, r2](const std::vector<View>& o) {
                switch (which) {
                  case 0: return alibi_bias({}, g, View{}, View{}, o[0]);
                  case 1: return t5_bias(t5, g, w, o[0]);
                  case 2: return sandwich_bias({}, g, o[0]);
                  default: return kerple_bias({}, g, r1, r2, o[0]);
                }
              }};
    }
  }
}

// The call list: deterministic (seed 28), every attention encoding forward and backward, the
// elementwise kernels, a few calls large enough to use several threads, about one in eight invalid.
std::vector<Call> make_calls(int count) {
  std::mt19937_64 rng(28);
  std::vector<Encoding> attn;
  for (const EncodingInfo& e : registry())
    if (e.kind != Kind::kAbsolute) attn.push_back(e.id);
  std::vector<Call> calls;
  for (int i = 0; i < count; ++i) {
    const bool invalid = rng() % 8 == 0, large = i % 25 == 4 || i % 50 == 7;  // attention, elementwise
    if (i % 2 == 0)
      calls.push_back(attention_call(attn[static_cast<std::size_t>(i / 2) % attn.size()], rng, (i / 2) % 3 == 1, large, invalid));
    else
      calls.push_back(elementwise_call(static_cast<int>(rng() % 7), rng, large, invalid));
  }
  return calls;
}

TEST(ThreadsStress, EightThreadsGiveTheLoneResultsBitForBit) {
  set_num_threads(2);  // held fixed for both runs (some sums depend on the count)
  const std::vector<Call> calls = make_calls(400);
  std::vector<Result> want;
  int invalid = 0;
  for (const Call& c : calls) {
    want.push_back(execute(c));
    invalid += !want.back().message.empty();
    // an invalid call is invalid, a valid one succeeds
    EXPECT_EQ(c.name.find("invalid") != std::string::npos, !want.back().message.empty())
        << c.name << ": " << want.back().message;
  }
  EXPECT_GT(invalid, 10);
  constexpr int kThreads = 8;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::string> first(kThreads);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&, t] {
      std::vector<std::size_t> order(calls.size());  // every call once, in this thread's own order
      for (std::size_t n = 0; n < order.size(); ++n) order[n] = n;
      std::shuffle(order.begin(), order.end(), std::mt19937_64(static_cast<std::uint64_t>(t)));
      for (std::size_t i : order) {
        const Result got = execute(calls[i]);
        const bool same = got.message == want[i].message && got.bytes.size() == want[i].bytes.size() &&
                          std::memcmp(got.bytes.data(), want[i].bytes.data(), got.bytes.size()) == 0;
        if (!same && mismatches[static_cast<std::size_t>(t)]++ == 0) first[static_cast<std::size_t>(t)] = calls[i].name;
      }
    });
  for (std::thread& th : pool) th.join();
  for (int t = 0; t < kThreads; ++t)
    EXPECT_EQ(mismatches[static_cast<std::size_t>(t)], 0) << "thread " << t << ", first: " << first[static_cast<std::size_t>(t)];
  set_num_threads(0);
}

// The C ABI's last error is per thread: 8 threads fail at once with different arguments, wait for
// each other, and each reads back its own message.
TEST(ThreadsStress, CApiErrorsStayPerThread) {
  constexpr int kThreads = 8, kRounds = 50;
  std::barrier sync(kThreads);
  std::atomic<int> wrong{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        const std::string name = "no-such-encoding-" + std::to_string(t) + "-" + std::to_string(r);
        posenc_attention_params* p = posenc_attention_params_new(name.c_str());
        sync.arrive_and_wait();  // every thread has failed before any reads its message
        const std::string msg = posenc_last_error();
        if (p != nullptr || msg.rfind("encoding: ", 0) != 0 || msg.find("'" + name + "'") == std::string::npos) ++wrong;
        posenc_attention_params_free(p);
        sync.arrive_and_wait();
      }
    });
  for (std::thread& th : pool) th.join();
  EXPECT_EQ(wrong.load(), 0);
}

int os_threads() {
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key)
    if (key == "Threads:") {
      int n = 0;
      f >> n;
      return n;
    }
  return -1;
}

// Several callers in parallel calls at once: each caller gets its own OpenMP team of num_threads()
// (the count set process-wide applies to every caller), so the process holds at most
// callers × num_threads() threads besides its others; with ThreadScope(1) a caller starts none.
TEST(ThreadsStress, ConcurrentCallersEachGetTheirOwnTeam) {
  const std::vector<Call> calls = [] {
    std::mt19937_64 rng(5);
    std::vector<Call> c;
    for (Encoding e : {Encoding::kRope, Encoding::kAlibi}) c.push_back(attention_call(e, rng, false, true, false));
    return c;
  }();
  const int blas = openblas_get_num_threads();
  for (int per_caller : {1, 3}) {
    set_num_threads(per_caller);
    const int before = os_threads();
    constexpr int kCallers = 4;
    std::atomic<int> peak{0};
    std::atomic<bool> done{false};
    std::thread watch([&] {
      while (!done.load()) {
        peak.store(std::max(peak.load(), os_threads()));
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
    std::vector<std::thread> pool;
    for (int t = 0; t < kCallers; ++t)
      pool.emplace_back([&] {
        EXPECT_EQ(num_threads(), per_caller);
        for (int r = 0; r < 4; ++r) {
          for (const Call& c : calls) {
            EXPECT_EQ(execute(c).message, "");
          }
        }
      });
    for (std::thread& th : pool) th.join();
    done = true;
    watch.join();
    // callers + their teams' other threads + the watcher
    EXPECT_LE(peak.load(), before + kCallers * per_caller + 1) << "per caller " << per_caller;
    if (per_caller > 1) {
      EXPECT_GT(peak.load(), before + kCallers + 1);  // the teams did run
    }
    std::printf("per caller %d, %d callers: %d threads before, at most %d during\n", per_caller, kCallers, before,
                peak.load());
  }
  // the fused attention sets OpenBLAS to one thread while any call runs, and puts the caller's
  // setting back when the last one ends, however the calls overlapped
  EXPECT_EQ(openblas_get_num_threads(), blas);
  set_num_threads(0);
}

// The thread count and the results: the forward outputs and the elementwise kernels do not depend
// on it; a backward's parameter and key gradients may (partial sums per thread, added in thread
// order), and are the same for the same count.
TEST(ThreadsStress, ResultsAndTheThreadCount) {
  std::vector<Call> calls = make_calls(120);
  std::mt19937_64 rng(9);
  for (const EncodingInfo& e : registry())  // every encoding large enough for several threads
    if (e.kind != Kind::kAbsolute)
      for (bool backward : {false, true}) calls.push_back(attention_call(e.id, rng, backward, true, false));
  int differ = 0;
  std::string names;
  for (const Call& c : calls) {
    set_num_threads(1);
    const Result one = execute(c);
    set_num_threads(3);
    const Result three = execute(c);
    const Result again = execute(c);
    EXPECT_EQ(three.bytes, again.bytes) << c.name;  // the same count: the same bits
    EXPECT_EQ(one.message, three.message) << c.name;
    if (one.bytes != three.bytes) {
      ++differ;
      names += c.name + "; ";
      EXPECT_NE(c.name.find("backward"), std::string::npos) << c.name << " depends on the thread count";
    }
  }
  set_num_threads(0);
  std::printf("calls whose bits depend on the thread count (1 vs 3): %d of %zu: %s\n", differ, calls.size(),
              names.c_str());
}

}  // namespace
}  // namespace posenc

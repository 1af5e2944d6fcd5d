// The study's model (posenc/model.h): the whole gradient of Model<double> against central differences
// for every encoding of the catalogue the model takes, on one thread and on two uneven batch shards;
// Model<float> against Model<double> on the same parameters; the sharded passes against the one-thread
// pass (loss, probabilities, gradient normalised by the whole batch's count); training lowers the loss;
// a run with T threads is bit-reproducible for T = 1, 2, 3; the shard pool; and the model's refusals.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "study/shard_pool.h"
#include "study/model.h"
#include "posenc/registry.h"
#include "posenc/threads.h"
#include "testing.h"

namespace posenc {
namespace {

using ::posenc::testing::GradCheck;
using I = std::int64_t;

ModelConfig tiny(Encoding e) {
  ModelConfig c;
  c.encoding = e;
  c.vocab = 11;
  c.d_model = 8;
  c.n_layers = 2;
  c.n_heads = 2;
  c.d_ff = 12;
  c.max_len = 8;
  c.cope_npos = 4;
  c.t5.num_buckets = 6;
  c.t5.max_distance = 8;
  c.fire_width = 3;
  c.sandwich.sinusoid_dim = 8;
  return c;
}

struct Batch {
  std::vector<std::int32_t> tokens, targets;
};
Batch batch(I B, I L, I V, std::uint64_t seed) {
  Batch b;
  std::mt19937_64 r(seed);
  for (I i = 0; i < B * L; ++i) {
    b.tokens.push_back(std::int32_t(r() % std::uint64_t(V)));
    b.targets.push_back(i % 5 == 3 ? -1 : std::int32_t(r() % std::uint64_t(V)));  // some not counted
  }
  return b;
}

std::vector<Encoding> all_encodings() {
  std::vector<Encoding> e;
  for (const EncodingInfo& info : registry()) e.push_back(info.id);
  return e;
}

// Bounded tensors (ParamInfo::lo, hi) stay in their range through an optimiser step that pushes them
// out: KERPLE's r1, r2 ≥ 10⁻² (power: r2 ≤ 2), FIRE's c > 0 and L ≥ 1; an unbounded tensor moves freely.
TEST(Model, OptimiserKeepsBoundedParametersInRange) {
  for (KerpleKernel k : {KerpleKernel::kLog, KerpleKernel::kPower})
    for (Encoding e : {Encoding::kKerple, Encoding::kFire}) {
      ModelConfig c = tiny(e);
      c.kerple.kernel = k;
      ASSERT_TRUE(validate_config(c).ok());
      Model<float> m(c, 3);
      AdamWConfig oc;
      oc.lr = 10;  // a step far larger than any range
      oc.warmup = 0;
      oc.clip = 0;
      AdamW opt(oc, m.layout(), m.params().size());
      std::vector<float> w = m.params(), g(w.size(), 0.f);
      int bounded = 0;
      for (const ParamInfo& p : m.layout()) {
        const bool up = p.name.find("r2") != std::string::npos;  // r2 pushed up, the rest down
        for (std::size_t i = 0; i < p.size; ++i) g[p.offset + i] = up ? -1.f : 1.f;
        bounded += p.lo > -HUGE_VAL || p.hi < HUGE_VAL;
      }
      EXPECT_EQ(bounded, 2 * c.n_layers);  // kerple r1, r2 / fire c, L per layer
      opt.step(w, g);
      for (const ParamInfo& p : m.layout())
        for (std::size_t i = 0; i < p.size; ++i) {
          const float v = w[p.offset + i];
          if (p.lo > -HUGE_VAL) {
            EXPECT_GE(v, float(p.lo)) << p.name;
          }
          if (p.hi < HUGE_VAL) {
            EXPECT_LE(v, float(p.hi)) << p.name;
          }
          if (p.name.find("kerple_r1") != std::string::npos || p.name.find("fire_c") != std::string::npos) {
            EXPECT_EQ(v, float(p.lo)) << p.name << " was pushed below its floor";
          }
          if (k == KerpleKernel::kPower && p.name.find("kerple_r2") != std::string::npos) {
            EXPECT_EQ(v, 2.f) << p.name << " was pushed above 2";
          }
          if (p.name == "tok_emb") {
            EXPECT_LT(v, m.params()[p.offset + i] - 1.f) << "unbounded tensors move";
          }
        }
    }
}

class ModelGrad : public ::testing::TestWithParam<Encoding> {};

// Restores the process-wide thread count on scope exit.
struct ThreadCount {
  int prev = num_threads();
  explicit ThreadCount(int n) { set_num_threads(n); }
  ~ThreadCount() { set_num_threads(prev); }
};

// On one thread, and on two threads with an uneven split of the batch (shards of 1 and 2 sequences).
void check_whole_gradient(const ModelConfig& c) {
  for (int threads : {1, 2}) {
    const ThreadCount tc(threads);
    ASSERT_TRUE(validate_config(c).ok());
    Model<double> m(c, 7);
    // Perturb every parameter so that zero-initialised ones (biases, xl u/v) carry gradient paths.
    const std::vector<double> noise = testing::randn(m.params().size(), 3, 0.05);
    for (std::size_t i = 0; i < noise.size(); ++i) m.params()[i] += noise[i];
    for (const ParamInfo& p : m.layout())  // bounded tensors stay inside their range (and off its edge)
      for (std::size_t i = 0; i < p.size; ++i)
        m.params()[p.offset + i] = std::min(p.hi - 0.05, std::max(p.lo + 0.05, m.params()[p.offset + i]));
    const I B = 3, L = 6;
    const Batch b = batch(B, L, c.vocab, 11);
    auto loss = [&](const std::vector<double>& w) {
      m.params() = w;
      auto r = m.forward(b.tokens.data(), b.targets.data(), B, L);
      EXPECT_TRUE(r.ok());
      return r.value().nll / double(r.value().count);
    };
    const std::vector<double> w0 = m.params();
    loss(w0);
    ASSERT_TRUE(m.backward().ok());
    const std::vector<double> grad = m.grads();
    // every parameter tensor is reached by the gradient
    for (const ParamInfo& p : m.layout()) {
      double s = 0;
      for (std::size_t i = 0; i < p.size; ++i) s += std::fabs(grad[p.offset + i]);
      EXPECT_GT(s, 0.0) << p.name;
    }
    EXPECT_TRUE(GradCheck(loss, w0, grad, 1e-6, 1e-7, 1e-5, 5000)) << threads << " threads";
  }
}

TEST_P(ModelGrad, WholeGradientMatchesFiniteDifferences) { check_whole_gradient(tiny(GetParam())); }

// The non-default variants that bring learned tensors of their own: rope2d mixed's frequencies,
// KERPLE's power kernel.
TEST(Model, LearnedVariantsGradientMatchesFiniteDifferences) {
  ModelConfig mixed = tiny(Encoding::kRope2d);
  mixed.rope2d.variant = Rope2dVariant::kMixed;
  check_whole_gradient(mixed);
  ModelConfig power = tiny(Encoding::kKerple);
  power.kerple.kernel = KerpleKernel::kPower;
  check_whole_gradient(power);
}

INSTANTIATE_TEST_SUITE_P(Model, ModelGrad, ::testing::ValuesIn(all_encodings()),
                         [](const ::testing::TestParamInfo<Encoding>& i) {
                           return encoding_info(i.param).name;
                         });

TEST(Model, FloatAgreesWithDouble) {
  for (Encoding e : all_encodings()) {
    ModelConfig c = tiny(e);
    c.d_model = 32;
    c.n_heads = 4;
    c.d_ff = 64;
    c.max_len = 64;
    Model<double> md(c, 5);
    Model<float> mf(c, 5);
    const Batch b = batch(3, 40, c.vocab, 2);
    auto rd = md.forward(b.tokens.data(), b.targets.data(), 3, 40);
    auto rf = mf.forward(b.tokens.data(), b.targets.data(), 3, 40);
    ASSERT_TRUE(rd.ok() && rf.ok());
    EXPECT_NEAR(rf.value().nll, rd.value().nll, 1e-5 * rd.value().nll) << encoding_info(e).name;
    ASSERT_TRUE(md.backward().ok() && mf.backward().ok());
    std::vector<double> gf(mf.grads().begin(), mf.grads().end());
    double mx = 0;
    for (double x : md.grads()) mx = std::max(mx, std::fabs(x));
    EXPECT_TRUE(testing::AllClose(gf, md.grads(), 1e-4 * mx, 1e-3)) << encoding_info(e).name;
  }
}

// A few hundred AdamW steps on a learnable pattern (each token is the previous one plus one, mod V)
// take the loss far below log V.
TEST(Model, TrainingLowersTheLoss) {
  ModelConfig c = tiny(Encoding::kRope);
  c.d_model = 16;
  c.n_heads = 2;
  c.d_ff = 32;
  Model<float> m(c, 1);
  AdamWConfig oc;
  oc.lr = 1e-2;
  oc.warmup = 10;
  oc.total = 150;
  AdamW opt(oc, m.layout(), m.params().size());
  const I B = 8, L = 8;
  std::mt19937_64 r(4);
  double first = 0, last = 0;
  for (I step = 0; step < oc.total; ++step) {
    std::vector<std::int32_t> tok(B * L), tgt(B * L);
    for (I b = 0; b < B; ++b) {
      const std::int32_t s = std::int32_t(r() % 11);
      for (I i = 0; i < L; ++i) {
        tok[b * L + i] = (s + i) % 11;
        tgt[b * L + i] = (s + i + 1) % 11;
      }
    }
    auto res = m.forward(tok.data(), tgt.data(), B, L);
    ASSERT_TRUE(res.ok());
    const double loss = res.value().nll / double(res.value().count);
    if (step == 0) first = loss;
    last = loss;
    ASSERT_TRUE(m.backward().ok());
    opt.step(m.params(), m.grads());
  }
  EXPECT_GT(first, std::log(11.0) - 0.3);  // no better than chance at the start
  EXPECT_LT(last, 0.2);
}

// The batch split over 2 and 3 threads (uneven shards) gives the one-thread pass up to float
// rounding: the loss, the probabilities (an evaluation pass is sharded too) and the gradient, which is
// normalised by the count of the whole batch. The batch counts its targets unevenly: the first
// sequences (shard 0) count one target each, the last ones all of theirs, so a per-shard mean would
// weight them differently and fail here.
TEST(Model, ShardedPassesGiveTheOneThreadResult) {
  for (Encoding e : all_encodings()) {
    ModelConfig c = tiny(e);
    c.d_model = 16;
    c.d_ff = 32;
    c.max_len = 24;
    const I B = 5, L = 24;
    Batch b = batch(B, L, c.vocab, 21);
    for (I i = 0; i < 2 * L; ++i)
      if (i % L != 5) b.targets[std::size_t(i)] = -1;
    for (I i = 2 * L; i < B * L; ++i)
      if (b.targets[std::size_t(i)] < 0) b.targets[std::size_t(i)] = 1;
    auto pass = [&](int threads, LossSum* loss, std::vector<float>* probs, std::vector<float>* grads) {
      const ThreadCount tc(threads);
      Model<float> m(c, 4);
      auto r = m.forward(b.tokens.data(), b.targets.data(), B, L);
      ASSERT_TRUE(r.ok()) << r.status().message();
      *loss = r.value();
      *probs = m.probs();
      ASSERT_TRUE(m.backward().ok());
      *grads = m.grads();
    };
    LossSum l1, lt;
    std::vector<float> p1, g1, pt, gt;
    pass(1, &l1, &p1, &g1);
    for (int threads : {2, 3}) {
      pass(threads, &lt, &pt, &gt);
      const std::string what = std::string(encoding_info(e).name) + ", " + std::to_string(threads) + " threads";
      EXPECT_EQ(lt.count, l1.count) << what;
      EXPECT_NEAR(lt.nll, l1.nll, 1e-6 * l1.nll) << what;
      EXPECT_TRUE(testing::AllClose(std::vector<double>(pt.begin(), pt.end()),
                                    std::vector<double>(p1.begin(), p1.end()), 1e-7, 1e-5))
          << what;
      double mx = 0;
      for (float x : g1) mx = std::max(mx, double(std::fabs(x)));
      EXPECT_TRUE(testing::AllClose(std::vector<double>(gt.begin(), gt.end()),
                                    std::vector<double>(g1.begin(), g1.end()), 1e-5 * mx, 1e-4))
          << what;
    }
  }
}

// forward_backward (micro-batches of about Model::kMicroRows rows, each one's backward right after
// its forward) against forward() then backward(), for every encoding, on 1, 2 and 3 threads: the same
// loss and gradient up to float rounding (a small micro-batch's attention may run the reference,
// exact in double, where the whole shard's ran the fused kernel), the position encodings' own
// parameters included (their kernels write their gradients, so every micro-batch after a shard's
// first sums them through a scratch). 40 sequences of 32: five micro-batches of 8 on one thread,
// three (8, 8, 4) per shard on two. The probabilities are consumed, as by backward().
TEST(Model, ForwardBackwardGivesForwardThenBackward) {
  for (Encoding e : all_encodings()) {
    ModelConfig c = tiny(e);
    c.max_len = 32;
    const I B = 40, L = 32;
    ASSERT_GT(B * L, 4 * Model<float>::kMicroRows);
    const Batch b = batch(B, L, c.vocab, 31);
    for (int threads : {1, 2, 3}) {
      const ThreadCount tc(threads);
      const std::string what = std::string(encoding_info(e).name) + ", " + std::to_string(threads) + " threads";
      Model<float> one(c, 6), two(c, 6);
      auto r1 = one.forward(b.tokens.data(), b.targets.data(), B, L);
      ASSERT_TRUE(r1.ok()) << r1.status().message();
      ASSERT_TRUE(one.backward().ok());
      auto r2 = two.forward_backward(b.tokens.data(), b.targets.data(), B, L);
      ASSERT_TRUE(r2.ok()) << r2.status().message();
      EXPECT_NEAR(r2->nll, r1->nll, 1e-6 * r1->nll) << what;
      EXPECT_EQ(r2->count, r1->count) << what;
      const std::vector<float>&g1 = one.grads(), &g2 = two.grads();
      double mx = 0;
      for (float x : g1) mx = std::max(mx, double(std::fabs(x)));
      for (const ParamInfo& p : one.layout()) {
        const std::vector<double> a(g1.begin() + long(p.offset), g1.begin() + long(p.offset + p.size)),
            z(g2.begin() + long(p.offset), g2.begin() + long(p.offset + p.size));
        EXPECT_TRUE(testing::AllClose(z, a, 1e-6 * mx, 1e-4)) << what << ", " << p.name;
      }
      EXPECT_FALSE(two.backward().ok()) << what << ": the pass was consumed";
    }
  }
}

// Five AdamW steps twice from the same seed give the same losses and parameters, bit for bit, for
// each thread count (the shards' gradients are summed in a fixed order), through forward() then
// backward() and through training's forward_backward (24 sequences of 16: micro-batches of 16 and 8).
TEST(Model, RunIsBitReproducibleForEachThreadCount) {
  for (int threads : {1, 2, 3})
    for (bool fused : {false, true}) {
      const ThreadCount tc(threads);
      auto run = [fused](std::vector<float>* params) {
        ModelConfig c = tiny(Encoding::kAlibi);
        c.d_model = 16;
        c.d_ff = 32;
        Model<float> m(c, 9);
        AdamWConfig oc;
        oc.total = 5;
        AdamW opt(oc, m.layout(), m.params().size());
        std::vector<double> losses;
        for (int s = 0; s < 5; ++s) {
          const Batch b = batch(24, 16, c.vocab, std::uint64_t(s));
          if (fused) {
            losses.push_back(m.forward_backward(b.tokens.data(), b.targets.data(), 24, 16).value().nll);
          } else {
            losses.push_back(m.forward(b.tokens.data(), b.targets.data(), 24, 16).value().nll);
            EXPECT_TRUE(m.backward().ok());
          }
          opt.step(m.params(), m.grads());
        }
        *params = m.params();
        return losses;
      };
      std::vector<float> pa, pb;
      const std::vector<double> a = run(&pa), b = run(&pb);
      const std::string what = std::to_string(threads) + (fused ? " threads, forward_backward" : " threads");
      EXPECT_EQ(a, b) << what;
      EXPECT_EQ(pa, pb) << what;
    }
}

// Each shard index runs exactly once per job, shard 0 on the caller and the others on distinct
// threads, over jobs that grow and shrink the number of shards.
TEST(Model, ShardPoolRunsEachShardOnceOnItsOwnThread) {
  model_fast::ShardPool& pool = model_fast::ShardPool::instance();
  for (int rep = 0; rep < 50; ++rep) {
    const int n = 1 + rep % 4;
    std::mutex mu;
    std::vector<int> runs(std::size_t(n), 0);
    std::set<std::thread::id> ids;
    std::thread::id first;
    pool.run(n, [&](int s) {
      const std::lock_guard<std::mutex> lk(mu);
      ++runs[std::size_t(s)];
      ids.insert(std::this_thread::get_id());
      if (s == 0) first = std::this_thread::get_id();
    });
    EXPECT_EQ(runs, std::vector<int>(std::size_t(n), 1)) << "n " << n;
    EXPECT_EQ(int(ids.size()), n) << "n " << n;
    EXPECT_EQ(first, std::this_thread::get_id());
  }
  // A fork() child has none of the parent's workers: its own pool runs the job (a child stuck
  // waiting for workers that do not exist there is killed by the alarm).
  std::fflush(nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(20);
    std::atomic<int> ran{0};
    model_fast::ShardPool::instance().run(3, [&](int) { ran.fetch_add(1); });
    _exit(ran.load() == 3 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

TEST(Model, Refusals) {
  ModelConfig c = tiny(Encoding::kLearned);
  Model<float> m(c, 1);
  const Batch b = batch(1, 9, c.vocab, 1);
  auto r = m.forward(b.tokens.data(), b.targets.data(), 1, 9);  // past the table of 8
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("length"), std::string::npos);
  std::vector<std::int32_t> bad = {3, 11}, tgt = {1, 2};
  r = m.forward(bad.data(), tgt.data(), 1, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tokens"), std::string::npos);
  Model<float> fresh(c, 1);
  EXPECT_FALSE(fresh.backward().ok());  // no forward yet
  ModelConfig odd = tiny(Encoding::kRope);
  odd.n_heads = 3;
  EXPECT_FALSE(validate_config(odd).ok());
}

// The memory a step needs, counted independently from what the model sizes (model.cc's prepare and
// prepare_backward), and the refusal that names the batch.
TEST(Model, TrainingBytes) {
  ModelConfig c = tiny(Encoding::kRope);
  const double C = double(c.d_model), F = double(c.d_ff), V = double(c.vocab), H = double(c.n_heads);
  const double floats = double(c.n_layers) * (5 * C + 4 + 3 * C + 2 * H + 2 * F)  // acts (lse: H doubles)
                        + 2 * C + 2 + V + 2 + 2                                   // xf, lnf, stats, probs, nll, ids
                        + 2 * C + F + 3 * C + C;                                 // dy, dx, dh, dqkv, datt
  EXPECT_DOUBLE_EQ(training_bytes(c, 3, 5), 4 * floats * 15);
  EXPECT_TRUE(training_fits(c, 16, 64).ok());
  const Status s = training_fits(c, std::int64_t{1} << 40, std::int64_t{1} << 20);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.arg(), "batch");
  EXPECT_NE(s.what().find("GB"), std::string::npos) << s.what();
  // weights that cannot fit are the model's fault, whatever the batch: 2^20 × 2^20 × 16 B per layer
  ModelConfig wide = c;
  wide.d_model = std::int64_t{1} << 20;
  wide.n_heads = 1;
  const Status w = training_fits(wide, 1, 1);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.arg(), "d_model") << w.what();
  ModelConfig deep_ff = c;
  deep_ff.d_ff = std::int64_t{1} << 40;
  const Status f = training_fits(deep_ff, 1, 1);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.arg(), "d_ff") << f.what();
}

TEST(Model, CheckpointRoundTrip) {
  for (Encoding e : all_encodings()) {
    const ModelConfig c = tiny(e);
    Model<float> m(c, 3);
    const std::string path = ::testing::TempDir() + "/posenc_ckpt_" + encoding_info(e).name + ".safetensors";
    ASSERT_TRUE(save_checkpoint(path, c, m.params()).ok());
    Expected<Checkpoint> ck = load_checkpoint(path);
    ASSERT_TRUE(ck.ok()) << ck.status().message();
    EXPECT_EQ(ck.value().params, m.params());
    EXPECT_EQ(ck.value().config.encoding, e);
    EXPECT_EQ(param_layout(ck.value().config).size(), m.layout().size());
    // The file is safetensors: header length, JSON, then the first tensor (tok_emb) byte for byte.
    std::ifstream f(path, std::ios::binary);
    std::uint64_t n = 0;
    f.read(reinterpret_cast<char*>(&n), 8);
    std::string header(n, ' ');
    f.read(header.data(), std::streamsize(n));
    EXPECT_NE(header.find("\"tok_emb\":{\"data_offsets\":[0,"), std::string::npos) << header.substr(0, 200);
    float first = 0;
    f.read(reinterpret_cast<char*>(&first), 4);
    EXPECT_EQ(first, m.params()[0]);
    // checkpoint_bytes is the file's content (what the CLI writes with its other outputs)
    std::ifstream whole(path, std::ios::binary);
    const std::string file((std::istreambuf_iterator<char>(whole)), {});
    Expected<std::string> bytes = checkpoint_bytes(c, m.params());
    ASSERT_TRUE(bytes.ok());
    EXPECT_EQ(bytes.value(), file);
    std::remove(path.c_str());
  }
  EXPECT_FALSE(load_checkpoint("/nonexistent/ckpt.safetensors").ok());
}

// A checkpoint whose header lies is refused with a Status (the regression inputs of
// tests/fuzz/corpus/checkpoint/regress-*): each edit below is applied to a real checkpoint's header.
TEST(Model, CheckpointWithABadHeaderIsRefused) {
  const ModelConfig c = tiny(Encoding::kRope);
  Model<float> m(c, 3);
  const std::string good = checkpoint_bytes(c, m.params()).value();
  std::uint64_t n = 0;
  std::memcpy(&n, good.data(), 8);
  const std::string header = good.substr(8, n), data = good.substr(8 + n);
  auto with = [&](const std::string& from, const std::string& to) {
    std::string h = header;
    const std::size_t at = h.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) h.replace(at, from.size(), to);
    std::string out(8, '\0');
    const std::uint64_t len = h.size();
    std::memcpy(out.data(), &len, 8);
    return out + h + data;
  };
  ASSERT_TRUE(checkpoint_from_bytes(good, "good").ok());
  const std::string lnf_b = "\"lnf.b\":{\"data_offsets\":[";
  const std::size_t at = header.find(lnf_b) + lnf_b.size();
  const std::string offsets = header.substr(at, header.find(']', at) - at);  // "b,e"
  const std::uint64_t b = std::stoull(offsets), e = std::stoull(offsets.substr(offsets.find(',') + 1));
  const std::string wrapped =  // begin past the data, end − begin the size modulo 2^64
      std::to_string(std::uint64_t(0) - 8) + "," + std::to_string(e - b - 8);
  for (const std::string& bad :
       {with(lnf_b + offsets, lnf_b + wrapped), with("\"posenc.config\":\"", "\"posenc.config\":5,\"x\":\""),
        with("\\\"vocab\\\":" + std::to_string(c.vocab), "\\\"vocab\\\":1099511627776"),
        with("\\\"vocab\\\":" + std::to_string(c.vocab), "\\\"vocab\\\":4.4e40"),  // no int64 holds it
        with("\\\"vocab\\\":" + std::to_string(c.vocab), "\\\"vocab\\\":9223372036854775808"),
        with("\"lnf.g\":{", "\"lnf.g\":[1,2],\"unused\":{"), with(lnf_b, "\"lnf.b\":{\"x\":[")}) {
    const Expected<Checkpoint> ck = checkpoint_from_bytes(bad, "bad");
    EXPECT_FALSE(ck.ok()) << bad.substr(8, 300);
  }
}

}  // namespace
}  // namespace posenc

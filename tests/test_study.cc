// The study's data (posenc/study.h): the corpus split, the training windows, and every synthetic task's
// examples checked against the task's rule, recomputed here from the example itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "study/study.h"

namespace posenc {
namespace {

using I = std::int64_t;

TEST(Corpus, FoldsWhitespaceAndHoldsOutTheLastTenth) {
  std::string text;
  for (int i = 0; i < 300; ++i) text += "word" + std::to_string(i) + " \n\t  ";
  const Corpus c = corpus_from_text("t", text);
  std::string all;
  for (auto b : c.train) all.push_back(char(b));
  for (auto b : c.held) all.push_back(char(b));
  EXPECT_EQ(all.find("  "), std::string::npos);
  EXPECT_EQ(all.find('\n'), std::string::npos);
  EXPECT_EQ(all.substr(0, 12), "word0 word1 ");
  EXPECT_EQ(c.held.size(), all.size() / 10);
}

TEST(Corpus, WindowsAreContiguousAndTargetsOneOn) {
  std::string text;
  for (int i = 0; i < 5000; ++i) text.push_back(char('a' + i % 26));
  const Corpus c = corpus_from_text("t", text);
  Batcher b(c, 10, 3, 1);
  std::vector<std::int32_t> tok(30), tgt(30);
  b.next(tok.data(), tgt.data());
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 10; ++i) {
      EXPECT_EQ(tgt[r * 10 + i], 'a' + (tok[r * 10 + i] - 'a' + 1) % 26);
      if (i) {
        EXPECT_EQ(tok[r * 10 + i], tgt[r * 10 + i - 1]);
      }
    }
}

// The full string s (len + 1 bytes) of an example.
std::string full(const std::vector<std::int32_t>& tok, const std::vector<std::int32_t>& tgt,
                 std::int32_t last) {
  std::string s;
  for (auto t : tok) s.push_back(char(t));
  s.push_back(char(last));
  return s;
}

class Tasks : public ::testing::TestWithParam<Task> {};

TEST_P(Tasks, ExamplesFollowTheRule) {
  std::mt19937_64 rng(3);
  for (I len : {16, 64, 255, 1024}) {
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<std::int32_t> tok(static_cast<std::size_t>(len)), tgt(static_cast<std::size_t>(len));
      ASSERT_TRUE(make_example(GetParam(), len, rng, tok.data(), tgt.data()).ok());
      // scored targets are the next byte
      I scored = 0;
      for (I i = 0; i + 1 < len; ++i)
        if (tgt[std::size_t(i)] >= 0) {
          EXPECT_EQ(tgt[std::size_t(i)], tok[std::size_t(i + 1)]);
          ++scored;
        }
      const std::int32_t last = tgt.back() >= 0 ? tgt.back() : -1;
      if (last >= 0) ++scored;
      EXPECT_GT(scored, 0) << "len " << len;
      const std::string s = full(tok, tgt, last >= 0 ? last : ' ');
      // each scored byte, recomputed from the bytes before it
      for (I i = 1; i <= len; ++i) {
        if (tgt[std::size_t(i - 1)] < 0) continue;
        const std::string before = s.substr(0, std::size_t(i));
        char want = 0;
        switch (GetParam()) {
          case Task::kCopy: {
            const std::size_t bar = before.find('|');
            want = before[i - I(bar) - 1];
            break;
          }
          case Task::kFlipFlop: {  // the last written bit
            for (I j = i - 3; j >= 0; j -= 2)
              if (before[std::size_t(j)] == 'w') {
                want = before[std::size_t(j + 1)];
                break;
              }
            EXPECT_EQ(before.back(), 'r');
            break;
          }
          case Task::kCounting: {  // a's since the previous query, mod 10
            EXPECT_EQ(before.back(), '?');
            const std::size_t prev = before.find_last_of('?', before.size() - 2);
            const std::size_t from = prev == std::string::npos ? 0 : prev + 2;
            int n = 0;
            for (std::size_t j = from; j + 1 < before.size(); ++j) n += before[j] == 'a';
            want = char('0' + n % 10);
            break;
          }
          case Task::kSelectiveCopy: {  // the k-th data letter
            const std::size_t bar = before.find('|');
            std::string data;
            for (std::size_t j = 0; j < bar; ++j)
              if (before[j] != '.') data.push_back(before[j]);
            want = data[std::size_t(i) - bar - 1];
            break;
          }
          case Task::kPasskey: {
            const std::size_t k = before.find("K="), q = before.rfind("K?");
            ASSERT_NE(k, std::string::npos);
            want = before[k + 2 + (std::size_t(i) - q - 2)];
            break;
          }
        }
        EXPECT_EQ(s[std::size_t(i)], want) << task_name(GetParam()) << " len " << len << " at " << i << ": " << s;
      }
    }
  }
  std::vector<std::int32_t> tok(8), tgt(8);
  EXPECT_FALSE(make_example(GetParam(), 8, rng, tok.data(), tgt.data()).ok());
}

INSTANTIATE_TEST_SUITE_P(Study, Tasks,
                         ::testing::Values(Task::kCopy, Task::kFlipFlop, Task::kCounting, Task::kSelectiveCopy,
                                           Task::kPasskey),
                         [](const ::testing::TestParamInfo<Task>& i) {
                           std::string n = task_name(i.param);
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

// Passkey at a depth: the needle "K=<key> " starts after round(depth · F) filler bytes, F = the bytes
// that are neither the needle (8) nor the question (7); the filler around it is the same text, and
// the key asked for is the key given.
TEST(Tasks, PasskeyPutsTheKeyAtTheRequestedDepth) {
  const std::string grass = "The grass is green. The sky is blue. ";
  for (I len : {16, 64, 255, 1024})
    for (double d : {0.0, 0.1, 0.25, 0.5, 0.75, 1.0}) {
      std::mt19937_64 rng(11);
      std::vector<std::int32_t> tok(static_cast<std::size_t>(len)), tgt(static_cast<std::size_t>(len));
      ASSERT_TRUE(make_example(Task::kPasskey, len, rng, tok.data(), tgt.data(), d).ok());
      const std::string s = full(tok, tgt, tgt.back());
      const std::size_t F = std::size_t(len + 1 - 15), at = s.find("K=");
      EXPECT_EQ(double(at), std::floor(d * double(F) + 0.5)) << "len " << len << " depth " << d << ": " << s;
      std::string filler = s.substr(0, at) + s.substr(at + 8, s.size() - 7 - at - 8);
      ASSERT_EQ(filler.size(), F);
      for (std::size_t i = 0; i < F; ++i) EXPECT_EQ(filler[i], grass[i % grass.size()]) << i;
      EXPECT_EQ(s.substr(s.size() - 7, 2), "K?");
      EXPECT_EQ(s.substr(at + 2, 5), s.substr(s.size() - 5));
      EXPECT_EQ(s[at + 7], ' ');
    }
  // the same rng state gives the same key at every depth
  std::mt19937_64 a(5), b(5);
  std::vector<std::int32_t> ta(64), ga(64), tb(64), gb(64);
  ASSERT_TRUE(make_example(Task::kPasskey, 64, a, ta.data(), ga.data(), 0.0).ok());
  ASSERT_TRUE(make_example(Task::kPasskey, 64, b, tb.data(), gb.data(), 1.0).ok());
  EXPECT_EQ(std::vector<std::int32_t>(ta.end() - 5, ta.end()), std::vector<std::int32_t>(tb.end() - 5, tb.end()));
  EXPECT_NE(ta, tb);
  std::vector<std::int32_t> tok(64), tgt(64);
  EXPECT_EQ(make_example(Task::kCopy, 64, a, tok.data(), tgt.data(), 0.5).arg(), "depth");
  EXPECT_EQ(make_example(Task::kPasskey, 64, a, tok.data(), tgt.data(), 1.5).arg(), "depth");
  EXPECT_EQ(make_example(Task::kPasskey, 64, a, tok.data(), tgt.data(), -0.1).arg(), "depth");
}

// Passkey's evaluation by depth on a tiny model: after the random placement, one point per depth,
// each the accuracy recomputed here one example at a time from the examples of seed·φ + 4.
TEST(Tasks, PasskeyEvaluatesEveryDepth) {
  StudyConfig cfg;
  cfg.task = Task::kPasskey;
  cfg.train_len = 32;
  cfg.eval_examples = 6;
  cfg.model.d_model = 32;
  cfg.model.n_layers = 1;
  cfg.model.n_heads = 2;
  cfg.model.d_ff = 64;
  ModelConfig mc = cfg.model;
  mc.encoding = Encoding::kAlibi;
  mc.max_len = 64;
  Model<float> model(mc, 3);
  const Corpus none;
  std::mt19937_64 rng(9);
  const std::uint64_t seed = 7;
  const Expected<std::vector<EvalPoint>> pts = evaluate_at(cfg, none, model, 64, seed, rng);
  ASSERT_TRUE(pts.ok()) << pts.status().message();
  ASSERT_EQ(pts->size(), 1 + passkey_depths().size());
  EXPECT_FALSE((*pts)[0].depth.has_value());
  const std::vector<double> depths = {0.0, 0.25, 0.5, 0.75, 1.0};
  ASSERT_EQ(passkey_depths(), depths);
  for (std::size_t k = 0; k < depths.size(); ++k) {
    const EvalPoint& p = (*pts)[k + 1];
    EXPECT_EQ(p.len, 64);
    ASSERT_TRUE(p.depth.has_value());
    EXPECT_EQ(*p.depth, depths[k]);
    std::mt19937_64 er(seed * 0x9E3779B97F4A7C15ull + 4);
    I right = 0, total = 0;
    for (I b = 0; b < cfg.eval_examples; ++b) {
      std::vector<std::int32_t> tok(64), tgt(64);
      ASSERT_TRUE(make_example(Task::kPasskey, 64, er, tok.data(), tgt.data(), depths[k]).ok());
      ASSERT_TRUE(model.forward(tok.data(), tgt.data(), 1, 64).ok());
      for (I i = 0; i < 64; ++i) {
        if (tgt[std::size_t(i)] < 0) continue;
        const float* row = &model.probs()[std::size_t(i * mc.vocab)];
        right += std::max_element(row, row + mc.vocab) - row == tgt[std::size_t(i)];
        ++total;
      }
    }
    EXPECT_EQ(total, 5 * cfg.eval_examples);
    ASSERT_TRUE(p.acc.has_value());
    EXPECT_DOUBLE_EQ(*p.acc, double(right) / double(total)) << "depth " << depths[k];
  }
  // another task has one point per length, as has passkey where the model cannot run
  cfg.task = Task::kCopy;
  EXPECT_EQ(evaluate_at(cfg, none, model, 64, seed, rng)->size(), 1u);
  cfg.task = Task::kPasskey;
  const Expected<std::vector<EvalPoint>> off = evaluate_at(cfg, none, model, 64, seed, rng, false);
  ASSERT_EQ(off->size(), 6u);
  for (const EvalPoint& p : *off) EXPECT_FALSE(p.acc || p.ppl);
}

TEST(Tasks, Names) {
  for (const char* n : {"copy", "flipflop", "counting", "selective-copy", "passkey"})
    EXPECT_EQ(task_name(parse_task(n).value()), std::string(n));
  EXPECT_FALSE(parse_task("sorting").ok());
}

}  // namespace
}  // namespace posenc

// The study's data (posenc/study.h): the corpus split, the training windows, and every synthetic task's
// examples checked against the task's rule, recomputed here from the example itself.
#include <gtest/gtest.h>

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

TEST(Tasks, Names) {
  for (const char* n : {"copy", "flipflop", "counting", "selective-copy", "passkey"})
    EXPECT_EQ(task_name(parse_task(n).value()), std::string(n));
  EXPECT_FALSE(parse_task("sorting").ok());
}

}  // namespace
}  // namespace posenc

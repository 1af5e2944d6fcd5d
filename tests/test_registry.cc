#include <set>

#include "posenc/registry.h"
#include "testing.h"

namespace posenc {
namespace {

TEST(Registry, NamesAreUniqueAndFindable) {
  std::set<std::string> names;
  for (const EncodingInfo& e : registry()) {
    EXPECT_TRUE(names.insert(e.name).second) << e.name;
    auto f = find_encoding(e.name);
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(f->id, e.id);
    EXPECT_EQ(encoding_info(e.id).name, e.name);
    EXPECT_FALSE(e.summary.empty());
    EXPECT_FALSE(e.paper.empty());
  }
  for (const char* want : {"nope", "learned", "sinusoidal", "rope", "alibi", "t5", "xl", "cope", "kerple",
                           "sandwich", "fire"})
    EXPECT_TRUE(names.count(want)) << want;
}

// The extrapolating biases: logit biases whose learned tensors carry the `learned` flag (the CLI's
// --grad-* outputs come from it); Sandwich has none.
TEST(Registry, ExtrapolatingBiasesDeclareTheirLearnedTensors) {
  auto learned = [](const char* name) {
    std::set<std::string> r;
    const Expected<EncodingInfo> e = find_encoding(name);
    for (const ParamSpec& p : e->params)
      if (p.learned) r.insert(p.name);
    return r;
  };
  for (const char* name : {"kerple", "sandwich", "fire"}) EXPECT_EQ(find_encoding(name)->kind, Kind::kLogitBias);
  EXPECT_EQ(learned("kerple"), (std::set<std::string>{"r1", "r2"}));
  EXPECT_TRUE(learned("sandwich").empty());
  EXPECT_EQ(learned("fire"), (std::set<std::string>{"mlp-w1", "mlp-b1", "mlp-w2", "mlp-b2", "c", "threshold"}));
}

TEST(Registry, UnknownNameIsAnErrorNamingTheChoices) {
  auto f = find_encoding("ropee");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("ropee"), std::string::npos);
  EXPECT_NE(f.status().message().find("alibi"), std::string::npos);
}

}  // namespace
}  // namespace posenc

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
  for (const char* want : {"nope", "learned", "sinusoidal", "rope", "alibi", "t5", "xl", "cope"})
    EXPECT_TRUE(names.count(want)) << want;
}

TEST(Registry, UnknownNameIsAnErrorNamingTheChoices) {
  auto f = find_encoding("ropee");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("ropee"), std::string::npos);
  EXPECT_NE(f.status().message().find("alibi"), std::string::npos);
}

}  // namespace
}  // namespace posenc

#include "core/config.h"

#include <gtest/gtest.h>

namespace myriad {
namespace {

TEST(ConfigTest, ReadsValuesDefaultsAndOverrides) {
  auto doc = ConfigDoc::Parse("[model]\nd_model = 64\nname = \"x\"\n[train]\nlr = 0.5\n", "t.toml",
                              {"train.lr=3e-4", "train.steps=7"});
  ASSERT_TRUE(doc.ok()) << doc.status().message();
  EXPECT_EQ((*doc)->GetInt("model.d_model", 1), 64);
  EXPECT_EQ((*doc)->GetString("model.name", ""), "x");
  EXPECT_DOUBLE_EQ((*doc)->GetFloat("train.lr", 1), 3e-4);
  EXPECT_EQ((*doc)->GetInt("train.steps", 1), 7);
  EXPECT_EQ((*doc)->GetInt("train.missing", 42), 42);
  EXPECT_TRUE((*doc)->Finish().ok());
}

TEST(ConfigTest, UnknownKeyIsNamedWithAHint) {
  auto doc = ConfigDoc::Parse("[model]\nd_modle = 64\n", "t.toml");
  ASSERT_TRUE(doc.ok());
  (*doc)->GetInt("model.d_model", 1);
  Status s = (*doc)->Finish();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("unknown key model.d_modle"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("did you mean model.d_model"), std::string::npos) << s.message();
}

TEST(ConfigTest, WrongTypeAndSyntaxErrorsAreClear) {
  auto doc = ConfigDoc::Parse("[model]\nd_model = \"big\"\n", "t.toml");
  ASSERT_TRUE(doc.ok());
  (*doc)->GetInt("model.d_model", 1);
  Status s = (*doc)->Finish();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("model.d_model must be an integer"), std::string::npos);

  auto bad = ConfigDoc::Parse("[model\nd_model = 1\n", "broken.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("broken.toml:1"), std::string::npos) << bad.status().message();

  auto badset = ConfigDoc::Parse("", "t.toml", {"nokeyvalue"});
  ASSERT_FALSE(badset.ok());
  EXPECT_NE(badset.status().message().find("expected key=value"), std::string::npos);
}

}  // namespace
}  // namespace myriad

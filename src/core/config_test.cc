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

TEST(ConfigTest, IntegersOutsideTheirRangeAreRefusedNotTruncated) {
  auto doc = ConfigDoc::Parse("[p]\ndp = 4294967297\nok = 7\n", "t.toml", {"p.huge=99999999999999999999"});
  ASSERT_TRUE(doc.ok()) << doc.status().message();
  EXPECT_EQ((*doc)->GetInt("p.ok", 1, 0, 10), 7);
  EXPECT_EQ((*doc)->GetInt("p.dp", 1, 1, 65536), 1);  // the default, and the problem recorded
  Status s = (*doc)->Finish();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "t.toml: " + OutOfRange("p.dp", 4294967297, 1, 65536));
  EXPECT_NE(s.message().find("p.dp=4294967297 is out of range [1, 65536]"), std::string::npos) << s.message();

  // Digits beyond 64 bits (a --set value TOML cannot hold) say so.
  auto big = ConfigDoc::Parse("", "t.toml", {"p.huge=99999999999999999999"});
  ASSERT_TRUE(big.ok());
  (*big)->GetInt("p.huge", 1, 0, 10);
  EXPECT_NE((*big)->Finish().message().find("p.huge=99999999999999999999 does not fit in a 64-bit integer"),
            std::string::npos);
  // A quoted number is still "not an integer".
  auto quoted = ConfigDoc::Parse("[p]\nn = \"12\"\n", "t.toml");
  ASSERT_TRUE(quoted.ok());
  (*quoted)->GetInt("p.n", 1, 0, 100);
  EXPECT_NE((*quoted)->Finish().message().find("p.n must be an integer"), std::string::npos);
}

TEST(ConfigTest, NonFiniteFloatsAreRefused) {
  for (const char* v : {"inf", "-inf", "nan", "+inf"}) {
    auto doc = ConfigDoc::Parse("", "t.toml", {std::string("train.lr=") + v});
    ASSERT_TRUE(doc.ok());
    EXPECT_DOUBLE_EQ((*doc)->GetFloat("train.lr", 0.5), 0.5);
    const Status s = (*doc)->Finish();
    ASSERT_FALSE(s.ok()) << v;
    EXPECT_NE(s.message().find("must be a finite number"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("train.lr="), std::string::npos) << s.message();
  }
  auto file = ConfigDoc::Parse("[model]\ninit_std = nan\n", "t.toml");
  ASSERT_TRUE(file.ok());
  (*file)->GetFloat("model.init_std", 0.02);
  EXPECT_NE((*file)->Finish().message().find("model.init_std=nan must be a finite number"), std::string::npos);
}

}  // namespace
}  // namespace myriad

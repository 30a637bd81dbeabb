// The evaluation's figures against cases counted by hand.
#include "edge/redact_eval.h"

#include <gtest/gtest.h>

namespace myriad::edge {
namespace {

Span S(int64_t a, int64_t b, EntityType t, float conf = 1.0f) { return Span{a, b, t, conf}; }

TEST(RedactEval, IoUAndFBeta) {
  EXPECT_DOUBLE_EQ(SpanIoU(S(0, 4, EntityType::kPerson), S(2, 6, EntityType::kPerson)), 2.0 / 6.0);
  EXPECT_DOUBLE_EQ(SpanIoU(S(0, 4, EntityType::kPerson), S(4, 6, EntityType::kPerson)), 0.0);
  EXPECT_DOUBLE_EQ(FBeta(0.5, 1.0, 1), 2 * 0.5 / 1.5);
  EXPECT_DOUBLE_EQ(FBeta(0.5, 1.0, 2), 5 * 0.5 / (4 * 0.5 + 1));
  EXPECT_DOUBLE_EQ(FBeta(0, 0, 1), 0.0);
}

TEST(RedactEval, GoldDetectorScoresOne) {
  const auto docs = GenerateCorpus(5, Split::kHeldOut, 30);
  std::map<std::string, std::vector<Span>> gold;
  for (const auto& d : docs) gold[d.text] = d.spans;
  EvalReport r = EvaluateDetector(docs, [&](std::string_view t) { return gold.at(std::string(t)); });
  ASSERT_GT(r.micro.gold, 100);
  EXPECT_EQ(r.per_type.size(), static_cast<size_t>(kNumEntityTypes));
  for (const auto& [type, f] : r.per_type) {
    EXPECT_DOUBLE_EQ(f.precision, 1.0) << EntityTypeName(type);
    EXPECT_DOUBLE_EQ(f.recall, 1.0) << EntityTypeName(type);
    EXPECT_DOUBLE_EQ(f.f1_exact, 1.0) << EntityTypeName(type);
  }
  EXPECT_DOUBLE_EQ(r.micro.f2, 1.0);
  EXPECT_GT(r.decoys, 0);
  EXPECT_EQ(r.decoys_hit, 0);
  EXPECT_EQ(r.over_redacted_chars, 0);
  // Nothing found: recall 0, no decoy hit.
  EvalReport none = EvaluateDetector(docs, [](std::string_view) { return std::vector<Span>{}; });
  EXPECT_EQ(none.micro.tp, 0);
  EXPECT_DOUBLE_EQ(none.micro.recall, 0.0);
  EXPECT_DOUBLE_EQ(none.micro.f1, 0.0);
}

TEST(RedactEval, HandCountedCase) {
  // 20 characters; gold PERSON [0,4), PERSON [10,14), ORG [15,20); a decoy [5,8).
  LabelledDoc d;
  d.text = "ABCDEFGHIJKLMNOPQRST";
  d.spans = {S(0, 4, EntityType::kPerson), S(10, 14, EntityType::kPerson), S(15, 20, EntityType::kOrg)};
  d.decoys = {S(5, 8, EntityType::kPhone)};
  // PERSON [0,4): exact; PERSON [10,13): IoU 3/4, a match but not exact;
  // ORG [15,17): IoU 2/5 < 0.5, a false positive (and the gold ORG missed);
  // ADDRESS [6,9): a false positive over the decoy, 3 characters outside gold.
  auto detect = [](std::string_view) {
    return std::vector<Span>{S(0, 4, EntityType::kPerson), S(10, 13, EntityType::kPerson), S(15, 17, EntityType::kOrg),
                             S(6, 9, EntityType::kAddress)};
  };
  EvalReport r = EvaluateDetector({d}, detect);
  const TypeFigures& p = r.per_type.at(EntityType::kPerson);
  EXPECT_EQ(p.gold, 2);
  EXPECT_EQ(p.predicted, 2);
  EXPECT_EQ(p.tp, 2);
  EXPECT_EQ(p.tp_exact, 1);
  EXPECT_DOUBLE_EQ(p.precision_exact, 0.5);
  const TypeFigures& o = r.per_type.at(EntityType::kOrg);
  EXPECT_EQ(o.tp, 0);
  EXPECT_DOUBLE_EQ(o.f1, 0.0);
  EXPECT_EQ(r.per_type.at(EntityType::kAddress).predicted, 1);
  EXPECT_EQ(r.micro.gold, 3);
  EXPECT_EQ(r.micro.predicted, 4);
  EXPECT_EQ(r.micro.tp, 2);
  EXPECT_DOUBLE_EQ(r.micro.precision, 0.5);
  EXPECT_DOUBLE_EQ(r.micro.recall, 2.0 / 3.0);
  EXPECT_NEAR(r.micro.f1, 4.0 / 7.0, 1e-12);
  EXPECT_NEAR(r.micro.f2, 0.625, 1e-12);
  EXPECT_EQ(r.decoys, 1);
  EXPECT_EQ(r.decoys_hit, 1);
  EXPECT_EQ(r.chars_outside_gold, 7);
  EXPECT_EQ(r.over_redacted_chars, 3);
  EXPECT_NEAR(r.over_redaction, 3.0 / 7.0, 1e-12);
  EXPECT_EQ(r.bytes, 20);

  // Restricted to PERSON: the ORG and ADDRESS predictions and gold drop out.
  EvalOptions only;
  only.types = {EntityType::kPerson};
  EvalReport rp = EvaluateDetector({d}, detect, only);
  EXPECT_EQ(rp.per_type.size(), 1u);
  EXPECT_DOUBLE_EQ(rp.micro.f1, 1.0);
  EXPECT_EQ(rp.decoys_hit, 0);
  EXPECT_EQ(rp.over_redacted_chars, 0);
  // One predicted span cannot match two gold spans.
  EvalReport twice = EvaluateDetector({d}, [](std::string_view) {
    return std::vector<Span>{S(0, 4, EntityType::kPerson), S(0, 4, EntityType::kPerson)};
  }, only);
  EXPECT_EQ(twice.micro.tp, 1);
  EXPECT_EQ(twice.micro.predicted, 2);
  EXPECT_EQ(twice.micro.tp_exact, 1);
}

TEST(RedactEval, TableAndJson) {
  LabelledDoc d;
  d.text = "abc";
  d.spans = {S(0, 3, EntityType::kPerson)};
  EvalReport r = EvaluateDetector({d}, [](std::string_view) { return std::vector<Span>{S(0, 3, EntityType::kPerson)}; });
  EXPECT_NE(FormatEvalTable(r).find("PERSON"), std::string::npos);
  nlohmann::json j = EvalReportJson(r);
  EXPECT_DOUBLE_EQ(j["per_type"]["PERSON"]["f1"].get<double>(), 1.0);
  EXPECT_EQ(j["docs"].get<int64_t>(), 1);
}

}  // namespace
}  // namespace myriad::edge

// CheckRestores finds exact restorations exact, and counts a failure for an
// answer whose placeholder no vault entry backs.
#include "edge/restore_check.h"

#include <gtest/gtest.h>

namespace myriad::edge {
namespace {

TEST(RestoreCheck, ExactOnPlantedDocumentsAndCountsEveryAnswer) {
  const Redactor redactor(nullptr);
  const std::vector<std::string> docs = {
      "Call +86 138-0013-8000 or 13800138000, mail li.na@example.com; ID 11010519491231002X.",
      "客户电话 139 1234 5678，邮箱 wang@example.cn，卡号 6222 0212 3456 7890 123。",
      "No private values here at all."};
  const RestoreCheck r = CheckRestores(redactor, docs);
  EXPECT_EQ(r.documents, 3);
  // 6 echoes per document, and the repeat answer where it has placeholders.
  EXPECT_EQ(r.answers, 6 * 3 + 2);
  EXPECT_GT(r.placeholders, 20);
  EXPECT_EQ(r.failures, 0) << (r.examples.empty() ? "" : r.examples[0]);
}

// A placeholder the vault never had: each answer holding it must count as
// a failure (the check can fail).
TEST(RestoreCheck, AnUnknownPlaceholderIsAFailure) {
  const Redactor redactor(nullptr);
  // The document already holds a placeholder-shaped text no vault entry backs.
  const RestoreCheck r = CheckRestores(redactor, {"Dear \u27E6PERSON_7\u27E7, call 13800138000."});
  EXPECT_EQ(r.failures, r.answers);
  EXPECT_FALSE(r.examples.empty());
}

}  // namespace
}  // namespace myriad::edge

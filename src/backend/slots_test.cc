// The slot list (MYRIAD_BACKEND_SLOTS) is the one place every slot is named:
// these tests fail when a slot has no parity case or is missing from
// docs/backends.md, so adding a slot means adding both.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "backend/backend.h"

namespace myriad {
namespace {

// slot -> the test that checks it against the scalar oracle on every ISA
// ("Suite.Name"; parameterised Parity cases are named without the ISA).
const std::map<std::string, std::string> kParityCase = {
    {"mem_alloc", "Cpu/Parity.DeviceMemory"},
    {"mem_free", "Cpu/Parity.DeviceMemory"},
    {"mem_copy", "Cpu/Parity.DeviceMemory"},
    {"mem_set", "Cpu/Parity.DeviceMemory"},
    {"mem_discard", "Cpu/Parity.DeviceMemory"},
    {"synchronize", "Cpu/Parity.DeviceMemory"},
    {"gemm", "Cpu/Parity.Gemm"},
    {"gemm_bf16", "GemmBf16.MatchesRefOnRaggedShapes"},
    {"rmsnorm_fwd", "Cpu/Parity.Rmsnorm"},
    {"rmsnorm_bwd", "Cpu/Parity.Rmsnorm"},
    {"rope", "Cpu/Parity.Rope"},
    {"swiglu_fwd", "Cpu/Parity.Swiglu"},
    {"swiglu_bwd", "Cpu/Parity.Swiglu"},
    {"softmax_xent", "Cpu/Parity.SoftmaxXent"},
    {"attention_fwd", "Cpu/Parity.AttentionForward"},
    {"attention_bwd", "Cpu/Parity.AttentionBackward"},
    {"attention_merge", "Cpu/Parity.AttentionMerge"},
    {"paged_attention", "Cpu/Parity.PagedAttention"},
    {"moe_route", "Cpu/Parity.MoeRoute"},
    {"moe_route_bwd", "Cpu/Parity.MoeRouteBackward"},
    {"moe_balance_stats", "Cpu/Parity.MoeRouteBackward"},
    {"moe_gather", "Cpu/Parity.Moe"},
    {"moe_combine", "Cpu/Parity.Moe"},
    {"moe_combine_bwd", "Cpu/Parity.Moe"},
    // The DSA kernels against their scalar references, once per kernel ISA.
    {"dsa_indexer_topk", "Dsa.FastMatchesReference"},
    {"dsa_sparse_attention", "Dsa.FastMatchesReference"},
    {"dsa_sparse_attention_bwd", "Dsa.FastMatchesReference"},
    {"dsa_indexer_loss", "Dsa.FastMatchesReference"},
    {"copy_rows", "Cpu/Parity.DataMovement"},
    {"add_scaled", "Cpu/Parity.DataMovement"},
    {"embedding_bwd", "Cpu/Parity.DataMovement"},
    {"sum", "Cpu/Parity.DataMovement"},
    {"adamw", "Cpu/Parity.AdamW"},
    {"sumsq", "Cpu/Parity.Sumsq"},
    {"gemv_f32", "Cpu/Parity.Gemv"},
    {"gemv_f16", "Cpu/Parity.Gemv"},
    {"gemv_q8", "Cpu/Parity.Gemv"},
};

// Whether a test named "Suite.Name" is registered in this binary
// (parameterised instances carry a "/param" suffix on the name).
bool TestExists(const std::string& full) {
  size_t dot = full.find('.');
  std::string suite = full.substr(0, dot), name = full.substr(dot + 1);
  const ::testing::UnitTest* u = ::testing::UnitTest::GetInstance();
  for (int i = 0; i < u->total_test_suite_count(); ++i) {
    const ::testing::TestSuite* s = u->GetTestSuite(i);
    if (suite != s->name()) continue;
    for (int j = 0; j < s->total_test_count(); ++j) {
      std::string n = s->GetTestInfo(j)->name();
      if (n == name || n.rfind(name + "/", 0) == 0) return true;
    }
  }
  return false;
}

TEST(BackendSlots, ListMatchesTheStructAndNamesAreUnique) {
  std::map<std::string, int> seen;
  for (int i = 0; i < kNumBackendSlots; ++i) ++seen[BackendSlots()[i].name];
  EXPECT_EQ((int)seen.size(), kNumBackendSlots);
  EXPECT_NE(FindBackendSlot("gemm"), nullptr);
  EXPECT_EQ(FindBackendSlot("no_such_slot"), nullptr);
  BackendOps empty{};
  EXPECT_NE(MissingRequiredSlots(empty).find("mem_alloc"), std::string::npos);
  EXPECT_EQ(MissingRequiredSlots(empty).find("gemm_bf16"), std::string::npos);  // optional
}

TEST(BackendSlots, EverySlotHasAParityCase) {
  for (int i = 0; i < kNumBackendSlots; ++i) {
    std::string name = BackendSlots()[i].name;
    auto it = kParityCase.find(name);
    ASSERT_NE(it, kParityCase.end()) << "slot " << name << " has no parity case: add one and name it here";
    EXPECT_TRUE(TestExists(it->second)) << name << ": no test " << it->second;
  }
  EXPECT_EQ((int)kParityCase.size(), kNumBackendSlots) << "a parity case names a slot that no longer exists";
}

TEST(BackendSlots, DocsListEverySlot) {
  const char* src = std::getenv("MYRIAD_SOURCE_DIR");
  ASSERT_NE(src, nullptr) << "MYRIAD_SOURCE_DIR unset (ctest sets it)";
  std::ifstream f(std::string(src) + "/docs/backends.md");
  ASSERT_TRUE(f.good()) << "docs/backends.md missing";
  std::stringstream ss;
  ss << f.rdbuf();
  std::string doc = ss.str();
  for (int i = 0; i < kNumBackendSlots; ++i) {
    std::string row = "| `" + std::string(BackendSlots()[i].name) + "` |";
    EXPECT_NE(doc.find(row), std::string::npos) << "docs/backends.md has no table row for " << row;
  }
}

}  // namespace
}  // namespace myriad

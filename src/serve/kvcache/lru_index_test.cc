// LruIndex against hand-written recency orders; its three users (pool, host
// and disk tiers) are tested for their eviction order in runner_test.cc
// (KvPoolTest), tiers_test.cc (EvictsLeastRecentlyUsed*) and
// prefix_cache_test.cc (EvictionFollowsReleaseOrder).
#include "serve/kvcache/lru_index.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace myriad::serve {
namespace {

TEST(LruIndex, TouchOrdersAndPopOldestEvictsLeastRecent) {
  LruIndex<uint64_t> lru;
  EXPECT_TRUE(lru.empty());
  EXPECT_FALSE(lru.Oldest().has_value());
  EXPECT_FALSE(lru.PopOldest().has_value());
  for (uint64_t k : {10, 20, 30, 40}) lru.Touch(k);
  EXPECT_EQ(lru.size(), 4u);
  EXPECT_EQ(lru.MostRecentFirst(), (std::vector<uint64_t>{40, 30, 20, 10}));
  // A use moves a key to the front; touching a present key adds nothing.
  lru.Touch(10);
  lru.Touch(30);
  EXPECT_EQ(lru.size(), 4u);
  EXPECT_EQ(lru.MostRecentFirst(), (std::vector<uint64_t>{30, 10, 40, 20}));
  EXPECT_EQ(*lru.Oldest(), 20u);
  EXPECT_EQ(lru.size(), 4u);  // Oldest only looks
  std::vector<uint64_t> out;
  while (auto k = lru.PopOldest()) out.push_back(*k);
  EXPECT_EQ(out, (std::vector<uint64_t>{20, 40, 10, 30}));
  EXPECT_TRUE(lru.empty());
  EXPECT_FALSE(lru.Contains(30));
}

TEST(LruIndex, EraseRemovesFromAnyPosition) {
  LruIndex<int32_t> lru;
  for (int32_t b : {0, 1, 2, 3, 4}) lru.Touch(b);
  EXPECT_TRUE(lru.Erase(2));   // middle
  EXPECT_TRUE(lru.Erase(0));   // oldest
  EXPECT_TRUE(lru.Erase(4));   // newest
  EXPECT_FALSE(lru.Erase(2));  // already gone
  EXPECT_FALSE(lru.Erase(9));  // never there
  EXPECT_EQ(lru.MostRecentFirst(), (std::vector<int32_t>{3, 1}));
  EXPECT_TRUE(lru.Contains(1));
  EXPECT_FALSE(lru.Contains(0));
  lru.Touch(0);  // re-entered as the newest
  EXPECT_EQ(*lru.PopOldest(), 1);
  EXPECT_EQ(*lru.PopOldest(), 3);
  EXPECT_EQ(*lru.PopOldest(), 0);
  lru.Touch(7);
  lru.Clear();
  EXPECT_EQ(lru.size(), 0u);
  EXPECT_FALSE(lru.Contains(7));
}

}  // namespace
}  // namespace myriad::serve

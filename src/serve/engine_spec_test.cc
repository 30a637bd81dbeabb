// Speculative decoding in the serving engine against the oracle (greedy
// decoding of one sequence, no drafts): n-gram, MTP and auto drafts at batch
// 1 and 16 with prefix hits; the blocks cached after rejected drafts; seeded
// sampling with drafts; mtp refused without MTP modules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "serve/engine.h"
#include "serve/engine_test_util.h"
#include "serve/kv_pool.h"
#include "serve/kvcache/host_tier.h"

namespace myriad::serve {
namespace {

using engine_test::Collector;
using engine_test::EngineTest;
using engine_test::GreedyParams;
using engine_test::RunToEnd;

ModelConfig TinyServeMtp() {
  ModelConfig c = TinyServeMoe(128);
  c.mtp_depth = 1;
  return c;
}

class EngineSpecTest : public EngineTest {
 public:
  EngineSpecTest() : EngineTest(TinyServeMtp()) {}
  // A prompt that repeats (prompt lookup finds drafts in it).
  std::vector<int32_t> Repeating(uint64_t seed) {
    std::vector<int32_t> unit = Prompt(seed, 7), p;
    for (int r = 0; r < 3; ++r) p.insert(p.end(), unit.begin(), unit.end());
    return p;
  }
};

// Greedy output with drafts (n-gram, MTP, auto; a fixed draft length, so
// every step verifies one) is the oracle's, at batch 1 and 16, and again
// when the same prompts come back as prefix hits on blocks the speculative
// requests published: a rejected draft's KV in a published block would
// change them.
TEST_F(EngineSpecTest, GreedyOutputIsTheOraclesWithDraftsAndPrefixHits) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 16; ++i) prompts.push_back(i % 2 ? Repeating(100 + i) : Prompt(200 + i, 19 + i));
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) want.push_back(Oracle(p, 40));
  for (DraftMode mode : {DraftMode::kNgram, DraftMode::kMtp, DraftMode::kAuto}) {
    for (int batch : {1, 16}) {
      EngineConfig cfg;
      cfg.max_batch = batch;
      cfg.kv_pool_blocks = 16 * 8;  // room for every request's blocks to stay cached
      cfg.speculative = mode;
      cfg.draft_tokens = 3;
      cfg.adaptive_draft = false;
      auto e = Engine::Create(model(), cfg);
      ASSERT_TRUE(e.ok()) << e.status().message();
      for (int round = 0; round < 2; ++round) {  // round 1: prefix hits
        std::vector<std::unique_ptr<Collector>> cs;
        for (const auto& p : prompts) {
          cs.push_back(std::make_unique<Collector>());
          ASSERT_TRUE((*e)->Submit(p, GreedyParams(40), cs.back()->Callback()).ok());
        }
        for (size_t i = 0; i < cs.size(); ++i) {
          cs[i]->Wait();
          EXPECT_EQ(cs[i]->tokens, want[i]) << DraftModeName(mode) << " batch " << batch << " round " << round
                                            << " request " << i;
          EXPECT_EQ(cs[i]->final_event.finish_reason, "length");
        }
        if (round == 1) {
          const EngineStats st = (*e)->stats();
          EXPECT_GT(st.cached_tokens, 0) << "the second round hit the prefix cache";
          EXPECT_GT(st.spec_steps, 0) << DraftModeName(mode);
          ASSERT_FALSE(st.spec_proposed.empty());
          EXPECT_GT(st.spec_emitted, st.spec_steps) << "some drafts accepted";
          int64_t acc = 0, prop = 0;
          for (size_t k = 0; k < st.spec_proposed.size(); ++k) acc += st.spec_accepted[k], prop += st.spec_proposed[k];
          EXPECT_LT(acc, prop) << "and some rejected (the rollback is exercised)";
          int64_t req_acc = 0;
          for (auto& c : cs) req_acc += c->final_event.draft_accepted;
          EXPECT_GT(req_acc, 0) << "usage counts per request";
        }
      }
      (*e)->Shutdown();
    }
  }
}

// Sampling with drafts is reproducible for a seed on the same path (the
// distribution itself is tested in model/speculative_test.cc; which tokens
// a seed gives depends on the drafts, so on the cache state: the prefix
// cache is off here); an engine without MTP modules refuses mtp.
TEST_F(EngineSpecTest, SamplingWithDraftsIsSeededAndMtpNeedsModules) {
  EngineConfig cfg;
  cfg.prefix_cache = false;
  cfg.speculative = DraftMode::kAuto;
  cfg.draft_tokens = 4;
  cfg.adaptive_draft = false;
  auto e = Engine::Create(model(), cfg);
  ASSERT_TRUE(e.ok());
  GenerationParams p = GreedyParams(30);
  p.sampling = SamplingParams{0.9f, 8, 0.95f};
  p.seed = 77;
  std::vector<std::unique_ptr<Collector>> keep;
  const auto a = RunToEnd(e->get(), Repeating(5), p, &keep)->tokens;
  const auto b = RunToEnd(e->get(), Repeating(5), p, &keep)->tokens;
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 30u);
  (*e)->Shutdown();
  Model plain(TinyServeMoe(128));
  plain.InitWeights(3);
  EngineConfig m;
  m.speculative = DraftMode::kMtp;
  auto bad = Engine::Create(&plain, m);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("needs a model with MTP modules"), std::string::npos) << bad.status().message();
}

// Rollback leaves the prefix cache exact: every block the speculative
// engine cached (sent to a host tier at shutdown) holds the keys and values
// the plain engine computed for the same tokens, and it caches the same
// blocks. A rejected draft's rows in a published block would differ.
TEST_F(EngineSpecTest, CachedBlocksAreThePlainEnginesAfterRejectedDrafts) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(i % 2 ? Repeating(300 + i) : Prompt(400 + i, 21 + 3 * i));
  auto run = [&](DraftMode mode, HostTier* tier, std::vector<std::vector<int32_t>>* seqs, int64_t* rejected) {
    EngineConfig cfg;
    cfg.max_batch = 8;
    cfg.kv_pool_blocks = 8 * 8;
    cfg.speculative = mode;
    cfg.draft_tokens = 4;
    cfg.adaptive_draft = false;
    cfg.tiers = {tier};
    auto e = Engine::Create(model(), cfg);
    ASSERT_TRUE(e.ok());
    std::vector<std::unique_ptr<Collector>> cs;
    for (const auto& p : prompts) {
      cs.push_back(std::make_unique<Collector>());
      ASSERT_TRUE((*e)->Submit(p, GreedyParams(45), cs.back()->Callback()).ok());
    }
    for (size_t i = 0; i < cs.size(); ++i) {
      cs[i]->Wait();
      std::vector<int32_t> seq = prompts[i];
      seq.insert(seq.end(), cs[i]->tokens.begin(), cs[i]->tokens.end());
      seqs->push_back(seq);
    }
    const EngineStats st = (*e)->stats();
    *rejected = 0;
    for (size_t k = 0; k < st.spec_proposed.size(); ++k) *rejected += st.spec_proposed[k] - st.spec_accepted[k];
    (*e)->Shutdown();  // every cached block goes down to the tier
  };
  HostTierOptions opt;
  opt.capacity_blocks = 256;
  HostTier plain_tier(opt), spec_tier(opt);
  std::vector<std::vector<int32_t>> plain_seqs, spec_seqs;
  int64_t rejected = 0, none = 0;
  run(DraftMode::kOff, &plain_tier, &plain_seqs, &none);
  run(DraftMode::kMtp, &spec_tier, &spec_seqs, &rejected);
  ASSERT_EQ(plain_seqs, spec_seqs) << "greedy output differs";
  EXPECT_GT(rejected, 20) << "drafts were rejected: their KV was written and rolled back";
  const ModelFingerprint fp = FingerprintModel(model_);
  int64_t compared = 0;
  for (const auto& seq : plain_seqs) {
    BlockKey key = 0;
    // The blocks before the last token (whose KV was never computed).
    for (size_t b = 0; (b + 1) * kBlockTokens <= seq.size() - 1; ++b) {
      key = ChainKey(key, seq.data() + b * kBlockTokens, kBlockTokens, fp);
      KvBlock want, got;
      const bool in_plain = plain_tier.Get(key, &want), in_spec = spec_tier.Get(key, &got);
      EXPECT_EQ(in_plain, in_spec) << "block " << b;
      if (!in_plain || !in_spec) continue;
      ASSERT_EQ(want.data.size(), got.data.size());
      double err = 0;
      for (size_t i = 0; i < want.data.size(); ++i) err = std::max(err, std::fabs(double(want.data[i]) - got.data[i]));
      EXPECT_LT(err, 1e-4) << "block " << b << " of a sequence";
      ++compared;
    }
  }
  EXPECT_GT(compared, 10);
}

}  // namespace
}  // namespace myriad::serve

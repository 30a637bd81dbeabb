// The batched paged runner must give every sequence the logits a
// single-sequence InferenceSession gives it (itself held to the training
// forward, and so to the PyTorch reference), whatever the mix of prefill
// chunks and decode tokens in a batch and wherever its blocks sit in the pool.
// Also: the KV pool's reference counts, prefix index and eviction order.
#include "serve/runner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/rng.h"
#include "model/inference.h"
#include "serve/kv_pool.h"

namespace myriad::serve {

// The tiny MoE of model/inference_test.cc (one dense layer, then MoE blocks
// with a shared expert and biased sigmoid routing); engine_test.cc uses it too.
ModelConfig TinyServeMoe(int64_t max_seq_len) {
  ModelConfig c;
  c.vocab_size = 97; c.d_model = 32; c.n_layers = 3; c.n_heads = 4; c.n_kv_heads = 2; c.d_ff = 48;
  c.n_dense_layers = 1; c.n_routed_experts = 6; c.n_shared_experts = 1; c.top_k = 2; c.d_expert = 24;
  c.score_func = "sigmoid"; c.max_seq_len = max_seq_len; c.init_std = 0.2;
  return c;
}

void InitTinyServeMoe(Model* model) {
  model->InitWeights(5);
  Rng rng(13);
  for (auto& b : model->biases())
    for (auto& x : b) x = 0.05f * rng.Normal();  // exercise biased selection
}

// TinyServeMoe with multi-head latent attention (DeepSeek-V3's): q through
// a rank-12 compression, latent rank 16, nope 8 + rope 4, v 6; the cache
// holds 16 + 4 floats per token and layer.
ModelConfig TinyServeMla(int64_t max_seq_len) {
  ModelConfig c = TinyServeMoe(max_seq_len);
  c.kv_lora_rank = 16; c.q_lora_rank = 12; c.qk_nope_head_dim = 8; c.qk_rope_head_dim = 4; c.v_head_dim = 6;
  c.n_kv_heads = c.n_heads;
  return c;
}

namespace {

ModelConfig TinyMoe() { return TinyServeMoe(96); }

double MaxRelErr(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return num / den;
}

int32_t Argmax(const float* x, int64_t n) { return static_cast<int32_t>(std::max_element(x, x + n) - x); }

// Three sequences: prompts of 5, 21 and 40 tokens, prefilled in chunks of
// different sizes alongside the others' decode tokens, then decoded together.
void CheckBatchedAgainstSessions(const ModelConfig& cfg, AttentionPath path = AttentionPath::kPaged) {
  Model model(cfg);
  InitTinyServeMoe(&model);
  const int64_t V = cfg.vocab_size;
  KvPool pool(cfg, 32);
  BatchRunner runner(model, &pool, WeightFormat::kF32, path);

  struct Seq {
    std::vector<int32_t> tokens;  // prompt, then greedy tokens
    int64_t prompt = 0, computed = 0;
    std::vector<int32_t> blocks;
    std::unique_ptr<InferenceSession> session;
  };
  Rng rng(7);
  std::vector<Seq> seqs(3);
  const int64_t prompts[3] = {5, 21, 40};
  for (int i = 0; i < 3; ++i) {
    seqs[i].prompt = prompts[i];
    for (int64_t t = 0; t < prompts[i]; ++t) seqs[i].tokens.push_back(static_cast<int32_t>(rng.Below(V)));
    seqs[i].session = std::make_unique<InferenceSession>(model, cfg.max_seq_len);
  }
  // Interleave allocations so each table is scattered over the pool.
  auto ensure = [&](Seq& s, int64_t upto) {
    while (static_cast<int64_t>(s.blocks.size()) * kBlockTokens < upto) s.blocks.push_back(pool.Allocate());
  };
  const int64_t chunk_cap[3] = {8, 9, 17};  // prefill chunk per step
  int steps = 0, compared = 0;
  while (steps < 12) {
    std::vector<SeqChunk> chunks;
    std::vector<int> who;
    for (int i = 0; i < 3; ++i) {
      Seq& s = seqs[i];
      const int64_t left = static_cast<int64_t>(s.tokens.size()) - s.computed;
      const int64_t n = s.computed < s.prompt ? std::min(left, chunk_cap[i]) : left;
      ensure(s, s.computed + n);
      chunks.push_back({s.tokens.data() + s.computed, n, s.computed, s.blocks.data(),
                        static_cast<int64_t>(s.blocks.size())});
      who.push_back(i);
    }
    const float* logits = runner.Forward(chunks);
    for (size_t c = 0; c < chunks.size(); ++c) {
      Seq& s = seqs[who[c]];
      const float* ref = s.session->Forward(chunks[c].tokens, chunks[c].n);
      EXPECT_LE(MaxRelErr(logits + c * V, ref, V), 1e-4) << "seq " << who[c] << " step " << steps;
      ++compared;
      s.computed += chunks[c].n;
      if (s.computed == static_cast<int64_t>(s.tokens.size())) {
        const int32_t a = Argmax(logits + c * V, V), b = Argmax(ref, V);
        EXPECT_EQ(a, b) << "greedy token, seq " << who[c] << " step " << steps;
        s.tokens.push_back(b);
      }
    }
    ++steps;
  }
  EXPECT_EQ(compared, 36);
  EXPECT_GE(seqs[2].tokens.size(), 40u + 8u);  // the longest one decoded for several steps too
}

TEST(RunnerTest, BatchedMixedPrefillDecodeMatchesSessions) { CheckBatchedAgainstSessions(TinyMoe()); }

// The paged attention op against the gather path it replaced: two runners on
// two pools with the same block layout (scattered: allocations interleave
// across sequences), the same batches of prefill chunks and decode tokens,
// for GQA groups of 1, 2 and 4 query heads per kv head. Logits within 1e-5
// (relative to the largest) at every step.
TEST(RunnerTest, PagedAttentionMatchesGatherPath) {
  for (int64_t kv_heads : {4, 2, 1}) {
    ModelConfig cfg = TinyMoe();
    cfg.n_kv_heads = kv_heads;
    Model model(cfg);
    InitTinyServeMoe(&model);
    const int64_t V = cfg.vocab_size;
    KvPool pool_p(cfg, 32), pool_g(cfg, 32);
    BatchRunner paged(model, &pool_p, WeightFormat::kF32, AttentionPath::kPaged);
    BatchRunner gather(model, &pool_g, WeightFormat::kF32, AttentionPath::kGather);
    Rng rng(11);
    const int64_t prompts[4] = {3, 18, 45, 1}, caps[4] = {8, 7, 16, 1};
    std::vector<std::vector<int32_t>> tokens(4), blocks(4);
    std::vector<int64_t> computed(4, 0);
    for (int i = 0; i < 4; ++i)
      for (int64_t t = 0; t < prompts[i]; ++t) tokens[i].push_back(static_cast<int32_t>(rng.Below(V)));
    double worst = 0;
    for (int step = 0; step < 14; ++step) {
      std::vector<SeqChunk> chunks;
      for (int i = 0; i < 4; ++i) {
        const int64_t left = static_cast<int64_t>(tokens[i].size()) - computed[i];
        const int64_t n = computed[i] < prompts[i] ? std::min(left, caps[i]) : left;
        while (static_cast<int64_t>(blocks[i].size()) * kBlockTokens < computed[i] + n) {
          blocks[i].push_back(pool_p.Allocate());
          ASSERT_EQ(pool_g.Allocate(), blocks[i].back());
        }
        chunks.push_back({tokens[i].data() + computed[i], n, computed[i], blocks[i].data(),
                          static_cast<int64_t>(blocks[i].size())});
      }
      const float* lp = paged.Forward(chunks);
      const float* lg = gather.Forward(chunks);
      for (int i = 0; i < 4; ++i) {
        const double err = MaxRelErr(lp + i * V, lg + i * V, V);
        worst = std::max(worst, err);
        EXPECT_LE(err, 1e-5) << "kv heads " << kv_heads << " seq " << i << " step " << step;
        computed[i] += chunks[i].n;
        if (computed[i] == static_cast<int64_t>(tokens[i].size())) tokens[i].push_back(Argmax(lg + i * V, V));
      }
    }
    EXPECT_GE(tokens[2].size(), 45u + 10u);  // the longest prompt decoded for several steps too
    std::printf("kv heads %lld: worst relative logit difference paged vs gather %.2e\n",
                static_cast<long long>(kv_heads), worst);
  }
}

// DSA over paged blocks: the indexer keys live in the blocks (after the
// layers' k/v), the selection of a group's first layer serves the second;
// top-12 of up to ~50 keys, so most steps attend sparsely. The runner
// attends through the paged op's sparse mode (K/V in place); each session
// through DsaAttend's SparseAttention over its contiguous cache.
TEST(RunnerTest, DsaBatchedMatchesSessions) {
  ModelConfig cfg = TinyMoe();
  cfg.attention = "dsa";
  cfg.dsa_topk = 12;
  cfg.dsa_index_heads = 2;
  cfg.dsa_index_dim = 8;
  cfg.dsa_index_share = 2;
  cfg.dsa_index_rope_dim = 4;
  EXPECT_EQ(BlockFloats(cfg), cfg.n_layers * 2 * kBlockTokens * cfg.n_kv_heads * cfg.head_dim() +
                                  2 * kBlockTokens * cfg.dsa_index_dim);
  CheckBatchedAgainstSessions(cfg);
}

// MLA: the pool's blocks hold one latent row per token and layer (keys and
// values both); batched prefill chunks and decode tokens over them, through
// the paged op and through the gather path, give each sequence its session's
// logits (the session is held to the training forward and to the PyTorch
// reference: tests/hf/model_parity.sh).
TEST(RunnerTest, MlaBatchedMatchesSessions) {
  const ModelConfig cfg = TinyServeMla(96);
  EXPECT_EQ(BlockFloats(cfg), cfg.n_layers * kBlockTokens * (16 + 4));
  KvPool pool(cfg, 4);
  EXPECT_TRUE(pool.v_is_k());
  EXPECT_EQ(pool.k_row(1, 2, 3), pool.data(1) + (2 * kBlockTokens + 3) * 20);
  EXPECT_EQ(pool.v_row(1, 2, 3), pool.k_row(1, 2, 3));
  CheckBatchedAgainstSessions(cfg);
  CheckBatchedAgainstSessions(cfg, AttentionPath::kGather);
}

TEST(KvPoolTest, RefcountsCachedBlocksAndLruEviction) {
  // The key index on top is PrefixCache's (prefix_cache_test.cc).
  const ModelConfig cfg = TinyMoe();
  KvPool pool(cfg, 3);
  EXPECT_EQ(pool.block_floats(), BlockFloats(cfg));
  std::vector<int32_t> evicted;
  pool.set_on_evict([&](int32_t b) { evicted.push_back(b); });
  const int32_t a = pool.Allocate(), b = pool.Allocate(), c = pool.Allocate();
  EXPECT_EQ(pool.Allocate(), -1);  // all referenced: nothing to evict
  pool.MarkCached(a);
  pool.MarkCached(b);
  pool.MarkCached(b);  // once is enough
  EXPECT_EQ(pool.cached(), 2);
  EXPECT_FALSE(pool.is_cached(c));
  pool.Ref(a);  // a second user
  pool.Release(c);  // not cached: free
  pool.Release(b);  // cached
  pool.Release(a);
  EXPECT_EQ(pool.available(), 2);
  EXPECT_EQ(pool.refs(a), 1);
  // The free block goes first, then the least recently released cached one.
  EXPECT_EQ(pool.Allocate(), c);
  EXPECT_TRUE(evicted.empty());
  EXPECT_EQ(pool.Allocate(), b);
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0], b);
  EXPECT_FALSE(pool.is_cached(b));
  EXPECT_TRUE(pool.is_cached(a));  // still held, never evicted
  EXPECT_EQ(pool.cached(), 1);
  EXPECT_EQ(pool.evictions(), 1);
  EXPECT_EQ(pool.Allocate(), -1);
  // A cached block taken again leaves the LRU while referenced.
  pool.Release(a);
  EXPECT_EQ(pool.available(), 1);
  pool.Ref(a);
  EXPECT_EQ(pool.Allocate(), -1);
  // Released blocks are evicted least recently released first.
  pool.MarkCached(b);
  pool.MarkCached(c);
  pool.Release(c);
  pool.Release(a);
  pool.Release(b);
  EXPECT_EQ(pool.Allocate(), c);
  EXPECT_EQ(pool.Allocate(), a);
  EXPECT_EQ(pool.Allocate(), b);
  EXPECT_EQ(evicted, (std::vector<int32_t>{b, c, a, b}));
}

TEST(KvPoolTest, FingerprintFollowsWeightsAndConfig) {
  const ModelConfig cfg = TinyMoe();
  Model m1(cfg), m2(cfg);
  m1.InitWeights(1);
  m2.InitWeights(1);
  EXPECT_EQ(FingerprintModel(m1).value, FingerprintModel(m2).value);
  const float w5 = m2.ParamsToHost()[5] + 1e-3f;
  m2.ParamsFromHost(&w5, 5, 1);
  EXPECT_NE(FingerprintModel(m1).value, FingerprintModel(m2).value);
  Model m3(cfg);
  m3.InitWeights(1);
  m3.biases()[0][0] = 0.5f;
  EXPECT_NE(FingerprintModel(m1).value, FingerprintModel(m3).value);
  // The weight format the engine computes with.
  EXPECT_EQ(FingerprintModel(m1).value, FingerprintModel(m1, WeightFormat::kF32).value);
  EXPECT_NE(FingerprintModel(m1).value, FingerprintModel(m1, WeightFormat::kF16).value);
  EXPECT_NE(FingerprintModel(m1, WeightFormat::kF16).value, FingerprintModel(m1, WeightFormat::kQ8).value);
}

// Figures for docs/serving.md (printed, not asserted): prefill tokens/s, and
// decode tokens/s of one sequence vs a batch of 16, on a small MoE. Seconds
// long, so it runs only with MYRIAD_SERVE_FIGURES=1.
TEST(RunnerTest, ThroughputFigures) {
  if (!std::getenv("MYRIAD_SERVE_FIGURES")) GTEST_SKIP() << "set MYRIAD_SERVE_FIGURES=1 to measure";
  ModelConfig cfg;
  cfg.vocab_size = 4096; cfg.d_model = 256; cfg.n_layers = 4; cfg.n_heads = 8; cfg.n_kv_heads = 8;
  cfg.d_ff = 1024; cfg.n_dense_layers = 1; cfg.n_routed_experts = 8; cfg.top_k = 2; cfg.d_expert = 512;
  cfg.max_seq_len = 512;
  Model model(cfg);
  model.InitWeights(1);
  const int B = 16, P = 128, steps = 16;
  KvPool pool(cfg, B * ((P + steps) / kBlockTokens + 1));
  BatchRunner runner(model, &pool);
  std::vector<std::vector<int32_t>> tok(B), blocks(B);
  for (int i = 0; i < B; ++i) {
    for (int t = 0; t < P + steps; ++t) tok[i].push_back((i * 31 + t * 7) % 4096);
    for (int k = 0; k < (P + steps) / kBlockTokens + 1; ++k) blocks[i].push_back(pool.Allocate());
  }
  using Clock = std::chrono::steady_clock;
  auto chunk = [&](int i, int64_t start, int64_t n) {
    return SeqChunk{tok[i].data() + start, n, start, blocks[i].data(), static_cast<int64_t>(blocks[i].size())};
  };
  auto t0 = Clock::now();
  for (int i = 0; i < B; ++i) runner.Forward({chunk(i, 0, P)});
  const double prefill = std::chrono::duration<double>(Clock::now() - t0).count();
  t0 = Clock::now();
  for (int s = 0; s < steps; ++s) runner.Forward({chunk(0, P + s, 1)});
  const double single = std::chrono::duration<double>(Clock::now() - t0).count();
  t0 = Clock::now();
  for (int s = 0; s < steps; ++s) {
    std::vector<SeqChunk> cs;
    for (int i = 0; i < B; ++i) cs.push_back(chunk(i, P + s, 1));
    runner.Forward(cs);
  }
  const double batched = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("[figures] prefill %.0f tokens/s (%d x %d tokens); decode batch 1: %.0f tokens/s; "
              "batch %d: %.0f tokens/s\n",
              B * P / prefill, B, P, steps / single, B, B * steps / batched);
}

}  // namespace
}  // namespace myriad::serve

// Speculative decoding: the n-gram drafter's matches by hand; ForwardAll
// and Truncate against token-by-token decoding; the MTP modules' inference
// forward against the training forward's MTP logits; greedy output
// identical to plain greedy decoding with n-gram, MTP and auto drafts; the
// accept-or-resample rule drawing exactly the sampler's distribution; and a
// chi-square test that speculative sampling keeps the joint distribution of
// the next tokens, which a deliberately wrong rule fails.
#include "model/speculative.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace myriad {
namespace {

TEST(NgramDrafter, TheLongestMostRecentMatchIsContinued) {
  NgramDrafter d;  // n from 3 down to 1
  //                            0  1  2  3  4  5  6  7  8
  const std::vector<int32_t> c = {5, 6, 7, 8, 9, 6, 7, 1, 6, 7};
  // Last 3 = {1, 6, 7}: no earlier match; last 2 = {6, 7}: at 5 (then 1, 6, 7) and at 1 (then 8, 9, 6, 7, 1, 6, 7).
  EXPECT_EQ(d.Draft(c, 2), (std::vector<int32_t>{1, 6}));      // the most recent has 2 after it
  EXPECT_EQ(d.Draft(c, 3), (std::vector<int32_t>{1, 6, 7}));
  EXPECT_EQ(d.Draft(c, 10), (std::vector<int32_t>{8, 9, 6, 7, 1, 6, 7}));  // the one with the most after it
  EXPECT_EQ(d.Draft({1, 2, 3}, 4), (std::vector<int32_t>{}));   // nothing repeats
  EXPECT_EQ(d.Draft({4, 4}, 3), (std::vector<int32_t>{4}));
  EXPECT_TRUE(d.Draft(c, 0).empty());
}

ModelConfig Tiny(bool moe) {
  ModelConfig c;
  c.vocab_size = 61; c.d_model = 32; c.n_layers = 2; c.n_heads = 4; c.n_kv_heads = 2; c.d_ff = 48;
  c.n_dense_layers = moe ? 1 : 2; c.n_routed_experts = moe ? 4 : 0; c.top_k = 2; c.d_expert = 16;
  c.n_shared_experts = moe ? 1 : 0; c.max_seq_len = 96; c.init_std = 0.3;
  return c;
}

TEST(Speculative, ForwardAllAndTruncateMatchTokenByToken) {
  Model model(Tiny(true));
  model.InitWeights(5);
  const int64_t V = model.config().vocab_size;
  std::vector<int32_t> t = {3, 9, 14, 3, 9, 27, 1, 50};
  InferenceSession one(model, 64), all(model, 64);
  std::vector<float> want;
  for (int32_t x : t) {
    const float* lg = one.Forward(&x, 1);
    want.insert(want.end(), lg, lg + V);
  }
  all.Forward(t.data(), 3);
  const float* rows = all.ForwardAll(t.data() + 3, 5);
  for (int64_t i = 0; i < 5 * V; ++i) ASSERT_NEAR(rows[i], want[3 * V + i], 1e-4f) << i;
  // Roll back 3 positions and feed other tokens: as if they had come first.
  all.Truncate(5);
  const std::vector<int32_t> other = {7, 7, 2};
  const float* lg = all.ForwardAll(other.data(), 3);
  InferenceSession fresh(model, 64);
  fresh.Forward(t.data(), 5);
  const float* ref = fresh.ForwardAll(other.data(), 3);
  for (int64_t i = 0; i < 3 * V; ++i) ASSERT_NEAR(lg[i], ref[i], 1e-4f) << i;
  EXPECT_EQ(all.len(), 8);
}

// Plain greedy decoding of n tokens after `prompt`.
std::vector<int32_t> Greedy(const Model& m, const std::vector<int32_t>& prompt, int n) {
  InferenceSession s(m, 96);
  const float* lg = s.Forward(prompt.data(), static_cast<int64_t>(prompt.size()));
  SamplingParams g;
  g.temperature = 0;
  Rng rng(1);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int32_t t = SampleToken(lg, m.config().vocab_size, g, &rng);
    out.push_back(t);
    lg = s.Forward(&t, 1);
  }
  return out;
}

TEST(Speculative, GreedyOutputIsIdenticalAndDraftsAreAccepted) {
  for (bool moe : {false, true}) {
    Model model(Tiny(moe));
    model.InitWeights(moe ? 8 : 9);
    std::vector<int32_t> prompt;
    for (int r = 0; r < 4; ++r)
      for (int32_t x : {11, 12, 13, 14, 15, 16}) prompt.push_back(x);  // repetitive: prompt lookup finds drafts
    const int N = 48;
    const std::vector<int32_t> want = Greedy(model, prompt, N);
    for (int k : {1, 3, 6}) {
      InferenceSession s(model, 96);
      const float* lg = s.Forward(prompt.data(), static_cast<int64_t>(prompt.size()));
      SamplingParams g;
      g.temperature = 0;
      Rng rng(1);
      std::vector<int32_t> context = prompt, out;
      std::vector<int32_t> emit = {SampleToken(lg, model.config().vocab_size, g, &rng)};
      SpeculativeStats st;
      while (static_cast<int>(out.size()) < N) {
        for (int32_t t : emit) out.push_back(t), context.push_back(t);
        emit = VerifyDraft(&s, context.back(), NgramDrafter{}.Draft(context, k), nullptr, model.config().vocab_size,
                           g, &rng, &st);
      }
      out.resize(N);
      EXPECT_EQ(out, want) << "moe " << moe << " k " << k;
      EXPECT_GT(st.AcceptanceRate(), 0.0) << "moe " << moe << " k " << k;
      EXPECT_LT(st.steps, N) << "fewer forwards than tokens";
    }
  }
}

TEST(Speculative, AcceptOrResampleDrawsTheSamplersDistribution) {
  // A fixed distribution; every draft token in turn, including one outside it.
  const float logits[6] = {2.0f, 1.5f, 0.3f, -1.0f, 0.9f, -3.0f};
  SamplingParams sp;
  sp.temperature = 0.9f;
  sp.top_k = 5;
  const TokenDistribution p = SamplingDistribution(logits, 6, sp);
  ASSERT_EQ(p.ids.size(), 5u);
  const int kDraws = 200000;
  for (int32_t draft : {0, 1, 3, 5}) {
    Rng rng(100 + draft);
    std::vector<int> count(6, 0);
    int accepted = 0;
    for (int i = 0; i < kDraws; ++i) {
      bool ok = false;
      count[AcceptOrResample(p, nullptr, draft, &rng, &ok)]++;
      accepted += ok;
    }
    for (int32_t id = 0; id < 6; ++id) {
      const double want = p.ProbOf(id), got = static_cast<double>(count[id]) / kDraws;
      const double sigma = std::sqrt(want * (1 - want) / kDraws) + 1e-12;
      EXPECT_LE(std::fabs(got - want), 5 * sigma + 1e-9) << "draft " << draft << " id " << id;
    }
    EXPECT_NEAR(static_cast<double>(accepted) / kDraws, p.ProbOf(draft), 0.005) << "draft " << draft;
  }
}

TEST(Speculative, AcceptOrResampleWithADraftDistributionDrawsP) {
  // p and q over overlapping supports; d ~ q, then the rule: the result ~ p.
  const float lp[6] = {2.0f, 1.5f, 0.3f, -1.0f, 0.9f, -3.0f};
  const float lq[6] = {-1.0f, 0.5f, 2.3f, 1.0f, 0.9f, 0.0f};
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 4;
  const TokenDistribution p = SamplingDistribution(lp, 6, sp), q = SamplingDistribution(lq, 6, sp);
  const int kDraws = 200000;
  Rng rng(7);
  std::vector<int> count(6, 0);
  for (int i = 0; i < kDraws; ++i) {
    const int32_t d = q.Draw(rng.Uniform());
    bool ok = false;
    count[AcceptOrResample(p, &q, d, &rng, &ok)]++;
  }
  for (int32_t id = 0; id < 6; ++id) {
    const double want = p.ProbOf(id), got = static_cast<double>(count[id]) / kDraws;
    EXPECT_LE(std::fabs(got - want), 5 * std::sqrt(want * (1 - want) / kDraws) + 1e-9) << "id " << id;
  }
}

// Tiny models: one thread is fastest, and keeps these tests quick while
// other tests load the machine.
struct OneThread {
  int saved = omp_get_max_threads();
  OneThread() { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(saved); }
};

ModelConfig TinyMtp(bool moe, int depth, bool mla, bool after_norm) {
  ModelConfig c = Tiny(moe);
  c.mtp_depth = depth;
  c.mtp_after_final_norm = after_norm;
  if (mla) {
    c.kv_lora_rank = 16; c.q_lora_rank = 0; c.qk_nope_head_dim = 8; c.qk_rope_head_dim = 4; c.v_head_dim = 8;
  }
  return c;
}

// The MTP modules in inference, one row at a time through their caches,
// against the training forward (Model::Step's mtp_logits): module j's row i
// reads the previous level's row i and token i + j + 1.
TEST(MtpDrafter, InferenceRowsMatchTheTrainingForward) {
  OneThread one;
  struct Case { bool moe, mla, after_norm; int depth; };
  for (const Case& cs : {Case{false, false, false, 1}, Case{true, false, false, 2}, Case{true, true, true, 2},
                         Case{false, true, false, 3}}) {
    Model model(TinyMtp(cs.moe, cs.depth, cs.mla, cs.after_norm));
    model.InitWeights(21);
    const int T = 12;
    std::vector<int32_t> t(T + 1);
    for (int i = 0; i <= T; ++i) t[i] = (7 * i + 3) % 61;
    model.Step(t.data(), 1, T, false);
    const int64_t V = 61, C = 32;
    InferenceSession s(model, 96);
    std::vector<float> hidden(T * C);
    s.Forward(t.data(), T, hidden.data());
    const InferenceWeights& w = s.weights();
    ContiguousKv kv(model.config(), static_cast<int>(model.config().n_layers), cs.depth, 96);
    InferenceScratch scratch;
    std::vector<float> lg(V);
    // Module j's row i at position i: one row at a time through the cache.
    auto row = [&](int j, const float* h, int i, float* out) {
      const int32_t pos = i;
      const int64_t zero = 0;
      kv.start = i, kv.n = 1;
      MtpForward(w, j, h, &t[i + j + 1], &pos, 1, &kv, &zero, 1, &scratch, lg.data(), out);
    };
    std::vector<std::vector<float>> out(cs.depth, std::vector<float>(T * C));
    for (int j = 0; j < cs.depth; ++j) {
      const std::vector<float> want = model.mtp_logits(j);  // [T-1-j, V]
      ASSERT_EQ(want.size(), static_cast<size_t>((T - 1 - j) * V));
      for (int i = 0; i < T - 1 - j; ++i) {
        row(j, j == 0 ? hidden.data() + i * C : out[j - 1].data() + i * C, i, out[j].data() + i * C);
        double err = 0, ref = 0;
        for (int64_t v = 0; v < V; ++v) err = std::max(err, std::fabs(double(lg[v]) - want[i * V + v])),
                                        ref = std::max(ref, std::fabs(double(want[i * V + v])));
        ASSERT_LE(err, 1e-4 * (1 + ref)) << "module " << j << " row " << i << " moe " << cs.moe << " mla " << cs.mla;
      }
    }
    // Rows in one call equal rows one by one (the cache rows are the same).
    std::vector<float> o2(T * C);
    std::vector<int32_t> p32(T - 1);
    for (int i = 0; i < T - 1; ++i) p32[i] = i;
    const int64_t last = T - 2;
    kv.start = 0, kv.n = T - 1;
    MtpForward(w, 0, hidden.data(), &t[1], p32.data(), T - 1, &kv, &last, 1, &scratch, lg.data(), o2.data());
    const std::vector<float> want = model.mtp_logits(0);
    for (int64_t v = 0; v < V; ++v) ASSERT_NEAR(lg[v], want[(T - 2) * V + v], 1e-4f * (1 + std::fabs(want[(T - 2) * V + v])));
  }
}

// A few hundred SGD steps on a periodic sequence: the main head and the MTP
// modules learn it, so MTP drafts are mostly accepted.
void TrainPeriodic(Model* m, int steps) {
  const int T = 32;
  std::vector<int32_t> t(T + 1);
  for (int i = 0; i <= T; ++i) t[i] = 11 + (i * 5) % 9;
  for (int it = 0; it < steps; ++it) {
    m->ZeroGrads();
    m->Step(t.data(), 1, T, true);
    std::vector<float> p = m->ParamsToHost();  // (device memory: through the host)
    const std::vector<float> g = m->GradsToHost();
    for (size_t i = 0; i < p.size(); ++i) p[i] -= 0.5f * g[i];
    m->ParamsFromHost(p.data(), 0, static_cast<int64_t>(p.size()));
  }
}

std::vector<int32_t> DecodeSpeculative(const Model& m, const std::vector<int32_t>& prompt, int n, DraftMode mode, int k,
                                       const SamplingParams& sp, uint64_t seed, SpeculativeStats* st,
                                       AcceptRule rule = nullptr) {
  InferenceSession s(m, 96);
  SpeculativeDecoder dec(&s, mode, k);
  dec.set_rule(rule);
  const float* lg = dec.Prefill(prompt);
  Rng rng(seed);
  std::vector<int32_t> context = prompt, out;
  std::vector<int32_t> emit = {SampleToken(lg, m.config().vocab_size, sp, &rng)};
  while (static_cast<int>(out.size()) < n) {
    for (int32_t t : emit) out.push_back(t), context.push_back(t);
    if (static_cast<int>(out.size()) >= n) break;
    emit = dec.Step(context, n - static_cast<int>(out.size()), sp, &rng);
  }
  out.resize(n);
  if (st) *st = dec.stats();
  return out;
}

TEST(MtpDrafter, GreedyOutputIsIdenticalWithMtpAndAutoDrafts) {
  OneThread one;
  for (bool moe : {false, true}) {
    Model model(TinyMtp(moe, moe ? 2 : 1, false, moe));
    model.InitWeights(31);
    TrainPeriodic(&model, 150);
    const std::vector<int32_t> prompt = {11, 16, 12, 17, 13};
    const int N = 40;
    const std::vector<int32_t> want = Greedy(model, prompt, N);
    SamplingParams g;
    g.temperature = 0;
    for (DraftMode mode : {DraftMode::kMtp, DraftMode::kAuto}) {
      for (int k : {1, 2, 4}) {
        SpeculativeStats st;
        EXPECT_EQ(DecodeSpeculative(model, prompt, N, mode, k, g, 1, &st), want)
            << "moe " << moe << " mode " << DraftModeName(mode) << " k " << k;
        EXPECT_GT(st.AcceptanceRate(), 0.5) << "trained drafts are mostly right";
        EXPECT_LT(st.steps, N) << "fewer forwards than tokens";
      }
    }
    // Untrained: drafts mostly rejected, output still identical.
    Model raw(TinyMtp(moe, 2, moe, false));
    raw.InitWeights(32);
    EXPECT_EQ(DecodeSpeculative(raw, prompt, N, DraftMode::kMtp, 3, g, 1, nullptr), Greedy(raw, prompt, N));
  }
}

// A deliberately wrong rule: on rejection, draw from p instead of the
// residual (p - q)+, which over-weights the tokens q already favours.
int32_t ResampleFromP(const TokenDistribution& p, const TokenDistribution* q, int32_t draft, Rng* rng, bool* accepted) {
  const double pd = p.ProbOf(draft), qd = q ? q->ProbOf(draft) : 1.0;
  if (pd > 0 && rng->Uniform() * qd < pd) return *accepted = true, draft;
  *accepted = false;
  return p.Draw(rng->Uniform());
}

// Speculative sampling keeps the joint distribution of the next two tokens:
// a chi-square of 10,000 seeded samples against the exact p(y1) p(y2 | y1)
// from plain forwards, with MTP drafts (drawn from q) and n-gram drafts; the
// wrong rule above fails the same test.
TEST(Speculative, ChiSquareKeepsTheJointDistribution) {
  OneThread one;
  Model model(TinyMtp(true, 1, false, false));
  model.InitWeights(41);
  TrainPeriodic(&model, 10);  // p and q overlap, but differ
  const int64_t V = model.config().vocab_size;
  SamplingParams sp;
  sp.temperature = 2.0f;
  sp.top_k = 4;
  const std::vector<int32_t> prompt = {11, 16, 12, 17, 13, 18, 14, 19, 15, 11, 16, 12};
  // The exact joint over the 16 cells (y1, y2) after prompt + pending.
  std::vector<int32_t> ctx = prompt;
  ctx.push_back(17);  // the pending token
  InferenceSession ref(model, 96);
  const TokenDistribution p1 = SamplingDistribution(ref.Forward(ctx.data(), ctx.size()), V, sp);
  std::map<std::pair<int32_t, int32_t>, double> want;
  for (size_t a = 0; a < p1.ids.size(); ++a) {
    ref.Truncate(ctx.size());
    const TokenDistribution p2 = SamplingDistribution(ref.Forward(&p1.ids[a], 1), V, sp);
    for (size_t b = 0; b < p2.ids.size(); ++b) want[{p1.ids[a], p2.ids[b]}] = p1.prob[a] * p2.prob[b];
  }
  ASSERT_EQ(want.size(), 16u);
  // Under the fenced backend (make test's device-memory check) a few
  // samples exercise the same paths; the statistics need the full count.
  const char* backend = std::getenv("MYRIAD_BACKEND");
  const bool fenced = backend && std::string(backend) == "fenced";
  const int kSamples = fenced ? 200 : 10000;
  InferenceSession s(model, 96);
  auto chi2 = [&](DraftMode mode, AcceptRule rule, double* acceptance) {
    std::map<std::pair<int32_t, int32_t>, int> got;
    int64_t proposed = 0, accepted = 0;
    for (int n = 0; n < kSamples; ++n) {
      s.Truncate(0);
      SpeculativeDecoder dec(&s, mode, 2);
      dec.set_rule(rule);
      dec.Prefill(prompt);
      Rng rng(1000 + n);
      std::vector<int32_t> c = ctx, out;
      while (out.size() < 2) {
        for (int32_t t : dec.Step(c, 4, sp, &rng)) out.push_back(t), c.push_back(t);
      }
      got[{out[0], out[1]}]++;
      for (size_t i = 0; i < dec.stats().proposed.size(); ++i)
        proposed += dec.stats().proposed[i], accepted += dec.stats().accepted[i];
    }
    *acceptance = proposed ? double(accepted) / proposed : 0;
    double x = 0;
    for (const auto& [cell, pr] : want) {
      const double e = pr * kSamples, o = got.count(cell) ? got[cell] : 0;
      x += (o - e) * (o - e) / e;
      got.erase(cell);
    }
    EXPECT_TRUE(got.empty()) << "a sample outside the support of p";
    return x;
  };
  // 15 degrees of freedom: P(chi2 > 40) < 5e-4. (Seeded: the figures are
  // fixed; with 20,000 samples they were 12.7, 10.2 and 3,127.)
  double acc = 0;
  if (fenced) {
    chi2(DraftMode::kMtp, nullptr, &acc);
    chi2(DraftMode::kNgram, nullptr, &acc);
    return;
  }
  EXPECT_LT(chi2(DraftMode::kMtp, nullptr, &acc), 40.0) << "MTP drafts";
  EXPECT_GT(acc, 0.3) << "drafts are accepted often enough to matter";
  EXPECT_LT(acc, 0.9) << "and rejected often enough to test the residual";
  EXPECT_LT(chi2(DraftMode::kNgram, nullptr, &acc), 40.0) << "n-gram drafts";
  EXPECT_GT(acc, 0.3);
  EXPECT_GT(chi2(DraftMode::kMtp, ResampleFromP, &acc), 200.0) << "the wrong rule must be caught";
}

}  // namespace
}  // namespace myriad

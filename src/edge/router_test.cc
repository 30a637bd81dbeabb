// The router's classifier (gradient against finite differences, learning a
// separable set, not learning shuffled labels), threshold calibration
// against brute force, router.json's round trip and refusals.
#include "edge/router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <thread>

#include "core/rng.h"
#include "core/env.h"
#include "data/test_util.h"
#include "edge/judge.h"
#include "model/inference.h"

namespace myriad::edge {
namespace {

void CheckGradient(int hidden) {
  const int I = 5, n = 7;
  RouteClassifier clf(I, hidden, 3);
  Rng rng(11);
  for (float& p : clf.params()) p += 0.3f * rng.Normal();  // biases away from zero too
  std::vector<float> xs(n * I), ys(n), w(n);
  for (float& x : xs) x = rng.Normal();
  for (int r = 0; r < n; ++r) ys[r] = static_cast<float>(r % 2), w[r] = 0.5f + rng.Uniform();
  std::vector<float> g;
  clf.Loss(xs, ys, &w, &g);
  ASSERT_EQ(g.size(), clf.params().size());
  const float eps = 1e-2f;
  for (size_t i = 0; i < g.size(); ++i) {
    RouteClassifier a = clf, b = clf;
    a.params()[i] += eps, b.params()[i] -= eps;
    const double fd = (a.Loss(xs, ys, &w, nullptr) - b.Loss(xs, ys, &w, nullptr)) / (2 * eps);
    EXPECT_NEAR(g[i], fd, 1e-4 + 1e-3 * std::fabs(fd)) << "hidden " << hidden << " param " << i;
  }
}

TEST(RouteClassifier, GradientMatchesFiniteDifferences) {
  CheckGradient(0);
  CheckGradient(4);
}

TEST(RouteClassifier, LossIsBinaryCrossEntropy) {
  RouteClassifier clf(2, 0, 1);
  clf.params() = {1.f, -2.f, 0.5f};  // z = x0 - 2 x1 + 0.5
  const std::vector<float> xs = {1, 1, 0, -1};
  const std::vector<float> ys = {1, 0};
  const double z0 = -0.5, z1 = 2.5;
  const double want = 0.5 * (-std::log(1 / (1 + std::exp(-z0))) - std::log(1 - 1 / (1 + std::exp(-z1))));
  EXPECT_NEAR(clf.Loss(xs, ys, nullptr, nullptr), want, 1e-9);
}

// Points in 6 dimensions labelled by a hyperplane (with a margin), or the
// same labels shuffled.
void MakeSet(uint64_t seed, int n, bool shuffle, std::vector<std::vector<float>>* x, std::vector<int>* y) {
  Rng rng(seed);
  const float w[6] = {1.f, -1.f, 0.5f, 2.f, 0.f, -0.5f};
  while (static_cast<int>(x->size()) < n) {
    std::vector<float> p(6);
    for (float& v : p) v = rng.Normal();
    double s = 0.3;
    for (int i = 0; i < 6; ++i) s += w[i] * p[i];
    if (std::fabs(s) < 0.3) continue;
    x->push_back(p);
    y->push_back(s > 0);
  }
  if (shuffle)
    for (size_t i = y->size(); i > 1; --i) std::swap((*y)[i - 1], (*y)[rng.Below(i)]);
}

double Accuracy(const RouteClassifier& c, const std::vector<std::vector<float>>& x, const std::vector<int>& y) {
  int ok = 0;
  for (size_t i = 0; i < x.size(); ++i) ok += (c.Probability(x[i].data()) >= 0.5) == (y[i] != 0);
  return double(ok) / x.size();
}

TEST(RouteClassifier, LearnsASeparableSetButNotShuffledLabels) {
  for (int hidden : {0, 16}) {
    std::vector<std::vector<float>> x, xt;
    std::vector<int> y, yt;
    MakeSet(1, 300, false, &x, &y);
    MakeSet(2, 300, false, &xt, &yt);
    TrainOptions opt;
    opt.hidden = hidden;
    if (hidden == 0) opt.steps = 1500, opt.lr = 0.03;  // a linear model needs longer to reach the margin
    double loss = 0;
    const RouteClassifier c = TrainClassifier(x, y, opt, &loss);
    EXPECT_GE(Accuracy(c, x, y), 0.99) << hidden;
    EXPECT_GE(Accuracy(c, xt, yt), 0.97) << hidden;  // generalises

    std::vector<std::vector<float>> xs, xst;
    std::vector<int> ys, yst;
    MakeSet(1, 300, true, &xs, &ys);
    MakeSet(2, 300, true, &xst, &yst);
    const RouteClassifier s = TrainClassifier(xs, ys, opt, &loss);
    EXPECT_LE(Accuracy(s, xst, yst), 0.65) << hidden;  // nothing to learn: chance on new points
  }
}

TEST(Calibration, BudgetMatchesBruteForce) {
  Rng rng(5);
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 1 + static_cast<int>(rng.Below(40));
    std::vector<double> p(n);
    for (double& v : p) v = static_cast<double>(rng.Below(8)) / 8;  // many ties
    const double budget = rng.Uniform();
    const double t = ThresholdForBudget(p, budget);
    const int64_t k = static_cast<int64_t>(std::floor(budget * n + 1e-9));
    auto count = [&](double th) {
      int64_t c = 0;
      for (double v : p) c += v >= th;
      return c;
    };
    EXPECT_LE(count(t), k);
    // Brute force: the smallest candidate (a score or +inf) within budget.
    double best = std::numeric_limits<double>::infinity();
    for (double c : p)
      if (count(c) <= k) best = std::min(best, c);
    EXPECT_EQ(t, best) << "trial " << trial;
  }
  EXPECT_EQ(ThresholdForBudget({0.9, 0.1}, 1.0), 0.1);
  EXPECT_TRUE(std::isinf(ThresholdForBudget({0.9, 0.1}, 0.0)));
}

TEST(Calibration, QualityMatchesBruteForce) {
  Rng rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 1 + static_cast<int>(rng.Below(30));
    std::vector<double> p(n), qe(n), qr(n);
    for (int i = 0; i < n; ++i) p[i] = rng.Below(6) / 6.0, qe[i] = rng.Below(2), qr[i] = rng.Below(3) / 2.0;
    const double target = rng.Uniform();
    bool reached = false;
    const double t = ThresholdForQuality(p, qe, qr, target, &reached);
    auto quality = [&](double th) {
      double s = 0;
      for (int i = 0; i < n; ++i) s += p[i] >= th ? qr[i] : qe[i];
      return s / n;
    };
    auto remote = [&](double th) {
      int c = 0;
      for (double v : p) c += v >= th;
      return c;
    };
    // Brute force over the candidates: the fewest remote prompts that reach the target.
    std::vector<double> cands = p;
    cands.push_back(std::numeric_limits<double>::infinity());
    int best_remote = n + 1;
    for (double c : cands)
      if (quality(c) >= target) best_remote = std::min(best_remote, remote(c));
    if (best_remote <= n) {
      EXPECT_TRUE(reached);
      EXPECT_GE(quality(t), target);
      // The curve adds prompts in score order, so its first share reaching the
      // target may be larger than the brute force's only when quality dips; never smaller.
      EXPECT_GE(remote(t), best_remote);
      double first = std::numeric_limits<double>::infinity();
      std::vector<double> sorted = cands;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      for (double c : sorted)
        if (quality(c) >= target) {
          first = c;
          break;
        }
      EXPECT_EQ(t, first);
    } else {
      EXPECT_FALSE(reached);
      EXPECT_EQ(t, 0.0);
    }
  }
}

TEST(Calibration, AccuracyMatchesBruteForce) {
  Rng rng(9);
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 1 + static_cast<int>(rng.Below(30));
    std::vector<double> p(n);
    std::vector<int> y(n);
    for (int i = 0; i < n; ++i) p[i] = rng.Below(7) / 7.0, y[i] = static_cast<int>(rng.Below(2));
    auto right = [&](double th) {
      int c = 0;
      for (int i = 0; i < n; ++i) c += (p[i] >= th) == (y[i] != 0);
      return c;
    };
    const double t = ThresholdForAccuracy(p, y);
    std::vector<double> cands = p;
    cands.push_back(std::numeric_limits<double>::infinity());
    int best = -1;
    double best_t = 0;
    for (double c : cands)
      if (right(c) > best || (right(c) == best && c > best_t)) best = right(c), best_t = c;
    EXPECT_EQ(right(t), best) << trial;
    EXPECT_EQ(t, best_t) << trial;
  }
}

TEST(Verdict, MarginAndPii) {
  EXPECT_EQ(Verdict(0.5, 0.54, false, 0.05), "edge");
  EXPECT_EQ(Verdict(0.5, 0.56, false, 0.05), "cloud");
  EXPECT_EQ(Verdict(0.5, 0.56, true, 0.05), "collaborative");
  EXPECT_EQ(Verdict(1.0, 0.0, true, 0.05), "edge");
  EXPECT_NEAR(RubricQuality({std::log(0.5f), std::log(0.125f)}), 0.25, 1e-6);  // geometric mean
  EXPECT_EQ(RubricQuality({}), 0.0);
}

// A tiny edge model and tokenizer for the Router's own tests.
class RouterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("router");
    std::vector<std::string> docs;
    for (int i = 0; i < 40; ++i)
      docs.push_back("12+" + std::to_string(i) + "=" + std::to_string(12 + i) + "\nthe quarterly report says hello world " +
                     std::to_string(i * 7) + "\ndef f(x):\n    return x + " + std::to_string(i) + "\n");
    ASSERT_TRUE(Tokenizer::Train(docs, dir_->path() + "/tok", 300).ok());
    auto tok = Tokenizer::Load(dir_->path() + "/tok.model");
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    tok_ = new Tokenizer(std::move(tok.value()));
    ModelConfig c;
    c.vocab_size = 320; c.d_model = 16; c.n_layers = 2; c.n_heads = 2; c.n_kv_heads = 1; c.d_ff = 32;
    c.n_dense_layers = 1; c.n_routed_experts = 4; c.n_shared_experts = 1; c.top_k = 2; c.d_expert = 16;
    c.score_func = "sigmoid"; c.max_seq_len = 64; c.init_std = 0.2;
    model_ = new Model(c);
    model_->InitWeights(3);
  }
  static void TearDownTestSuite() {
    delete model_;
    delete tok_;
    delete dir_;
  }
  static RouterModel RandomRouter(const std::vector<RouteFeatures>& fs) {
    RouterModel m;
    m.embedding_dim = 16;
    m.edge_vocab_size = 320, m.edge_d_model = 16, m.edge_n_layers = 2;
    std::vector<std::vector<float>> rows;
    for (const auto& f : fs) rows.push_back(FeatureVector(f));
    m.standardiser = Standardiser::Fit(rows);
    m.classifier = RouteClassifier(static_cast<int>(rows[0].size()), 8, 9);
    std::vector<double> p;
    for (const auto& f : fs) p.push_back(m.PRemote(f));
    m.threshold = ThresholdForBudget(p, 0.5);
    m.knob = "cloud_budget=0.5";
    return m;
  }
  static TempDir* dir_;
  static Tokenizer* tok_;
  static Model* model_;
};
TempDir* RouterTest::dir_ = nullptr;
Tokenizer* RouterTest::tok_ = nullptr;
Model* RouterTest::model_ = nullptr;

const std::vector<std::string> kPrompts = {"12+7=", "def f(x):\n    return", "hello world", "the report",
                                           "a much longer prompt about the quarterly report and its revenue",
                                           "3*4-2=", "你好", ""};

TEST_F(RouterTest, FeaturesAreDeterministicAndBounded) {
  FeatureExtractor fx(*model_, *tok_, {8, 3});
  for (const std::string& p : kPrompts) {
    const RouteFeatures a = fx.Extract(p, false), b = fx.Extract(p, true);
    ASSERT_EQ(a.embedding.size(), 16u);
    EXPECT_EQ(a.embedding, b.embedding);
    EXPECT_FALSE(a.pii);
    EXPECT_TRUE(b.pii);
    EXPECT_GE(a.probe_entropy, 0);
    EXPECT_LE(a.probe_entropy, std::log(320.0) + 1e-6);
    EXPECT_GE(a.probe_max_prob, 1.0 / 320 - 1e-9);
    EXPECT_LE(a.probe_max_prob, 1.0 + 1e-9);
    EXPECT_EQ(a.domain, ClassifyDomain(p));
    EXPECT_EQ(FeatureVector(a).size(), FeatureNames(16).size());
  }
  // Truncation: prompts equal in their first 8 tokens share the embedding.
  std::string base;
  for (int i = 0; i < 4; ++i) base += "the quarterly report says hello world 12+7=19 ";
  EXPECT_EQ(fx.Extract(base + " one", false).embedding, fx.Extract(base + " two two", false).embedding);
  EXPECT_NE(fx.Extract("12+7=", false).embedding, fx.Extract("hello world", false).embedding);
}

TEST_F(RouterTest, SaveLoadRoundTripGivesIdenticalDecisions) {
  FeatureExtractor fx(*model_, *tok_);
  std::vector<RouteFeatures> fs;
  for (const std::string& p : kPrompts) fs.push_back(fx.Extract(p, false));
  const RouterModel m = RandomRouter(fs);
  const std::string path = dir_->path() + "/router.json";
  ASSERT_TRUE(m.Save(path).ok());
  PiiFn pii = [](const std::string& p) { return p.find("report") != std::string::npos; };
  Router direct(m, *model_, *tok_, pii);
  Result<Router> loaded = Router::Load(path, *model_, *tok_, pii);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  int remote = 0;
  for (const std::string& p : kPrompts) {
    const RouteDecision a = direct.Decide(p), b = loaded->Decide(p);
    EXPECT_EQ(a.route, b.route) << p;
    EXPECT_EQ(a.p_remote, b.p_remote) << p;
    EXPECT_EQ(a.pii, pii(p));
    EXPECT_EQ(a.route, Router::RouteOf(a.p_remote, m.threshold, a.pii));
    if (a.route != Route::kEdge) {
      ++remote;
      EXPECT_EQ(a.route, a.pii ? Route::kCollaborative : Route::kCloud);
    }
    EXPECT_GE(a.latency_ms, 0);
  }
  EXPECT_LE(remote, static_cast<int>(kPrompts.size()) / 2);  // the budget, on the same prompts
  EXPECT_EQ(Router::RouteOf(0.2, 0.5, true), Route::kEdge);
  EXPECT_EQ(Router::RouteOf(0.5, 0.5, true), Route::kCollaborative);
  EXPECT_EQ(Router::RouteOf(0.9, 0.5, false), Route::kCloud);
}

TEST_F(RouterTest, LoadRefusesMalformedFilesAndOtherModels) {
  FeatureExtractor fx(*model_, *tok_);
  std::vector<RouteFeatures> fs;
  for (const std::string& p : kPrompts) fs.push_back(fx.Extract(p, false));
  const RouterModel m = RandomRouter(fs);
  auto refused = [&](const nlohmann::json& j, const std::string& want) {
    const std::string path = dir_->path() + "/bad.json";
    ASSERT_TRUE(WriteFileAtomic(Env::Default(), path, j.dump()).ok());
    Result<Router> r = Router::Load(path, *model_, *tok_, nullptr);
    ASSERT_FALSE(r.ok()) << want;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
  };
  nlohmann::json j = m.ToJson();
  j["classifier"]["params"].erase(0);
  refused(j, "classifier.params");
  j = m.ToJson();
  j["standardise"]["std"][0] = 0;
  refused(j, "standardise.std");
  j = m.ToJson();
  j.erase("threshold");
  refused(j, "threshold");
  j = m.ToJson();
  j["format"] = "other";
  refused(j, "format");
  j = m.ToJson();
  j["edge"]["vocab_size"] = 999;
  refused(j, "trained for an edge model of vocab 999");
  Result<Router> missing = Router::Load(dir_->path() + "/nope.json", *model_, *tok_, nullptr);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope.json: cannot read"), std::string::npos);
}

TEST_F(RouterTest, DecideIsThreadSafe) {
  FeatureExtractor fx(*model_, *tok_);
  std::vector<RouteFeatures> fs;
  for (const std::string& p : kPrompts) fs.push_back(fx.Extract(p, false));
  const Router router(RandomRouter(fs), *model_, *tok_, nullptr);
  std::vector<double> serial;
  for (const std::string& p : kPrompts) serial.push_back(router.Decide(p).p_remote);
  std::vector<std::vector<double>> got(4);
  std::vector<std::thread> pool;
  for (int t = 0; t < 4; ++t)
    pool.emplace_back([&, t] {
      for (int rep = 0; rep < 5; ++rep)
        for (const std::string& p : kPrompts) got[t].push_back(router.Decide(p).p_remote);
    });
  for (auto& th : pool) th.join();
  for (int t = 0; t < 4; ++t)
    for (size_t i = 0; i < got[t].size(); ++i) EXPECT_EQ(got[t][i], serial[i % kPrompts.size()]) << t << " " << i;
}

// The judge on the tiny model as both edge and cloud: answers equal a greedy
// decode with an InferenceSession (the oracle), the same model gives equal
// qualities (verdict edge), and the hooks: prompts the detector flags get
// the collaborative hook's answer, which is judged like any other.
TEST_F(RouterTest, JudgeAnswersGreedilyAndUsesTheHooks) {
  std::vector<RoutePrompt> prompts;
  rl::RewardSpec spec;
  spec.answer = "19";
  prompts.push_back({"a", "arithmetic", "train", "12+7=", spec, 1});
  prompts.push_back({"b", "chat", "train", "hello world", std::nullopt, 0});
  prompts.push_back({"c", "business", "held_out", "the quarterly report says", std::nullopt, 0});
  JudgeModel m{model_, tok_, TextConventions::For(*tok_)};
  JudgeOptions opt;
  opt.max_tokens = 6;
  opt.pii = [](const std::string& p) { return p.find("report") != std::string::npos; };
  int asked = 0;
  opt.collaborative = [&](const std::string& p, const AskCloudFn& ask) -> Result<std::string> {
    ++asked;
    Result<std::string> a = ask("[redacted] " + p.substr(p.size() - 4));
    if (!a.ok()) return a.status();
    return std::string("restored:") + a.value();
  };
  auto recs = JudgePrompts(m, m, prompts, opt, nullptr);
  ASSERT_TRUE(recs.ok()) << recs.status().message();
  ASSERT_EQ(recs->size(), 3u);
  EXPECT_EQ(asked, 1);
  // The oracle: greedy decoding, stopped at a newline or a stop id.
  auto greedy = [&](const std::string& p) {
    std::vector<int32_t> ids = m.text.prompt_prefix;
    tok_->EncodeTo(p, &ids);
    InferenceSession s(*model_, 64);
    const float* logits = s.Forward(ids.data(), static_cast<int64_t>(ids.size()));
    std::vector<int32_t> out;
    for (int k = 0; k < opt.max_tokens; ++k) {
      const int32_t t = static_cast<int32_t>(std::max_element(logits, logits + 320) - logits);
      if (m.text.IsStop(t)) break;
      out.push_back(t);
      if (tok_->Decode(out).find('\n') != std::string::npos) break;
      logits = s.Forward(&t, 1);
    }
    std::string text = tok_->Decode(out);
    if (const size_t nl = text.find('\n'); nl != std::string::npos) text.resize(nl);
    return text;
  };
  for (const RouteRecord& r : *recs) {
    EXPECT_EQ(r.edge_answer, greedy(r.prompt.prompt)) << r.prompt.id;
    EXPECT_EQ(r.features.embedding.size(), 16u);
    EXPECT_EQ(r.edge_model["d_model"], 16);
  }
  const RouteRecord &a = (*recs)[0], &b = (*recs)[1], &c = (*recs)[2];
  EXPECT_EQ(a.judged_by, "verifier");
  EXPECT_EQ(a.q_edge, a.edge_answer == "19" ? 1.0 : 0.0);
  EXPECT_EQ(b.judged_by, "rubric");
  EXPECT_EQ(a.remote_answer, a.edge_answer);  // the same model
  EXPECT_NEAR(b.q_edge, b.q_remote, 1e-5);  // (batched at different positions: not bitwise)
  // The rubric's oracle: the session's log-softmax of each answer token after
  // "Question: <prompt>\nAnswer:", averaged, exp'd.
  ASSERT_FALSE(b.edge_answer.empty()) << "the tiny model answers hello world with something";
  {
    std::vector<int32_t> ids = m.text.prompt_prefix;
    for (const std::string& part : {std::string("Question: "), b.prompt.prompt, std::string("\nAnswer:")})
      tok_->EncodeTo(part, &ids);
    const size_t at = ids.size();
    tok_->EncodeTo(" " + b.edge_answer, &ids);
    InferenceSession s(*model_, 64);
    const float* logits = s.ForwardAll(ids.data(), static_cast<int64_t>(ids.size()));
    double sum = 0;
    for (size_t j = at; j < ids.size(); ++j) {
      const float* row = logits + (j - 1) * 320;
      const float mx = *std::max_element(row, row + 320);
      double z = 0;
      for (int v = 0; v < 320; ++v) z += std::exp(static_cast<double>(row[v]) - mx);
      sum += row[ids[j]] - mx - std::log(z);
    }
    EXPECT_NEAR(b.q_edge, std::exp(sum / (ids.size() - at)), 1e-4 * b.q_edge + 1e-7);
  }
  EXPECT_EQ(a.verdict, "edge");
  EXPECT_EQ(b.verdict, "edge");
  EXPECT_FALSE(a.pii);
  EXPECT_TRUE(c.pii);
  EXPECT_TRUE(c.features.pii);
  EXPECT_EQ(c.remote_answer, "restored:" + greedy("[redacted] says"));
  EXPECT_EQ(c.verdict, Verdict(c.q_edge, c.q_remote, true, opt.margin));
  EXPECT_GE(b.q_edge, 0);
  EXPECT_LE(b.q_edge, 1);
}

}  // namespace
}  // namespace myriad::edge

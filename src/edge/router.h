// The router: features the device computes before answering (the edge
// model's view of the prompt), a small classifier trained on the judge's
// verdicts that predicts p(remote needed), a threshold calibrated to a
// cloud budget or a quality floor, and Router, the RoutePolicy the edge
// front asks. docs/edge.md ("Router").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "data/text_conventions.h"
#include "data/tokenizer.h"
#include "edge/route.h"
#include "edge/route_data.h"
#include "model/model.h"

namespace myriad::edge {

// Does the prompt hold private values? (the redactor's Detect, non-empty).
// Must be thread-safe. Null means "never".
using PiiFn = std::function<bool(const std::string& prompt)>;

struct FeatureSpec {
  int max_prompt_tokens = 96;  // the embedding reads the prompt's first tokens only
  int probe_tokens = 3;        // next-token distributions the uncertainty is averaged over
  // OpenMP threads of the calling thread while it extracts (restored after;
  // 0: leave as is). One by default: the work is a few small matrices, and
  // on a busy device a thread team stalls the request for tens of ms.
  int threads = 1;
};

// The edge model's features of a prompt. Thread-safe: every call runs its
// own InferenceSession (the weights are read in place, never written).
// `model` and `tok` must outlive it.
class FeatureExtractor {
 public:
  FeatureExtractor(const Model& model, const Tokenizer& tok, FeatureSpec spec = {});
  RouteFeatures Extract(const std::string& prompt, bool pii) const;
  const FeatureSpec& spec() const { return spec_; }

 private:
  const Model& model_;
  const Tokenizer& tok_;
  TextConventions text_;
  FeatureSpec spec_;
};

// The classifier's input: [embedding..., log(1 + prompt tokens), probe
// entropy, probe max prob, domain one-hot (kRouteDomains), pii]. Names
// "emb0".. for the embedding, then "log_len", "entropy", "max_prob",
// "dom_chat", .., "pii".
std::vector<float> FeatureVector(const RouteFeatures& f);
std::vector<std::string> FeatureNames(int embedding_dim);

// p = sigmoid(z) on standardised x: with hidden > 0 a one-hidden-layer MLP,
// z = w2 . tanh(W1 x + b1) + b2; with hidden == 0 logistic regression,
// z = w2 . x + b2. Parameters are one flat vector (for AdamW).
class RouteClassifier {
 public:
  RouteClassifier() = default;
  RouteClassifier(int inputs, int hidden, uint64_t seed);
  int inputs() const { return inputs_; }
  int hidden() const { return hidden_; }
  // Layout: W1 [hidden, inputs], b1 [hidden], w2 [hidden or inputs], b2 [1].
  std::vector<float>& params() { return params_; }
  const std::vector<float>& params() const { return params_; }
  double Logit(const float* x) const;  // x: standardised, [inputs]
  double Probability(const float* x) const;
  // Mean binary cross-entropy over the rows of xs [n, inputs] with labels
  // ys (0/1, weights w per row, null: 1); with `grad` (sized as params)
  // also its gradient, written over grad.
  double Loss(const std::vector<float>& xs, const std::vector<float>& ys, const std::vector<float>* w,
              std::vector<float>* grad) const;

 private:
  int inputs_ = 0, hidden_ = 0;
  std::vector<float> params_;
};

struct TrainOptions {
  int hidden = 16;
  int steps = 400;  // full-batch AdamW steps
  double lr = 3e-3, weight_decay = 0.1;
  bool balance = true;  // weight classes to equal total weight
  uint64_t seed = 1;
};

// Standardisation over training rows: (x - mean) / std, std floored at 1e-6 -> 1.
struct Standardiser {
  std::vector<float> mean, std;
  static Standardiser Fit(const std::vector<std::vector<float>>& rows);
  std::vector<float> Apply(const std::vector<float>& x) const;
};

// Trains on rows (raw feature vectors) and labels; returns the classifier
// and the loss after training.
RouteClassifier TrainClassifier(const std::vector<std::vector<float>>& standardised_rows,
                                const std::vector<int>& labels, const TrainOptions& opt, double* final_loss);

// Threshold calibration: routing remote iff p >= threshold.
// At most `budget` of the prompts routed remote: the smallest threshold
// among the scores (and +inf) with count(p >= t) <= floor(budget * n).
double ThresholdForBudget(const std::vector<double>& p, double budget);
// The lowest remote share whose mean quality (remote answer where p >= t,
// edge answer otherwise) reaches min_quality: the largest such t. When no
// share reaches it, everything is routed remote (t = 0) and *reached = false.
double ThresholdForQuality(const std::vector<double>& p, const std::vector<double>& q_edge,
                           const std::vector<double>& q_remote, double min_quality, bool* reached);

// The threshold with the most train prompts routed as their labels say
// (remote iff label 1); among equals the largest (fewest remote).
double ThresholdForAccuracy(const std::vector<double>& p, const std::vector<int>& labels);

// What router.json holds.
struct RouterModel {
  FeatureSpec spec;
  int embedding_dim = 0;
  Standardiser standardiser;
  RouteClassifier classifier;
  double threshold = 0.5;
  std::string knob;       // "cloud_budget=0.3", "min_quality=0.6" or "max_accuracy"
  int64_t edge_vocab_size = 0, edge_d_model = 0, edge_n_layers = 0;
  std::string edge_path;  // the checkpoint the features were computed with (informative)
  double PRemote(const RouteFeatures& f) const;
  nlohmann::json ToJson() const;
  // Refuses a malformed file with one line naming the field.
  static Result<RouterModel> FromJson(const nlohmann::json& j);
  Status Save(const std::string& path) const;
  static Result<RouterModel> Load(const std::string& path);
};

// The trained router on the device. Thread-safe (features: a session per
// call; the classifier is read-only).
class Router : public RoutePolicy {
 public:
  // Refuses an edge model whose vocabulary, width or depth differ from the
  // one the router was trained with.
  static Result<Router> Load(const std::string& path, const Model& edge, const Tokenizer& tok, PiiFn pii);
  Router(RouterModel m, const Model& edge, const Tokenizer& tok, PiiFn pii);
  RouteDecision Decide(const std::string& prompt_text) const override;
  // The route of precomputed features (no model run): p < threshold -> edge,
  // else collaborative if pii, else cloud.
  static Route RouteOf(double p_remote, double threshold, bool pii);
  const RouterModel& model() const { return model_; }

 private:
  RouterModel model_;
  std::unique_ptr<FeatureExtractor> features_;
  PiiFn pii_;
};

}  // namespace myriad::edge

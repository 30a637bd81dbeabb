#include "edge/router.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>

#include <omp.h>

#include "core/env.h"
#include "core/rng.h"
#include "model/inference.h"
#include "train/optim.h"

namespace myriad::edge {

// ---- features ----

FeatureExtractor::FeatureExtractor(const Model& model, const Tokenizer& tok, FeatureSpec spec)
    : model_(model), tok_(tok), text_(TextConventions::For(tok)), spec_(spec) {}

namespace {
// omp_set_num_threads sets the calling thread's own setting: scoped here.
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int n) : saved_(omp_get_max_threads()), set_(n > 0) {
    if (set_) omp_set_num_threads(n);
  }
  ~ScopedOmpThreads() {
    if (set_) omp_set_num_threads(saved_);
  }

 private:
  int saved_;
  bool set_;
};
}  // namespace

RouteFeatures FeatureExtractor::Extract(const std::string& prompt, bool pii) const {
  const ScopedOmpThreads threads(spec_.threads);
  RouteFeatures f;
  f.domain = ClassifyDomain(prompt);
  f.pii = pii;
  const ModelConfig& cfg = model_.config();
  const int64_t C = cfg.d_model, V = cfg.vocab_size;
  std::vector<int32_t> ids = text_.prompt_prefix;
  tok_.EncodeTo(prompt, &ids);
  f.prompt_tokens = static_cast<int64_t>(ids.size() - text_.prompt_prefix.size());
  const int probe = std::max(1, spec_.probe_tokens);
  const int64_t cap = std::max<int64_t>(1, std::min<int64_t>(spec_.max_prompt_tokens, cfg.max_seq_len - probe));
  if (static_cast<int64_t>(ids.size()) > cap) ids.resize(cap);
  if (ids.empty()) ids.push_back(0);
  const int64_t n = static_cast<int64_t>(ids.size());
  InferenceSession session(model_, n + probe);
  std::vector<float> hidden(n * C);
  const float* logits = session.Forward(ids.data(), n, hidden.data());
  f.embedding.assign(C, 0.f);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < C; ++c) f.embedding[c] += hidden[i * C + c] / static_cast<float>(n);
  double entropy = 0, max_prob = 0;
  for (int j = 0; j < probe; ++j) {
    float mx = logits[0];
    int32_t arg = 0;
    for (int64_t v = 1; v < V; ++v)
      if (logits[v] > mx) mx = logits[v], arg = static_cast<int32_t>(v);
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(logits[v]) - mx);
    double h = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double p = std::exp(static_cast<double>(logits[v]) - mx) / z;
      if (p > 0) h -= p * std::log(p);
    }
    entropy += h, max_prob += 1.0 / z;
    if (j + 1 < probe) logits = session.Forward(&arg, 1);
  }
  f.probe_entropy = entropy / probe;
  f.probe_max_prob = max_prob / probe;
  return f;
}

std::vector<float> FeatureVector(const RouteFeatures& f) {
  std::vector<float> x = f.embedding;
  x.push_back(static_cast<float>(std::log1p(static_cast<double>(f.prompt_tokens))));
  x.push_back(static_cast<float>(f.probe_entropy));
  x.push_back(static_cast<float>(f.probe_max_prob));
  const int d = RouteDomainIndex(f.domain);
  for (int i = 0; i < kNumRouteDomains; ++i) x.push_back(i == d ? 1.f : 0.f);
  x.push_back(f.pii ? 1.f : 0.f);
  return x;
}

std::vector<std::string> FeatureNames(int embedding_dim) {
  std::vector<std::string> names;
  for (int i = 0; i < embedding_dim; ++i) names.push_back("emb" + std::to_string(i));
  for (const char* n : {"log_len", "entropy", "max_prob"}) names.push_back(n);
  for (const char* d : kRouteDomains) names.push_back(std::string("dom_") + d);
  names.push_back("pii");
  return names;
}

// ---- classifier ----

RouteClassifier::RouteClassifier(int inputs, int hidden, uint64_t seed) : inputs_(inputs), hidden_(hidden) {
  const int64_t n = hidden > 0 ? int64_t{hidden} * inputs + hidden + hidden + 1 : int64_t{inputs} + 1;
  params_.assign(n, 0.f);
  Rng rng(seed);
  if (hidden > 0) {
    const float s1 = 1.f / std::sqrt(static_cast<float>(std::max(1, inputs)));
    for (int64_t i = 0; i < int64_t{hidden} * inputs; ++i) params_[i] = rng.Normal() * s1;
    const float s2 = 1.f / std::sqrt(static_cast<float>(hidden));
    for (int k = 0; k < hidden; ++k) params_[int64_t{hidden} * inputs + hidden + k] = rng.Normal() * s2;
  }
}

double RouteClassifier::Logit(const float* x) const {
  const int I = inputs_, H = hidden_;
  if (H == 0) {
    double z = params_[I];
    for (int i = 0; i < I; ++i) z += static_cast<double>(params_[i]) * x[i];
    return z;
  }
  const float* W1 = params_.data();
  const float* b1 = W1 + int64_t{H} * I;
  const float* w2 = b1 + H;
  double z = w2[H];
  for (int k = 0; k < H; ++k) {
    double a = b1[k];
    for (int i = 0; i < I; ++i) a += static_cast<double>(W1[int64_t{k} * I + i]) * x[i];
    z += w2[k] * std::tanh(a);
  }
  return z;
}

double RouteClassifier::Probability(const float* x) const { return 1.0 / (1.0 + std::exp(-Logit(x))); }

namespace {
double Softplus(double z) { return z > 0 ? z + std::log1p(std::exp(-z)) : std::log1p(std::exp(z)); }
}  // namespace

double RouteClassifier::Loss(const std::vector<float>& xs, const std::vector<float>& ys,
                             const std::vector<float>* w, std::vector<float>* grad) const {
  const int I = inputs_, H = hidden_;
  const int64_t n = static_cast<int64_t>(ys.size());
  std::vector<double> g(params_.size(), 0.0);
  double loss = 0, wsum = 0;
  std::vector<double> act(H);
  for (int64_t r = 0; r < n; ++r) {
    const float* x = xs.data() + r * I;
    const double wr = w ? (*w)[r] : 1.0;
    wsum += wr;
    double z;
    if (H == 0) {
      z = Logit(x);
    } else {
      const float* W1 = params_.data();
      const float* b1 = W1 + int64_t{H} * I;
      const float* w2 = b1 + H;
      z = w2[H];
      for (int k = 0; k < H; ++k) {
        double a = b1[k];
        for (int i = 0; i < I; ++i) a += static_cast<double>(W1[int64_t{k} * I + i]) * x[i];
        act[k] = std::tanh(a);
        z += w2[k] * act[k];
      }
    }
    // loss = softplus(z) - y z; dloss/dz = sigmoid(z) - y.
    loss += wr * (Softplus(z) - ys[r] * z);
    if (!grad) continue;
    const double dz = wr * (1.0 / (1.0 + std::exp(-z)) - ys[r]);
    if (H == 0) {
      for (int i = 0; i < I; ++i) g[i] += dz * x[i];
      g[I] += dz;
    } else {
      const float* w2 = params_.data() + int64_t{H} * I + H;
      const int64_t b1o = int64_t{H} * I, w2o = b1o + H;
      for (int k = 0; k < H; ++k) {
        g[w2o + k] += dz * act[k];
        const double da = dz * w2[k] * (1.0 - act[k] * act[k]);
        g[b1o + k] += da;
        for (int i = 0; i < I; ++i) g[int64_t{k} * I + i] += da * x[i];
      }
      g[w2o + H] += dz;
    }
  }
  const double norm = wsum > 0 ? wsum : 1.0;
  if (grad) {
    grad->resize(params_.size());
    for (size_t i = 0; i < g.size(); ++i) (*grad)[i] = static_cast<float>(g[i] / norm);
  }
  return loss / norm;
}

Standardiser Standardiser::Fit(const std::vector<std::vector<float>>& rows) {
  Standardiser s;
  if (rows.empty()) return s;
  const size_t d = rows[0].size();
  std::vector<double> mean(d, 0), var(d, 0);
  for (const auto& r : rows)
    for (size_t i = 0; i < d; ++i) mean[i] += r[i];
  for (double& m : mean) m /= rows.size();
  for (const auto& r : rows)
    for (size_t i = 0; i < d; ++i) var[i] += (r[i] - mean[i]) * (r[i] - mean[i]);
  for (size_t i = 0; i < d; ++i) {
    s.mean.push_back(static_cast<float>(mean[i]));
    const double sd = std::sqrt(var[i] / rows.size());
    s.std.push_back(sd < 1e-6 ? 1.f : static_cast<float>(sd));
  }
  return s;
}

std::vector<float> Standardiser::Apply(const std::vector<float>& x) const {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = i < mean.size() ? (x[i] - mean[i]) / std[i] : x[i];
  return out;
}

RouteClassifier TrainClassifier(const std::vector<std::vector<float>>& rows, const std::vector<int>& labels,
                                const TrainOptions& opt, double* final_loss) {
  const int I = rows.empty() ? 0 : static_cast<int>(rows[0].size());
  RouteClassifier clf(I, opt.hidden, opt.seed);
  std::vector<float> xs, ys, w;
  int64_t pos = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    xs.insert(xs.end(), rows[r].begin(), rows[r].end());
    ys.push_back(labels[r] ? 1.f : 0.f);
    pos += labels[r] != 0;
  }
  const int64_t n = static_cast<int64_t>(rows.size()), neg = n - pos;
  for (size_t r = 0; r < rows.size(); ++r)
    w.push_back(!opt.balance || pos == 0 || neg == 0 ? 1.f
                                                     : static_cast<float>(0.5 * n / (labels[r] ? pos : neg)));
  OptimConfig oc;
  oc.lr = opt.lr, oc.min_lr = opt.lr * 0.1, oc.warmup_steps = 0, oc.steps = opt.steps;
  oc.weight_decay = opt.weight_decay, oc.beta1 = 0.9, oc.beta2 = 0.999, oc.grad_clip = 0;
  std::vector<float>& p = clf.params();
  std::vector<float> g(p.size()), m(p.size(), 0.f), v(p.size(), 0.f);
  double loss = 0;
  for (int64_t s = 1; s <= opt.steps && n > 0; ++s) {
    loss = clf.Loss(xs, ys, &w, &g);
    AdamWUpdate(oc, s, LearningRate(oc, s), 1.0, true, static_cast<int64_t>(p.size()), p.data(), g.data(),
                m.data(), v.data());
  }
  if (final_loss) *final_loss = n > 0 ? clf.Loss(xs, ys, &w, nullptr) : loss;
  return clf;
}

// ---- calibration ----

double ThresholdForBudget(const std::vector<double>& p, double budget) {
  std::vector<double> s = p;
  std::sort(s.begin(), s.end(), std::greater<>());
  const int64_t k = static_cast<int64_t>(std::floor(std::clamp(budget, 0.0, 1.0) * s.size() + 1e-9));
  double t = std::numeric_limits<double>::infinity();
  // Walk down the distinct scores while the count at or above stays <= k.
  for (size_t i = 0; i < s.size();) {
    size_t j = i;
    while (j < s.size() && s[j] == s[i]) ++j;  // [i, j): ties of s[i]
    if (static_cast<int64_t>(j) > k) break;
    t = s[i];
    i = j;
  }
  return t;
}

double ThresholdForQuality(const std::vector<double>& p, const std::vector<double>& q_edge,
                           const std::vector<double>& q_remote, double min_quality, bool* reached) {
  const size_t n = p.size();
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
  double sum = 0;
  for (double q : q_edge) sum += q;
  if (reached) *reached = true;
  if (n == 0 || sum / n >= min_quality) return std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && p[order[j]] == p[order[i]]) sum += q_remote[order[j]] - q_edge[order[j]], ++j;
    if (sum / n >= min_quality) return p[order[i]];
    i = j;
  }
  if (reached) *reached = false;
  return 0.0;
}

double ThresholdForAccuracy(const std::vector<double>& p, const std::vector<int>& labels) {
  const size_t n = p.size();
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
  // Threshold +inf: every prompt edge, right on the label-0 ones.
  int64_t right = 0;
  for (int y : labels) right += y == 0;
  int64_t best = right;
  double t = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < n;) {
    size_t j = i;
    for (; j < n && p[order[j]] == p[order[i]]; ++j) right += labels[order[j]] ? 1 : -1;
    if (right > best) best = right, t = p[order[i]];
    i = j;
  }
  return t;
}

// ---- router.json ----

double RouterModel::PRemote(const RouteFeatures& f) const {
  const std::vector<float> x = standardiser.Apply(FeatureVector(f));
  if (static_cast<int>(x.size()) != classifier.inputs()) return 1.0;  // cannot judge: ask the cloud
  return classifier.Probability(x.data());
}

nlohmann::json RouterModel::ToJson() const {
  nlohmann::json j;
  j["format"] = "myriad-router-1";
  j["features"] = {{"names", FeatureNames(embedding_dim)},
                   {"embedding_dim", embedding_dim},
                   {"max_prompt_tokens", spec.max_prompt_tokens},
                   {"probe_tokens", spec.probe_tokens}};
  j["edge"] = {{"vocab_size", edge_vocab_size}, {"d_model", edge_d_model}, {"n_layers", edge_n_layers},
               {"path", edge_path}};
  j["standardise"] = {{"mean", standardiser.mean}, {"std", standardiser.std}};
  j["classifier"] = {{"inputs", classifier.inputs()}, {"hidden", classifier.hidden()}, {"params", classifier.params()}};
  j["threshold"] = std::isfinite(threshold) ? nlohmann::json(threshold) : nlohmann::json("inf");
  j["knob"] = knob;
  return j;
}

namespace {
Result<int64_t> IntAt(const nlohmann::json& j, const char* obj, const char* key) {
  if (!j.contains(obj) || !j[obj].is_object() || !j[obj].contains(key) || !j[obj][key].is_number_integer())
    return Status::Error(std::string(obj) + "." + key + ": expected an integer");
  return j[obj][key].get<int64_t>();
}
Result<std::vector<float>> FloatsAt(const nlohmann::json& j, const char* obj, const char* key) {
  if (!j.contains(obj) || !j[obj].is_object() || !j[obj].contains(key) || !j[obj][key].is_array())
    return Status::Error(std::string(obj) + "." + key + ": expected an array of numbers");
  std::vector<float> out;
  for (const auto& x : j[obj][key]) {
    if (!x.is_number()) return Status::Error(std::string(obj) + "." + key + ": expected an array of numbers");
    out.push_back(x.get<float>());
  }
  return out;
}
}  // namespace

Result<RouterModel> RouterModel::FromJson(const nlohmann::json& j) {
  if (!j.is_object() || j.value("format", "") != "myriad-router-1")
    return Status::Error("format: expected \"myriad-router-1\" (hint: write it with `myriad route train`)");
  RouterModel m;
  ASSIGN_OR_RETURN(int64_t dim, IntAt(j, "features", "embedding_dim"));
  ASSIGN_OR_RETURN(int64_t maxp, IntAt(j, "features", "max_prompt_tokens"));
  ASSIGN_OR_RETURN(int64_t probe, IntAt(j, "features", "probe_tokens"));
  if (dim < 0 || maxp < 1 || probe < 1 || probe > 16) return Status::Error("features: sizes out of range");
  m.embedding_dim = static_cast<int>(dim);
  m.spec.max_prompt_tokens = static_cast<int>(maxp);
  m.spec.probe_tokens = static_cast<int>(probe);
  ASSIGN_OR_RETURN(m.edge_vocab_size, IntAt(j, "edge", "vocab_size"));
  ASSIGN_OR_RETURN(m.edge_d_model, IntAt(j, "edge", "d_model"));
  ASSIGN_OR_RETURN(m.edge_n_layers, IntAt(j, "edge", "n_layers"));
  m.edge_path = j["edge"].value("path", "");
  ASSIGN_OR_RETURN(m.standardiser.mean, FloatsAt(j, "standardise", "mean"));
  ASSIGN_OR_RETURN(m.standardiser.std, FloatsAt(j, "standardise", "std"));
  ASSIGN_OR_RETURN(int64_t inputs, IntAt(j, "classifier", "inputs"));
  ASSIGN_OR_RETURN(int64_t hidden, IntAt(j, "classifier", "hidden"));
  ASSIGN_OR_RETURN(std::vector<float> params, FloatsAt(j, "classifier", "params"));
  const int64_t want_inputs = dim + 3 + kNumRouteDomains + 1;
  if (inputs != want_inputs)
    return Status::Error("classifier.inputs: " + std::to_string(inputs) + " for " + std::to_string(want_inputs) +
                         " features");
  if (hidden < 0 || hidden > 4096) return Status::Error("classifier.hidden: out of range");
  if (static_cast<int64_t>(m.standardiser.mean.size()) != inputs ||
      static_cast<int64_t>(m.standardiser.std.size()) != inputs)
    return Status::Error("standardise: " + std::to_string(m.standardiser.mean.size()) + " means for " +
                         std::to_string(inputs) + " features");
  for (float s : m.standardiser.std)
    if (!(s > 0)) return Status::Error("standardise.std: values must be > 0");
  m.classifier = RouteClassifier(static_cast<int>(inputs), static_cast<int>(hidden), 0);
  if (params.size() != m.classifier.params().size())
    return Status::Error("classifier.params: " + std::to_string(params.size()) + " values, expected " +
                         std::to_string(m.classifier.params().size()));
  m.classifier.params() = std::move(params);
  if (j.contains("threshold") && j["threshold"] == "inf") m.threshold = std::numeric_limits<double>::infinity();
  else if (j.contains("threshold") && j["threshold"].is_number()) m.threshold = j["threshold"].get<double>();
  else return Status::Error("threshold: expected a number");
  m.knob = j.value("knob", "");
  return m;
}

Status RouterModel::Save(const std::string& path) const {
  return WriteFileAtomic(Env::Default(), path, ToJson().dump(1) + "\n");
}

Result<RouterModel> RouterModel::Load(const std::string& path) {
  Result<std::string> body = Env::Default()->ReadFile(path);
  if (!body.ok()) return Status::Error(path + ": cannot read (hint: write it with `myriad route train`)");
  const nlohmann::json j = nlohmann::json::parse(body.value(), nullptr, false);
  if (j.is_discarded()) return Status::Error(path + ": not JSON");
  Result<RouterModel> m = FromJson(j);
  if (!m.ok()) return m.status().With(path);
  return m;
}

// ---- Router ----

Router::Router(RouterModel m, const Model& edge, const Tokenizer& tok, PiiFn pii)
    : model_(std::move(m)), features_(std::make_unique<FeatureExtractor>(edge, tok, model_.spec)), pii_(std::move(pii)) {}

Result<Router> Router::Load(const std::string& path, const Model& edge, const Tokenizer& tok, PiiFn pii) {
  ASSIGN_OR_RETURN(RouterModel m, RouterModel::Load(path));
  const ModelConfig& c = edge.config();
  if (c.vocab_size != m.edge_vocab_size || c.d_model != m.edge_d_model || c.n_layers != m.edge_n_layers ||
      c.d_model != m.embedding_dim)
    return Status::Error(path + ": trained for an edge model of vocab " + std::to_string(m.edge_vocab_size) +
                         ", d_model " + std::to_string(m.edge_d_model) + ", " + std::to_string(m.edge_n_layers) +
                         " layers; this one has vocab " + std::to_string(c.vocab_size) + ", d_model " +
                         std::to_string(c.d_model) + ", " + std::to_string(c.n_layers) + " layers");
  return Router(std::move(m), edge, tok, std::move(pii));
}

Route Router::RouteOf(double p_remote, double threshold, bool pii) {
  if (p_remote < threshold) return Route::kEdge;
  return pii ? Route::kCollaborative : Route::kCloud;
}

RouteDecision Router::Decide(const std::string& prompt_text) const {
  const auto t0 = std::chrono::steady_clock::now();
  const bool pii = pii_ ? pii_(prompt_text) : false;
  const RouteFeatures f = features_->Extract(prompt_text, pii);
  RouteDecision d;
  d.p_remote = model_.PRemote(f);
  d.pii = pii;
  d.domain = f.domain;
  d.route = RouteOf(d.p_remote, model_.threshold, pii);
  d.latency_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return d;
}

}  // namespace myriad::edge

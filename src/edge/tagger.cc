#include "edge/tagger.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/checksum.h"
#include "core/env.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "train/comm/local_comm.h"
#include "train/dist_train.h"

namespace myriad::edge {

namespace {

constexpr int kIgnore = -1;
constexpr const char* kFormat = "myriad-span-tagger";

// Full-width ASCII (U+FF01..U+FF5E) and the ideographic space fold to ASCII:
// the same character to the tagger in either width.
char32_t Fold(char32_t c) {
  if (c >= 0xFF01 && c <= 0xFF5E) return c - 0xFEE0;
  if (c == 0x3000) return U' ';
  return c;
}

int TypeTagBase(EntityType t) {
  switch (t) {
    case EntityType::kPerson: return 1;
    case EntityType::kAddress: return 3;
    case EntityType::kOrg: return 5;
    default: return 0;
  }
}

EntityType TagType(int tag) {
  return tag <= 2 ? EntityType::kPerson : tag <= 4 ? EntityType::kAddress : EntityType::kOrg;
}

ModelConfig MakeModelConfig(const TaggerConfig& c, int64_t vocab) {
  ModelConfig m;
  m.vocab_size = vocab;
  m.d_model = c.d_model;
  m.n_layers = c.n_layers;
  m.n_heads = c.n_heads;
  m.n_kv_heads = c.n_heads;
  m.d_ff = c.d_ff;
  m.n_dense_layers = c.n_layers;
  m.n_routed_experts = 0;
  m.n_shared_experts = 0;
  m.mtp_depth = 0;
  m.max_seq_len = c.window;
  m.init_std = 0.02;
  return m;
}

// BIO cross-entropy over the first kNumTags logits of each labelled row
// (labels [sequences, T], kIgnore where no character's tag is read), the
// mean over the batch's labelled rows. Without backward it records each
// row's tag probabilities instead (inference).
class BioObjective : public HeadObjective {
 public:
  BioObjective(const std::vector<int8_t>* labels, int64_t T, int64_t labelled) : labels_(labels), T_(T) {
    inv_ = labelled > 0 ? 1.0 / static_cast<double>(labelled) : 0.0;
  }
  // Recording: probs [sequences, T, kNumTags].
  BioObjective(std::vector<float>* probs, int64_t T) : probs_(probs), T_(T) {}

  double Apply(const Rows& rows, const float* logits, float* dlogits) override {
    double loss = 0;
    for (int64_t r = 0; r < rows.n; ++r) {
      const int64_t at = rows.seq[r] * T_ + rows.pos[r];
      if (probs_) {
        (void)TagCrossEntropy(logits + r * rows.vocab, kIgnore, 0.0, nullptr, probs_->data() + at * kNumTags);
        continue;
      }
      const int lab = (*labels_)[at];
      if (lab == kIgnore) continue;
      loss += TagCrossEntropy(logits + r * rows.vocab, lab, inv_, dlogits ? dlogits + r * rows.vocab : nullptr, nullptr);
    }
    return loss;
  }

 private:
  const std::vector<int8_t>* labels_ = nullptr;
  std::vector<float>* probs_ = nullptr;
  int64_t T_;
  double inv_ = 0;
};

// Whitespace and punctuation that no name, address or organisation starts
// or ends with (the tagger's spans are trimmed of them; '.' and '·' stay:
// "Ltd.", "Ave.").
bool EdgeJunk(char32_t c) {
  static const std::u32string kJunk = U" \t\r\n\u3000\u200b,;:()[]<>{}|\"'!?/\\，。：；（）【】、！？“”‘’《》「」";
  return kJunk.find(c) != std::u32string::npos;
}

struct EncodedDoc {
  std::vector<int32_t> ids;
  std::vector<int8_t> tags;
};

}  // namespace

double TagCrossEntropy(const float* logits, int label, double weight, float* dlogits, float* probs) {
  float p[kNumTags];
  float mx = logits[0];
  for (int k = 1; k < kNumTags; ++k) mx = std::max(mx, logits[k]);
  double sum = 0;
  for (int k = 0; k < kNumTags; ++k) sum += p[k] = std::exp(logits[k] - mx);
  for (int k = 0; k < kNumTags; ++k) p[k] = static_cast<float>(p[k] / sum);
  if (probs) std::copy(p, p + kNumTags, probs);
  if (label < 0 || label >= kNumTags) return 0.0;
  if (dlogits)
    for (int k = 0; k < kNumTags; ++k) dlogits[k] += static_cast<float>((p[k] - (k == label ? 1.0f : 0.0f)) * weight);
  return -std::log(std::max(static_cast<double>(p[label]), 1e-30)) * weight;
}

const char* TagName(int tag) {
  static const char* k[kNumTags] = {"O", "B-PERSON", "I-PERSON", "B-ADDRESS", "I-ADDRESS", "B-ORG", "I-ORG"};
  return tag >= 0 && tag < kNumTags ? k[tag] : "?";
}

std::vector<int> GoldTags(const LabelledDoc& d) {
  const int64_t n = static_cast<int64_t>(DecodeUtf8(d.text).size());
  std::vector<int> tags(n, 0);
  for (const Span& s : d.spans) {
    const int base = TypeTagBase(s.type);
    if (!base) continue;
    for (int64_t i = std::max<int64_t>(s.start, 0); i < std::min(s.end, n); ++i) tags[i] = i == s.start ? base : base + 1;
  }
  return tags;
}

int32_t Tagger::CharId(char32_t c) const {
  c = Fold(c);
  auto it = std::lower_bound(char_ids_.begin(), char_ids_.end(), std::pair<char32_t, int32_t>{c, -1});
  if (it != char_ids_.end() && it->first == c) return it->second;
  const uint32_t u = static_cast<uint32_t>(c);
  return 1 + static_cast<int32_t>(Checksum64(&u, sizeof u) % static_cast<uint64_t>(cfg_.hash_buckets));
}

std::vector<int32_t> Tagger::Encode(std::u32string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = CharId(text[i]);
  return ids;
}

std::vector<float> Tagger::TagProbabilities(std::u32string_view text) const {
  const int64_t L = static_cast<int64_t>(text.size());
  std::vector<float> out(L * kNumTags, 0.0f);
  if (L == 0) return out;
  const std::vector<int32_t> ids = Encode(text);
  const int64_t T = cfg_.window, D = cfg_.delay, chunk = T - D;
  // Windows: [a, b) read, tags kept for [s, b).
  struct Win { int64_t a, s, b; };
  std::vector<Win> wins;
  for (int64_t s = 0; s < L;) {
    const int64_t a = s == 0 ? 0 : std::max<int64_t>(0, s - cfg_.context);
    const int64_t b = std::min(L, a + chunk);
    wins.push_back({a, s, b});
    s = b;
  }
  const int64_t B = static_cast<int64_t>(wins.size());
  std::vector<int32_t> tokens(B * (T + 1), 0);
  for (int64_t w = 0; w < B; ++w)
    for (int64_t i = wins[w].a; i < wins[w].b; ++i) tokens[w * (T + 1) + (i - wins[w].a)] = ids[i];
  std::vector<float> p(B * T * kNumTags);
  {
    std::lock_guard<std::mutex> lock(mu_);
    BioObjective rec(&p, T);
    model_->set_head_objective(&rec, 0);
    (void)model_->Step(tokens.data(), static_cast<int>(B), static_cast<int>(T), /*backward=*/false);
    model_->set_head_objective(nullptr);
    model_->ClearExpertLoad();
  }
  for (int64_t w = 0; w < B; ++w)
    for (int64_t i = wins[w].s; i < wins[w].b; ++i) {
      const float* q = p.data() + (w * T + (i - wins[w].a) + D) * kNumTags;
      std::copy(q, q + kNumTags, out.data() + i * kNumTags);
    }
  return out;
}

void Tagger::TagCharacters(std::u32string_view text, std::vector<int>* tags, std::vector<float>* probs) const {
  const std::vector<float> p = TagProbabilities(text);
  const size_t L = text.size();
  tags->assign(L, 0);
  probs->assign(L, 1.0f);
  for (size_t i = 0; i < L; ++i) {
    const float* q = p.data() + i * kNumTags;
    const int k = static_cast<int>(std::max_element(q, q + kNumTags) - q);
    (*tags)[i] = k;
    (*probs)[i] = q[k];
  }
}

std::vector<Span> Tagger::Tag(std::u32string_view text) const {
  // A span is a run of characters that are inside some entity (1 - p(O)):
  // it opens above kOpen and continues above kContinue (hysteresis, so one
  // unsure character does not cut a name in two); its type is the one with
  // the most probability (B + I) summed over the run, so a run whose
  // characters disagree on the type stays one span, trimmed of edge
  // whitespace and punctuation. confidence: the mean of that type's
  // probability over the span.
  constexpr float kOpen = 0.5f, kContinue = 0.25f;
  const std::vector<float> p = TagProbabilities(text);
  const int64_t L = static_cast<int64_t>(text.size());
  auto inside = [&](int64_t i) { return 1.0f - p[i * kNumTags]; };
  std::vector<Span> out;
  for (int64_t i = 0; i < L;) {
    if (inside(i) <= kOpen) {
      ++i;
      continue;
    }
    int64_t j = i + 1;
    while (j < L && inside(j) > kContinue) ++j;
    const int64_t next = j;
    while (i < j && EdgeJunk(text[i])) ++i;
    while (j > i && EdgeJunk(text[j - 1])) --j;
    if (i == j) {
      i = next;
      continue;
    }
    double sum[3] = {0, 0, 0};
    for (int64_t k = i; k < j; ++k)
      for (int x = 0; x < 3; ++x) sum[x] += p[k * kNumTags + 1 + 2 * x] + p[k * kNumTags + 2 + 2 * x];
    const int x = static_cast<int>(std::max_element(sum, sum + 3) - sum);
    // One character earlier when B is on the character before more than on
    // the first one (a first letter missed: the model's hardest call is
    // where a span begins). Trimming a first character the other way round
    // was tried and cost addresses more than it gave names.
    auto b_prob = [&](int64_t k) { return p[k * kNumTags + 1 + 2 * x]; };
    if (i > 0 && (out.empty() || out.back().end < i) && !EdgeJunk(text[i - 1]) && b_prob(i - 1) > b_prob(i)) {
      --i;
      for (int y = 0; y < 3; ++y) sum[y] += p[i * kNumTags + 1 + 2 * y] + p[i * kNumTags + 2 + 2 * y];
    }
    out.push_back(Span{i, j, TagType(1 + 2 * x), static_cast<float>(sum[x] / static_cast<double>(j - i))});
    i = next;
  }
  return out;
}

Status Tagger::Save(const std::string& dir) const {
  Env* env = Env::Default();
  RETURN_IF_ERROR(env->CreateDirs(dir));
  const std::vector<float> params = model_->ParamsToHost();
  std::vector<TensorView> views;
  for (const ParamInfo& p : model_->layout().params())
    views.push_back(TensorView{p.name, "F32", p.shape, params.data() + p.offset,
                               static_cast<size_t>(p.numel) * sizeof(float)});
  RETURN_IF_ERROR(WriteSafetensors(env, dir + "/model.safetensors", views, {{"format", kFormat}}));
  nlohmann::json tags = nlohmann::json::array();
  for (int k = 0; k < kNumTags; ++k) tags.push_back(TagName(k));
  nlohmann::json j = {{"format", kFormat},
                      {"version", 1},
                      {"tags", tags},
                      {"window", cfg_.window},
                      {"delay", cfg_.delay},
                      {"context", cfg_.context},
                      {"hash_buckets", cfg_.hash_buckets},
                      {"max_chars", cfg_.max_chars},
                      {"chars", EncodeUtf8(chars_)},
                      {"model", model_->config().ToJson()}};
  return WriteFileAtomic(env, dir + "/tagger.json", j.dump(1) + "\n");
}

Result<std::unique_ptr<Tagger>> LoadTagger(const std::string& dir) {
  Env* env = Env::Default();
  const std::string jpath = dir + "/tagger.json", mpath = dir + "/model.safetensors";
  if (!env->FileExists(jpath))
    return Status::Error(dir + ": not a tagger directory (no tagger.json; hint: `myriad redact train --out DIR` writes one)");
  ASSIGN_OR_RETURN(std::string text, env->ReadFile(jpath));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& why) { return Status::Error(jpath + ": " + why); };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  if (j.value("format", std::string()) != kFormat) return bad(std::string("\"format\" is not \"") + kFormat + "\"");
  for (const char* key : {"window", "delay", "context", "hash_buckets"})
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < 0)
      return bad(std::string("\"") + key + "\" is missing or not a non-negative integer");
  if (!j.contains("chars") || !j["chars"].is_string()) return bad("\"chars\" is missing or not a string");
  if (!j.contains("tags") || !j["tags"].is_array() || j["tags"].size() != kNumTags)
    return bad("\"tags\" is not the " + std::to_string(kNumTags) + " BIO tags of PERSON, ADDRESS, ORG");
  for (int k = 0; k < kNumTags; ++k)
    if (!j["tags"][k].is_string() || j["tags"][k].get<std::string>() != TagName(k))
      return bad("tag " + std::to_string(k) + " is not " + TagName(k));
  if (!j.contains("model") || !j["model"].is_object()) return bad("\"model\" is missing");
  Result<ModelConfig> mc = ModelConfig::FromJson(j["model"]);
  if (!mc.ok()) return mc.status().With(jpath);
  RETURN_IF_ERROR(mc->Validate().With(jpath));
  std::unique_ptr<Tagger> t(new Tagger());
  t->cfg_.window = j["window"].get<int64_t>();
  t->cfg_.delay = j["delay"].get<int64_t>();
  t->cfg_.context = j["context"].get<int64_t>();
  t->cfg_.hash_buckets = j["hash_buckets"].get<int64_t>();
  t->cfg_.max_chars = j.value("max_chars", t->cfg_.max_chars);
  t->cfg_.d_model = mc->d_model;
  t->cfg_.n_layers = mc->n_layers;
  t->cfg_.n_heads = mc->n_heads;
  t->cfg_.d_ff = mc->d_ff;
  t->chars_ = DecodeUtf8(j["chars"].get<std::string>());
  if (t->cfg_.hash_buckets < 1 || t->cfg_.delay >= t->cfg_.window || t->cfg_.window > mc->max_seq_len ||
      t->cfg_.context + 1 >= t->cfg_.window - t->cfg_.delay)
    return bad("window/delay/context/hash_buckets are inconsistent");
  if (mc->vocab_size != 1 + t->cfg_.hash_buckets + static_cast<int64_t>(t->chars_.size()) ||
      mc->vocab_size < kNumTags)
    return bad("model.vocab_size " + std::to_string(mc->vocab_size) + " is not 1 + hash_buckets + the " +
               std::to_string(t->chars_.size()) + " characters");
  for (size_t i = 0; i < t->chars_.size(); ++i)
    t->char_ids_.push_back({t->chars_[i], static_cast<int32_t>(1 + t->cfg_.hash_buckets + i)});
  std::sort(t->char_ids_.begin(), t->char_ids_.end());
  t->model_ = std::make_unique<Model>(*mc);
  if (!env->FileExists(mpath)) return Status::Error(mpath + ": missing (hint: the tagger directory is incomplete)");
  ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(mpath));
  for (const ParamInfo& p : t->model_->layout().params()) {
    ASSIGN_OR_RETURN(std::vector<float> w, ReadF32(file, p.name, p.shape));
    t->model_->ParamsFromHost(w.data(), p.offset, p.numel);
  }
  return t;
}

Result<std::unique_ptr<Tagger>> TrainTagger(const std::vector<LabelledDoc>& docs, const TaggerConfig& cfg,
                                            const TaggerTrainOptions& opt) {
  if (docs.empty()) return Status::Error("tagger training: no documents");
  if (cfg.delay < 0 || cfg.delay >= cfg.window || cfg.context + 1 >= cfg.window - cfg.delay || cfg.hash_buckets < 1)
    return Status::Error("tagger training: window/delay/context/hash_buckets are inconsistent");
  auto log = [&](const std::string& line) {
    if (opt.progress) opt.progress(line);
    else std::fprintf(stderr, "%s\n", line.c_str());
  };
  std::unique_ptr<Tagger> t(new Tagger());
  t->cfg_ = cfg;
  // Vocabulary: ASCII printable, then corpus characters seen twice or more, most frequent first.
  std::map<char32_t, int64_t> freq;
  std::vector<std::u32string> texts;
  for (const LabelledDoc& d : docs) {
    texts.push_back(DecodeUtf8(d.text));
    for (char32_t c : texts.back()) ++freq[Fold(c)];
  }
  for (char32_t c = 0x20; c < 0x7F; ++c) t->chars_.push_back(c);
  t->chars_.push_back(U'\n');
  t->chars_.push_back(U'\t');
  std::vector<std::pair<int64_t, char32_t>> byfreq;
  for (auto [c, n] : freq)
    if (n >= 2 && t->chars_.find(c) == std::u32string::npos) byfreq.push_back({-n, c});
  std::sort(byfreq.begin(), byfreq.end());
  for (size_t i = 0; i < byfreq.size() && static_cast<int64_t>(i) < cfg.max_chars; ++i)
    t->chars_.push_back(byfreq[i].second);
  for (size_t i = 0; i < t->chars_.size(); ++i)
    t->char_ids_.push_back({t->chars_[i], static_cast<int32_t>(1 + cfg.hash_buckets + i)});
  std::sort(t->char_ids_.begin(), t->char_ids_.end());
  const int64_t vocab = 1 + cfg.hash_buckets + static_cast<int64_t>(t->chars_.size());

  std::vector<EncodedDoc> enc;
  for (size_t d = 0; d < docs.size(); ++d) {
    EncodedDoc e;
    e.ids = t->Encode(texts[d]);
    for (int g : GoldTags(docs[d])) e.tags.push_back(static_cast<int8_t>(g));
    enc.push_back(std::move(e));
  }

  ModelConfig mc = MakeModelConfig(cfg, vocab);
  RETURN_IF_ERROR(mc.Validate().With("tagger model"));
  TrainConfig tc;
  tc.seq_len = cfg.window;
  tc.batch_size = opt.batch;
  tc.grad_accum = 1;
  tc.steps = opt.steps;
  tc.seed = opt.seed;
  tc.precision = "fp32";
  tc.health_check = false;
  tc.async_checkpoint = false;
  tc.optim.lr = opt.lr;
  tc.optim.min_lr = opt.lr / 10;
  tc.optim.warmup_steps = std::max<int64_t>(1, opt.steps / 20);
  tc.optim.steps = opt.steps;
  tc.optim.weight_decay = 0.01;
  std::unique_ptr<comm::Comm> self = comm::MakeSelfComm();
  ASSIGN_OR_RETURN(std::unique_ptr<DistTrainer> trainer, DistTrainer::Create(self.get(), mc, tc));

  const int64_t T = cfg.window, D = cfg.delay, B = opt.batch, chunk = T - D;
  Rng rng(opt.seed ^ 0x7a6e3f1d2c4b5a69ULL);
  std::vector<int32_t> tokens(B * (T + 1));
  std::vector<int8_t> labels(B * T);
  const auto t0 = std::chrono::steady_clock::now();
  double loss_avg = 0;
  int64_t loss_n = 0;
  for (int64_t step = 1; step <= opt.steps; ++step) {
    std::fill(tokens.begin(), tokens.end(), 0);
    std::fill(labels.begin(), labels.end(), static_cast<int8_t>(kIgnore));
    int64_t labelled = 0;
    for (int64_t b = 0; b < B; ++b) {
      const EncodedDoc& e = enc[rng.Below(enc.size())];
      const int64_t L = static_cast<int64_t>(e.ids.size());
      const int64_t start = (L <= chunk || rng.Uniform() < 0.25f) ? 0 : static_cast<int64_t>(rng.Below(L - chunk / 2));
      const int64_t n = std::min(chunk, L - start);
      for (int64_t i = 0; i < n; ++i) {
        int32_t id = e.ids[start + i];
        if (id > cfg.hash_buckets && rng.Uniform() < opt.bucket_dropout) {
          const uint32_t u = static_cast<uint32_t>(t->chars_[id - 1 - cfg.hash_buckets]);
          id = 1 + static_cast<int32_t>(Checksum64(&u, sizeof u) % static_cast<uint64_t>(cfg.hash_buckets));
        }
        tokens[b * (T + 1) + i] = id;
        labels[b * T + i + D] = e.tags[start + i];
        ++labelled;
      }
    }
    BioObjective obj(&labels, T, labelled);
    const StepStats st = trainer->Step(tokens.data(), 1, static_cast<int>(B), static_cast<int>(T), step, &obj);
    loss_avg += st.loss.main;
    ++loss_n;
    if (opt.log_every > 0 && (step % opt.log_every == 0 || step == opt.steps)) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      char line[200];
      std::snprintf(line, sizeof line, "tagger step %lld/%lld loss %.4f lr %.2e tok/s %.0f elapsed %.1fs",
                    static_cast<long long>(step), static_cast<long long>(opt.steps), loss_avg / loss_n, st.lr,
                    static_cast<double>(step * B * T) / std::max(secs, 1e-9), secs);
      log(line);
      loss_avg = 0;
      loss_n = 0;
    }
  }
  // The trained weights move into the tagger's own model (inference shapes vary per call).
  t->model_ = std::make_unique<Model>(mc);
  const std::vector<float> w = trainer->model().ParamsToHost();
  t->model_->ParamsFromHost(w.data(), 0, static_cast<int64_t>(w.size()));
  return t;
}

}  // namespace myriad::edge

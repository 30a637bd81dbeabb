#include "model/hf/hf_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "model/params.h"

namespace myriad::hf {
namespace {

enum class Family { kLlama, kQwen2, kQwen3, kQwen3Moe, kDeepseekV3 };

struct Arch {
  const char* name;
  Family family;
};
constexpr Arch kArchs[] = {
    {"LlamaForCausalLM", Family::kLlama},
    {"Qwen2ForCausalLM", Family::kQwen2},
    {"Qwen3ForCausalLM", Family::kQwen3},
    {"Qwen3MoeForCausalLM", Family::kQwen3Moe},
    {"DeepseekV3ForCausalLM", Family::kDeepseekV3},
};

// Keys that describe the checkpoint, the tokenizer or training-time options
// of Hugging Face's code, none of which changes the model's function.
const std::set<std::string>& BenignKeys() {
  static const std::set<std::string> k = {
      "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "bos_token_id",
      "eos_token_id", "pad_token_id", "initializer_range", "use_cache", "attention_dropout", "_name_or_path",
      "auto_map", "output_router_logits", "router_aux_loss_coef", "aux_loss_alpha", "seq_aux", "ep_size",
      "topk_method", "max_window_layers", "sliding_window", "tokenizer_class", "return_dict",
      "output_hidden_states", "output_attentions", "is_decoder", "id2label", "label2id"};
  return k;
}

class Reader {
 public:
  Reader(const nlohmann::json& j, std::string source, std::string arch)
      : j_(j), source_(std::move(source)), arch_(std::move(arch)) {}

  bool Has(const std::string& key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  Status Int(const std::string& key, int64_t* out, bool required, int64_t def = 0) {
    used_.insert(key);
    if (!Has(key)) {
      if (required) return Missing(key);
      *out = def;
      return Status::Ok();
    }
    const auto& v = j_.at(key);
    if (!v.is_number_integer()) return Bad(key, "must be an integer, not " + v.dump());
    *out = v.get<int64_t>();
    return Status::Ok();
  }
  Status Float(const std::string& key, double* out, double def) {
    used_.insert(key);
    if (!Has(key)) {
      *out = def;
      return Status::Ok();
    }
    const auto& v = j_.at(key);
    if (!v.is_number()) return Bad(key, "must be a number, not " + v.dump());
    *out = v.get<double>();
    return Status::Ok();
  }
  Status Bool(const std::string& key, bool* out, bool def) {
    used_.insert(key);
    if (!Has(key)) {
      *out = def;
      return Status::Ok();
    }
    const auto& v = j_.at(key);
    if (!v.is_boolean()) return Bad(key, "must be true or false, not " + v.dump());
    *out = v.get<bool>();
    return Status::Ok();
  }
  Status String(const std::string& key, std::string* out, const std::string& def) {
    used_.insert(key);
    if (!Has(key)) {
      *out = def;
      return Status::Ok();
    }
    const auto& v = j_.at(key);
    if (!v.is_string()) return Bad(key, "must be a string, not " + v.dump());
    *out = v.get<std::string>();
    return Status::Ok();
  }
  // A key that must be absent, null or equal to `ok` (a feature not built).
  Status Only(const std::string& key, const nlohmann::json& ok, const std::string& why) {
    used_.insert(key);
    if (!Has(key) || j_.at(key) == ok) return Status::Ok();
    return Bad(key, "= " + j_.at(key).dump() + " is not supported yet (" + why + ")");
  }
  void Use(const std::string& key) { used_.insert(key); }
  const nlohmann::json& At(const std::string& key) const { return j_.at(key); }
  // Every key read or benign; another one may change the model: refused.
  Status CheckAllKnown() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!used_.count(it.key()) && !BenignKeys().count(it.key()))
        return Status::Error(source_ + ": key \"" + it.key() + "\" is not known to Myriad's import of " + arch_ +
                             " (hint: a key that could change the model is refused rather than ignored; "
                             "docs/open-models.md lists the keys read)");
    return Status::Ok();
  }
  Status Bad(const std::string& key, const std::string& what) const {
    return Status::Error(source_ + ": " + arch_ + " key \"" + key + "\" " + what);
  }
  Status Missing(const std::string& key) const {
    return Status::Error(source_ + ": " + arch_ + " needs the key \"" + key + "\"");
  }
  const std::string& source() const { return source_; }

 private:
  const nlohmann::json& j_;
  std::string source_, arch_;
  std::set<std::string> used_;
};

std::string ShapeOf(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// yarn's attention scale for a scaling factor s: 0.1 m ln(s) + 1 (1 for s <= 1).
double YarnMscale(double s, double m) { return s <= 1 ? 1.0 : 0.1 * m * std::log(s) + 1.0; }

// rope_scaling (or transformers 5's rope_parameters) into cfg.
Status ReadRopeScaling(Reader& r, const std::string& key, ModelConfig* cfg) {
  r.Use(key);
  if (!r.Has(key)) return Status::Ok();
  const auto& rs = r.At(key);
  if (!rs.is_object()) return r.Bad(key, "must be an object or null");
  Reader s(rs, r.source() + " " + key, "rope scaling");
  std::string type;
  RETURN_IF_ERROR(s.String("rope_type", &type, ""));
  if (type.empty()) RETURN_IF_ERROR(s.String("type", &type, "default"));
  else s.Use("type");
  if (rs.contains("rope_theta")) RETURN_IF_ERROR(s.Float("rope_theta", &cfg->rope_theta, cfg->rope_theta));
  RETURN_IF_ERROR(s.Float("factor", &cfg->rope_factor, 1.0));
  double orig = 0;
  if (type == "default") {
    cfg->rope_scaling = "none";
  } else if (type == "linear") {
    cfg->rope_scaling = "linear";
  } else if (type == "llama3") {
    cfg->rope_scaling = "llama3";
    RETURN_IF_ERROR(s.Float("low_freq_factor", &cfg->rope_low_freq_factor, 1.0));
    RETURN_IF_ERROR(s.Float("high_freq_factor", &cfg->rope_high_freq_factor, 4.0));
    RETURN_IF_ERROR(s.Float("original_max_position_embeddings", &orig, 8192));
  } else if (type == "yarn") {
    cfg->rope_scaling = "yarn";
    RETURN_IF_ERROR(s.Float("original_max_position_embeddings", &orig, 0));
    RETURN_IF_ERROR(s.Float("beta_fast", &cfg->rope_beta_fast, 32));
    RETURN_IF_ERROR(s.Float("beta_slow", &cfg->rope_beta_slow, 1));
    RETURN_IF_ERROR(s.Bool("truncate", &cfg->rope_truncate, true));
    double af = 0, mscale = 0, mscale_all = 0;
    RETURN_IF_ERROR(s.Float("attention_factor", &af, 0));
    RETURN_IF_ERROR(s.Float("mscale", &mscale, 0));
    RETURN_IF_ERROR(s.Float("mscale_all_dim", &mscale_all, 0));
    if (af <= 0)
      af = mscale > 0 && mscale_all > 0 ? YarnMscale(cfg->rope_factor, mscale) / YarnMscale(cfg->rope_factor, mscale_all)
                                        : YarnMscale(cfg->rope_factor, 1.0);
    cfg->rope_attention_factor = af;
    cfg->rope_mscale_all_dim = mscale_all;  // MLA's softmax scale (unused by q/k/v attention)
  } else {
    return r.Bad(key, "rope type \"" + type + "\" is not supported (supported: default, linear, llama3, yarn)");
  }
  if (orig > 0) cfg->rope_original_max_pos = static_cast<int64_t>(orig);
  return s.CheckAllKnown();
}

Family FamilyOf(const std::string& arch) {
  for (const Arch& a : kArchs)
    if (arch == a.name) return a.family;
  return Family::kLlama;
}

// An "eos_token_id" value: one id or a list of them.
std::vector<int64_t> EosIds(const nlohmann::json& e) {
  std::vector<int64_t> ids;
  if (e.is_number_integer()) ids.push_back(e.get<int64_t>());
  if (e.is_array())
    for (const auto& v : e)
      if (v.is_number_integer()) ids.push_back(v.get<int64_t>());
  return ids;
}

// DeepseekV3ForCausalLM's own keys: MLA, the sigmoid router with its
// correction bias and groups, shared experts, the dense prefix, MTP layers.
Status MapDeepseekV3(Reader& r, ModelConfig* c, HfModelInfo* info) {
  RETURN_IF_ERROR(r.Int("kv_lora_rank", &c->kv_lora_rank, true));
  if (c->kv_lora_rank <= 0) return r.Bad("kv_lora_rank", "must be positive");
  RETURN_IF_ERROR(r.Int("q_lora_rank", &c->q_lora_rank, false, 0));  // null: q_proj
  RETURN_IF_ERROR(r.Int("qk_nope_head_dim", &c->qk_nope_head_dim, true));
  RETURN_IF_ERROR(r.Int("qk_rope_head_dim", &c->qk_rope_head_dim, true));
  RETURN_IF_ERROR(r.Int("v_head_dim", &c->v_head_dim, true));
  // transformers writes head_dim = qk_rope_head_dim (its RoPE width); nothing else is meant by it.
  RETURN_IF_ERROR(r.Only("head_dim", c->qk_rope_head_dim, "a head_dim other than qk_rope_head_dim"));
  c->n_kv_heads = c->n_heads;  // not used by MLA
  RETURN_IF_ERROR(r.Only("attention_bias", false, "q_a/kv_a/o projection biases"));
  RETURN_IF_ERROR(r.Bool("rope_interleave", &info->rope_interleave, true));
  std::string scoring, topk_method;
  RETURN_IF_ERROR(r.String("scoring_func", &scoring, "sigmoid"));
  if (scoring != "sigmoid") return r.Bad("scoring_func", "= \"" + scoring + "\" is not supported (DeepSeek-V3's is sigmoid)");
  RETURN_IF_ERROR(r.String("topk_method", &topk_method, "noaux_tc"));
  if (topk_method != "noaux_tc")
    return r.Bad("topk_method", "= \"" + topk_method + "\" is not supported (DeepSeek-V3's noaux_tc: group-limited top-k "
                                "of the biased sigmoid scores)");
  c->score_func = "sigmoid";
  RETURN_IF_ERROR(r.Int("n_routed_experts", &c->n_routed_experts, false, 0));
  RETURN_IF_ERROR(r.Int("num_experts_per_tok", &c->top_k, c->n_routed_experts > 0, 0));
  RETURN_IF_ERROR(r.Int("moe_intermediate_size", &c->d_expert, c->n_routed_experts > 0, 0));
  RETURN_IF_ERROR(r.Int("n_shared_experts", &c->n_shared_experts, false, 0));
  RETURN_IF_ERROR(r.Float("routed_scaling_factor", &c->routed_scaling_factor, 1.0));
  RETURN_IF_ERROR(r.Int("n_group", &c->n_group, false, 1));
  RETURN_IF_ERROR(r.Int("topk_group", &c->topk_group, false, 1));
  RETURN_IF_ERROR(r.Bool("norm_topk_prob", &c->norm_topk_prob, true));
  int64_t first_dense = 0, freq = 1, mtp = 0;
  RETURN_IF_ERROR(r.Int("first_k_dense_replace", &first_dense, false, 0));
  RETURN_IF_ERROR(r.Int("moe_layer_freq", &freq, false, 1));
  RETURN_IF_ERROR(r.Int("num_nextn_predict_layers", &mtp, false, 0));
  if (freq < 1) return r.Bad("moe_layer_freq", "must be >= 1");
  if (first_dense < 0) return r.Bad("first_k_dense_replace", "must be >= 0");
  if (mtp < 0) return r.Bad("num_nextn_predict_layers", "must be >= 0");
  c->mtp_depth = mtp;
  c->mtp_after_final_norm = true;
  if (c->n_routed_experts == 0) {
    c->n_dense_layers = c->n_layers;
    return Status::Ok();
  }
  // Layer l (MTP layers included, at n_layers + j) is MoE when l >=
  // first_k_dense_replace and l % moe_layer_freq == 0 (DeepSeek's rule);
  // ours are the layers after a dense prefix, and MTP blocks are MoE when
  // the last main layer is.
  auto is_moe = [&](int64_t l) { return l >= first_dense && l % freq == 0; };
  const int64_t prefix = std::min(first_dense, c->n_layers);
  c->n_dense_layers = prefix;
  for (int64_t l = prefix; l < c->n_layers + mtp; ++l) {
    const bool ours = l < c->n_layers ? true : c->n_layers > prefix;
    if (is_moe(l) != ours)
      return r.Bad("moe_layer_freq", "= " + std::to_string(freq) + " with first_k_dense_replace = " +
                                         std::to_string(first_dense) + " makes layer " + std::to_string(l) +
                                         (ours ? " dense" : " MoE") +
                                         ": only dense layers before the first MoE layer (and MTP layers like the "
                                         "last one) are supported yet");
  }
  return Status::Ok();
}

}  // namespace

const std::vector<std::string>& SupportedArchitectures() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> out;
    for (const Arch& a : kArchs) out.push_back(a.name);
    return out;
  }();
  return v;
}

Result<HfModelInfo> MapHfConfig(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) return Status::Error(source + ": not a JSON object");
  const auto archs = j.find("architectures");
  if (archs == j.end() || !archs->is_array() || archs->empty() || !(*archs)[0].is_string())
    return Status::Error(source + ": no \"architectures\" list (hint: the config.json of a Hugging Face causal LM)");
  HfModelInfo info;
  info.architecture = (*archs)[0].get<std::string>();
  const auto& sup = SupportedArchitectures();
  if (std::find(sup.begin(), sup.end(), info.architecture) == sup.end()) {
    std::string list;
    for (const auto& a : sup) list += (list.empty() ? "" : ", ") + a;
    return Status::Error(source + ": architecture \"" + info.architecture + "\" is not supported (supported: " + list + ")");
  }
  const Family fam = FamilyOf(info.architecture);
  Reader r(j, source, info.architecture);
  ModelConfig c;
  c.init_std = 0.02;
  c.aux_loss_weight = 0;
  c.bias_update_rate = 0;  // only DeepSeek-V3 balances with the bias
  c.mtp_depth = 0;
  RETURN_IF_ERROR(r.Int("vocab_size", &c.vocab_size, true));
  RETURN_IF_ERROR(r.Int("hidden_size", &c.d_model, true));
  RETURN_IF_ERROR(r.Int("num_hidden_layers", &c.n_layers, true));
  RETURN_IF_ERROR(r.Int("num_attention_heads", &c.n_heads, true));
  RETURN_IF_ERROR(r.Int("num_key_value_heads", &c.n_kv_heads, false, c.n_heads));
  RETURN_IF_ERROR(r.Int("intermediate_size", &c.d_ff, true));
  const int64_t default_max_pos = fam == Family::kLlama ? 2048 : fam == Family::kDeepseekV3 ? 4096 : 32768;
  RETURN_IF_ERROR(r.Int("max_position_embeddings", &c.max_seq_len, false, default_max_pos));
  RETURN_IF_ERROR(r.Float("rms_norm_eps", &c.norm_eps, 1e-6));
  RETURN_IF_ERROR(r.Float("rope_theta", &c.rope_theta, 10000.0));
  RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c.tie_embeddings, false));
  std::string act;
  RETURN_IF_ERROR(r.String("hidden_act", &act, "silu"));
  if (act != "silu") return r.Bad("hidden_act", "= \"" + act + "\" is not supported (the FFN is SwiGLU: silu)");
  RETURN_IF_ERROR(ReadRopeScaling(r, "rope_scaling", &c));
  RETURN_IF_ERROR(ReadRopeScaling(r, "rope_parameters", &c));
  RETURN_IF_ERROR(r.Only("partial_rotary_factor", 1.0, "RoPE on part of each head"));
  RETURN_IF_ERROR(r.Only("pretraining_tp", 1, "sliced projections"));
  RETURN_IF_ERROR(r.Only("mlp_bias", false, "FFN biases"));
  RETURN_IF_ERROR(r.Only("use_sliding_window", false, "sliding-window attention"));
  RETURN_IF_ERROR(r.Only("quantization_config", nullptr, "quantised checkpoints"));
  if (r.Has("layer_types")) {
    r.Use("layer_types");
    for (const auto& t : r.At("layer_types"))
      if (t != "full_attention") return r.Bad("layer_types", "holds " + t.dump() + ": only full attention is supported");
  }
  // Head width: Llama's and Qwen2's default d_model / n_heads, Qwen3's 128.
  const int64_t def_head = (fam == Family::kQwen3 || fam == Family::kQwen3Moe) ? 128 : c.d_model / std::max<int64_t>(c.n_heads, 1);
  if (fam != Family::kDeepseekV3) {
    int64_t hd = 0;
    RETURN_IF_ERROR(r.Int("head_dim", &hd, false, def_head));
    c.d_head = hd * c.n_heads == c.d_model ? 0 : hd;
  }
  c.n_dense_layers = c.n_layers;
  c.n_routed_experts = 0;
  c.top_k = 0;
  c.d_expert = 0;
  switch (fam) {
    case Family::kLlama:
      RETURN_IF_ERROR(r.Only("attention_bias", false, "q/k/v/o projection biases; Qwen2's q/k/v biases are"));
      break;
    case Family::kQwen2:
      c.qkv_bias = true;
      break;
    case Family::kQwen3:
    case Family::kQwen3Moe:
      c.qk_norm = true;
      RETURN_IF_ERROR(r.Only("attention_bias", false, "q/k/v/o projection biases"));
      break;
    case Family::kDeepseekV3:
      break;
  }
  if (fam == Family::kQwen3Moe) {
    RETURN_IF_ERROR(r.Int("num_experts", &c.n_routed_experts, true));
    RETURN_IF_ERROR(r.Int("num_experts_per_tok", &c.top_k, true));
    RETURN_IF_ERROR(r.Int("moe_intermediate_size", &c.d_expert, true));
    RETURN_IF_ERROR(r.Bool("norm_topk_prob", &c.norm_topk_prob, false));
    RETURN_IF_ERROR(r.Only("shared_expert_intermediate_size", 0, "a shared expert"));
    int64_t step = 1;
    RETURN_IF_ERROR(r.Int("decoder_sparse_step", &step, false, 1));
    std::set<int64_t> mlp_only;
    r.Use("mlp_only_layers");
    if (r.Has("mlp_only_layers")) {
      if (!r.At("mlp_only_layers").is_array()) return r.Bad("mlp_only_layers", "must be a list of layer indices");
      for (const auto& v : r.At("mlp_only_layers")) {
        if (!v.is_number_integer()) return r.Bad("mlp_only_layers", "must be a list of layer indices");
        mlp_only.insert(v.get<int64_t>());
      }
    }
    if (step < 1) return r.Bad("decoder_sparse_step", "must be >= 1");
    // Layer l is MoE when it is not MLP-only and (l + 1) % step == 0: ours
    // are a dense prefix, then MoE layers but for dense_layers.
    int64_t dense_prefix = 0;
    while (dense_prefix < c.n_layers && (mlp_only.count(dense_prefix) || (dense_prefix + 1) % step != 0)) ++dense_prefix;
    for (int64_t l = dense_prefix; l < c.n_layers; ++l)
      if (mlp_only.count(l) || (l + 1) % step != 0) c.dense_layers.push_back(l);
    c.n_dense_layers = dense_prefix;
    if (c.n_routed_experts == 0) c.n_dense_layers = c.n_layers;
  }
  if (fam == Family::kDeepseekV3) RETURN_IF_ERROR(MapDeepseekV3(r, &c, &info));
  RETURN_IF_ERROR(r.CheckAllKnown());
  if (Status s = c.Validate(); !s.ok()) return Status::Error(source + ": maps to an invalid model: " + s.message());
  info.config = c;
  if (j.contains("torch_dtype") && j["torch_dtype"].is_string()) info.torch_dtype = j["torch_dtype"];
  else if (j.contains("dtype") && j["dtype"].is_string()) info.torch_dtype = j["dtype"];
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) info.bos_token_id = j["bos_token_id"];
  if (j.contains("eos_token_id")) info.eos_token_ids = EosIds(j["eos_token_id"]);
  info.hf_config = j;
  return info;
}

namespace {
Result<nlohmann::json> ReadJsonFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::Error(path + ": cannot be read");
  std::stringstream ss;
  ss << in.rdbuf();
  auto j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Error(path + ": not valid JSON");
  return j;
}
}  // namespace

Result<HfModelInfo> ReadHfConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  if (!std::filesystem::exists(path))
    return Status::Error(dir + ": no config.json (hint: the folder of a Hugging Face model, as downloaded)");
  ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(path));
  ASSIGN_OR_RETURN(HfModelInfo info, MapHfConfig(j, path));
  info.dir = dir;
  const std::string gen = dir + "/generation_config.json";
  if (std::filesystem::exists(gen)) {
    ASSIGN_OR_RETURN(nlohmann::json g, ReadJsonFile(gen));
    // generation_config.json's eos ids are the ones generation stops at.
    if (g.is_object() && g.contains("eos_token_id"))
      if (std::vector<int64_t> ids = EosIds(g["eos_token_id"]); !ids.empty()) info.eos_token_ids = ids;
    if (g.is_object() && g.contains("bos_token_id") && g["bos_token_id"].is_number_integer() && info.bos_token_id < 0)
      info.bos_token_id = g["bos_token_id"];
  }
  return info;
}

std::string HfTensorName(const ModelConfig& cfg, const std::string& ours) {
  static const std::string mtp = "model.mtp.";
  if (ours.compare(0, mtp.size(), mtp) != 0) return ours;
  const size_t dot = ours.find('.', mtp.size());
  const int64_t j = std::stoll(ours.substr(mtp.size(), dot - mtp.size()));
  std::string rest = ours.substr(dot + 1);
  if (rest.compare(0, 6, "block.") == 0) rest = rest.substr(6);
  else if (rest == "norm.weight") rest = "shared_head.norm.weight";
  return "model.layers." + std::to_string(cfg.n_layers + j) + "." + rest;
}

namespace {

// Rows [first, first + d) of each of `groups` blocks of `stride` rows of a
// [rows, cols] matrix, between RoPE's interleaved pairs (2i, 2i+1) and
// rotate-half pairs (i, i + d/2). De-interleaving: new row i = old 2i, new
// d/2 + i = old 2i + 1; interleaving (!deinterleave) is its inverse.
void PermuteRopeRows(std::vector<float>* m, int64_t cols, int64_t groups, int64_t stride, int64_t first, int64_t d,
                     bool deinterleave) {
  std::vector<float> old(d * cols);
  for (int64_t g = 0; g < groups; ++g) {
    float* base = m->data() + (g * stride + first) * cols;
    std::copy(base, base + d * cols, old.begin());
    for (int64_t i = 0; i < d; ++i) {
      // Rotate-half row r is interleaved row (r < d/2 ? 2r : 2(r - d/2) + 1).
      const int64_t half = i < d / 2 ? 2 * i : 2 * (i - d / 2) + 1;
      const int64_t to = deinterleave ? i : half, from = deinterleave ? half : i;
      std::copy(old.begin() + from * cols, old.begin() + (from + 1) * cols, base + to * cols);
    }
  }
}

// ToOurLayout (to_ours) or FromOurLayout: both permutations in one place.
void ChangeLayout(const HfModelInfo& info, const ParamInfo& p, std::vector<float>* v, bool to_ours) {
  const ModelConfig& c = info.config;
  if (!c.mla()) return;
  const int64_t Dr = c.qk_rope_head_dim, Dqk = c.qk_head_dim(), cols = p.shape.size() == 2 ? p.shape[1] : 1;
  if (info.rope_interleave) {
    if (p.name.ends_with("self_attn.q_b_proj.weight") || p.name.ends_with("self_attn.q_proj.weight"))
      PermuteRopeRows(v, cols, c.n_heads, Dqk, c.qk_nope_head_dim, Dr, to_ours);
    if (p.name.ends_with("self_attn.kv_a_proj_with_mqa.weight"))
      PermuteRopeRows(v, cols, 1, 0, c.kv_lora_rank, Dr, to_ours);
  }
  // [embedding; hidden] <-> [hidden; embedding]: a swap, its own inverse.
  if (p.name.starts_with("model.mtp.") && p.name.ends_with(".eh_proj.weight")) {
    const int64_t C = c.d_model;
    for (int64_t r = 0; r < C; ++r) std::swap_ranges(v->begin() + r * 2 * C, v->begin() + r * 2 * C + C, v->begin() + r * 2 * C + C);
  }
}

bool IsSelectionBias(const std::string& ours) { return ours.ends_with(".mlp.gate.e_score_correction_bias"); }

}  // namespace

void ToOurLayout(const HfModelInfo& info, const ParamInfo& p, std::vector<float>* v) { ChangeLayout(info, p, v, true); }
void FromOurLayout(const HfModelInfo& info, const ParamInfo& p, std::vector<float>* v) { ChangeLayout(info, p, v, false); }

Result<HfModelReader> HfModelReader::Open(const std::string& dir) {
  ASSIGN_OR_RETURN(HfModelInfo info, ReadHfConfig(dir));
  ASSIGN_OR_RETURN(HfWeights weights, HfWeights::Open(dir));
  const ModelConfig& cfg = info.config;
  const ParamLayout layout(cfg);
  std::set<std::string> used;
  for (const ParamInfo& p : layout.params()) {
    const std::string name = HfTensorName(cfg, p.name);
    if (!weights.Find(name))
      return Status::Error(dir + ": tensor " + name + " " + ShapeOf(p.shape) + " is missing (" + info.architecture +
                           " with this config.json needs it)");
    used.insert(name);
  }
  for (const std::string& b : layout.bias_names()) used.insert(HfTensorName(cfg, b));  // (optional)
  // DeepSeek's MTP layers store their own embedding and head; ours use the
  // main model's, so the copies must be exactly those.
  for (int64_t j = 0; j < cfg.mtp_depth; ++j) {
    const std::string layer = "model.layers." + std::to_string(cfg.n_layers + j) + ".";
    for (auto [theirs, main] : {std::pair<std::string, std::string>{layer + "embed_tokens.weight", "model.embed_tokens.weight"},
                                {layer + "shared_head.head.weight", cfg.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"}}) {
      if (!weights.Find(theirs))
        return Status::Error(dir + ": tensor " + theirs + " is missing (" + info.architecture + " MTP layer " +
                             std::to_string(j) + " needs it)");
      const std::vector<int64_t> shape = {cfg.vocab_size, cfg.d_model};
      ASSIGN_OR_RETURN(std::vector<float> a, weights.ReadF32(theirs, shape));
      ASSIGN_OR_RETURN(std::vector<float> b, weights.ReadF32(main, shape));
      if (a != b)
        return Status::Error(weights.FileOf(theirs) + ": tensor " + theirs + " differs from " + main +
                             ": an MTP layer with its own embedding or head is not supported yet (Myriad's MTP modules "
                             "share the main model's)");
      used.insert(theirs);
    }
  }
  if (cfg.tie_embeddings) used.insert("lm_head.weight");  // tied: Hugging Face ignores a stored copy too
  for (const std::string& name : weights.names()) {
    if (used.count(name)) continue;
    if (name.ends_with(".rotary_emb.inv_freq")) continue;  // a cache of RoPE's table, not a weight
    return Status::Error(weights.FileOf(name) + ": tensor " + name + " is not used by " + info.architecture +
                         " as this config.json describes it (hint: a weight Myriad would ignore means a different "
                         "model; check the config, or the feature is not supported yet)");
  }
  return HfModelReader(std::move(info), std::move(weights));
}

Result<std::vector<float>> HfModelReader::Read(const std::string& ours, const std::vector<int64_t>& shape) const {
  const std::string name = HfTensorName(info_.config, ours);
  if (IsSelectionBias(ours) && !weights_.Find(name)) return std::vector<float>(NumElements(shape), 0.f);
  ASSIGN_OR_RETURN(std::vector<float> v, weights_.ReadF32(name, shape));
  ParamInfo p;
  p.name = ours;
  p.shape = shape;
  ToOurLayout(info_, p, &v);
  return v;
}

Result<std::unique_ptr<Model>> LoadHfModel(const std::string& dir, HfModelInfo* info_out) {
  ASSIGN_OR_RETURN(HfModelReader reader, HfModelReader::Open(dir));
  const ModelConfig& cfg = reader.info().config;
  auto model = std::make_unique<Model>(cfg);
  for (const ParamInfo& p : model->layout().params()) {
    ASSIGN_OR_RETURN(std::vector<float> v, reader.Read(p.name, p.shape));
    model->ParamsFromHost(v.data(), p.offset, p.numel);
  }
  const auto& bias_names = model->layout().bias_names();
  for (size_t i = 0; i < bias_names.size(); ++i) {
    ASSIGN_OR_RETURN(model->biases()[i], reader.Read(bias_names[i], {cfg.n_routed_experts}));
  }
  if (info_out) *info_out = reader.info();
  return model;
}

}  // namespace myriad::hf

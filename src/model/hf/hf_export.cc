#include "model/hf/hf_export.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <filesystem>
#include <set>

#include "core/log.h"
#include "model/hf/hf_model.h"
#include "model/hf/hf_weights.h"

namespace myriad::hf {
namespace {

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

bool HasMoeLayers(const ModelConfig& c) { return c.n_moe_layers() > 0; }

// The features of an MoE config that only DeepSeek-V3 has among the
// families ("" when none).
std::string DeepseekOnlyFeatures(const ModelConfig& c) {
  std::vector<std::string> f;
  if (c.n_shared_experts > 0) f.push_back("shared experts (model.n_shared_experts=" + std::to_string(c.n_shared_experts) + ")");
  if (c.sigmoid_scores()) f.push_back("sigmoid routing scores (model.score_func=\"sigmoid\")");
  if (c.n_group > 1) f.push_back("group-limited routing (model.n_group=" + std::to_string(c.n_group) + ")");
  if (c.routed_scaling_factor != 1.0) f.push_back("a routing scale (model.routed_scaling_factor=" + Num(c.routed_scaling_factor) + ")");
  std::string out;
  for (size_t i = 0; i < f.size(); ++i) out += (i == 0 ? "" : i + 1 == f.size() ? " and " : ", ") + f[i];
  return out;
}

nlohmann::ordered_json RopeScalingJson(const ModelConfig& c) {
  if (c.rope_scaling == "none") return nullptr;
  nlohmann::ordered_json r = {{"rope_type", c.rope_scaling}, {"factor", c.rope_factor}};
  if (c.rope_scaling == "llama3") {
    r["low_freq_factor"] = c.rope_low_freq_factor;
    r["high_freq_factor"] = c.rope_high_freq_factor;
    // Ours: 0 means max_seq_len; Hugging Face's llama3 default is 8192, so always written.
    r["original_max_position_embeddings"] = c.rope_original_max_pos > 0 ? c.rope_original_max_pos : c.max_seq_len;
  } else if (c.rope_scaling == "yarn") {
    // Absent, both read max_position_embeddings.
    if (c.rope_original_max_pos > 0) r["original_max_position_embeddings"] = c.rope_original_max_pos;
    r["beta_fast"] = c.rope_beta_fast;
    r["beta_slow"] = c.rope_beta_slow;
    // 0 is 0.1 ln(factor) + 1 for both.
    if (c.rope_attention_factor > 0) r["attention_factor"] = c.rope_attention_factor;
    // DeepSeek's softmax scale under MLA; kept for the round trip elsewhere
    // (the attention factor above is written explicitly, so it changes nothing).
    if (c.rope_mscale_all_dim > 0) r["mscale_all_dim"] = c.rope_mscale_all_dim;
    if (!c.rope_truncate) r["truncate"] = false;  // (versions before it existed always truncate)
  }
  return r;
}

const char* TorchDtype(const std::string& dtype) {
  return dtype == "BF16" ? "bfloat16" : dtype == "F16" ? "float16" : "float32";
}

nlohmann::ordered_json EosJson(const std::vector<int64_t>& ids) {
  if (ids.size() == 1) return ids[0];
  return ids;
}

// DeepseekV3ForCausalLM: MLA attention with our own MoE (shared experts,
// sigmoid scores with the selection bias as e_score_correction_bias, groups,
// a routing scale, a dense prefix, MTP modules as layers L + j). The inverse
// of hf_model.cc's MapDeepseekV3; what DeepSeek-V3 cannot express is refused.
Result<nlohmann::ordered_json> DeepseekV3ConfigFor(const ModelConfig& c, const HfExportOptions& options) {
  auto refuse = [](const std::string& what) {
    return Status::Error("model: " + what + " has no DeepseekV3ForCausalLM equivalent");
  };
  // (Validate already refuses qkv_bias, qk_norm, d_head and DSA with MLA.)
  const bool moe = HasMoeLayers(c);
  if (!c.dense_layers.empty()) {
    std::string l;
    for (int64_t v : c.dense_layers) l += (l.empty() ? "" : ",") + std::to_string(v);
    return refuse("dense layers after the first MoE layer (model.dense_layers=[" + l +
                  "]; its dense layers are a prefix, first_k_dense_replace)");
  }
  if (moe && !c.sigmoid_scores())
    return refuse("softmax routing scores (model.score_func=\"" + c.score_func + "\"; its router is sigmoid)");
  const int64_t mtp = options.drop_mtp ? 0 : c.mtp_depth;
  if (mtp > 0 && !c.mtp_after_final_norm)
    return Status::Error("model: multi-token prediction modules reading the hidden state before the final norm "
                         "(model.mtp_after_final_norm=false) have no DeepseekV3ForCausalLM equivalent: its MTP layers "
                         "read it after the norm (hint: train with model.mtp_after_final_norm = true, or --drop-mtp "
                         "exports the main model without them)");
  nlohmann::ordered_json j = {{"architectures", {"DeepseekV3ForCausalLM"}},
                              {"model_type", "deepseek_v3"},
                              {"vocab_size", c.vocab_size},
                              {"hidden_size", c.d_model},
                              {"intermediate_size", c.d_ff},
                              {"moe_intermediate_size", c.d_expert},
                              {"num_hidden_layers", c.n_layers},
                              {"num_nextn_predict_layers", mtp},
                              {"num_attention_heads", c.n_heads},
                              {"num_key_value_heads", c.n_heads},  // (unused by MLA; DeepSeek writes n_heads)
                              {"n_shared_experts", c.n_shared_experts},
                              {"n_routed_experts", c.n_routed_experts},
                              {"routed_scaling_factor", c.routed_scaling_factor},
                              {"kv_lora_rank", c.kv_lora_rank}};
  j["q_lora_rank"] = c.q_lora_rank > 0 ? nlohmann::ordered_json(c.q_lora_rank) : nlohmann::ordered_json(nullptr);
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["topk_method"] = "noaux_tc";
  j["n_group"] = c.n_group;
  j["topk_group"] = c.topk_group;
  j["num_experts_per_tok"] = c.top_k;
  j["moe_layer_freq"] = 1;
  // Layer l is MoE when l >= first_k_dense_replace; with no MoE layer, none
  // is (MTP layers included).
  j["first_k_dense_replace"] = c.n_moe_layers() > 0 ? c.n_dense_layers : c.n_layers + mtp;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["scoring_func"] = "sigmoid";
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_seq_len;
  j["initializer_range"] = c.init_std;
  j["rms_norm_eps"] = c.norm_eps;
  j["use_cache"] = true;
  if (options.bos_token_id >= 0) j["bos_token_id"] = options.bos_token_id;
  if (!options.eos_token_ids.empty()) j["eos_token_id"] = EosJson(options.eos_token_ids);
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["rope_theta"] = c.rope_theta;
  nlohmann::ordered_json rs = RopeScalingJson(c);
  // DeepSeek's own form of an attention factor of 1: mscale = mscale_all_dim.
  if (c.rope_scaling == "yarn" && c.rope_mscale_all_dim > 0 && c.rope_attention_factor == 1.0) {
    rs.erase("attention_factor");
    rs["mscale"] = c.rope_mscale_all_dim;
  }
  j["rope_scaling"] = rs;
  j["rope_interleave"] = options.rope_interleave;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["torch_dtype"] = TorchDtype(options.dtype);
  return j;
}

}  // namespace

const std::vector<std::string>& TokenizerFileNames() {
  static const std::vector<std::string> k = {"tokenizer.json",      "tokenizer_config.json", "tokenizer.model",
                                             "special_tokens_map.json", "added_tokens.json", "vocab.json",
                                             "merges.txt",          "chat_template.jinja",   "chat_template.json"};
  return k;
}

Result<nlohmann::ordered_json> HfConfigFor(const ModelConfig& c, const HfExportOptions& options) {
  RETURN_IF_ERROR(c.Validate());
  if (c.dsa())
    return Status::Error("model: DSA sparse attention (model.attention=\"dsa\") has no equivalent in the Hugging Face "
                         "families Myriad exports (Llama, Qwen2, Qwen3, Qwen3-MoE, DeepSeek-V3)");
  // The [model] keys this mapping reads (ToJson writes a feature's keys only
  // when it is on): a feature added to ModelConfig later is refused here
  // until it is mapped, never exported as a model without it.
  static const std::set<std::string> kMapped = {
      "vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "n_dense_layers", "n_routed_experts",
      "n_shared_experts", "top_k", "d_expert", "score_func", "aux_loss_weight", "bias_update_rate", "mtp_depth",
      "mtp_loss_weight", "tie_embeddings", "rope_theta", "norm_eps", "max_seq_len", "init_std", "d_head", "qkv_bias",
      "qk_norm", "rope_truncate", "norm_topk_prob", "rope_scaling", "rope_factor", "rope_low_freq_factor",
      "rope_high_freq_factor", "rope_original_max_pos", "rope_beta_fast", "rope_beta_slow", "rope_attention_factor",
      "rope_mscale_all_dim", "routed_scaling_factor", "n_group", "topk_group", "dense_layers", "q_lora_rank",
      "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "mtp_after_final_norm"};
  const nlohmann::json ours = c.ToJson();
  for (auto it = ours.begin(); it != ours.end(); ++it)
    if (!kMapped.count(it.key()))
      return Status::Error("model: model." + it.key() + "=" + it.value().dump() +
                           " is not known to the Hugging Face export yet (hint: the feature has no mapping to a "
                           "family in src/model/hf/hf_export.cc)");
  if (c.mla()) return DeepseekV3ConfigFor(c, options);
  std::string arch, type;
  const bool moe = HasMoeLayers(c);
  if (moe) {
    if (std::string f = DeepseekOnlyFeatures(c); !f.empty())
      return Status::Error("model: " + f + " have no Qwen3MoeForCausalLM equivalent, and DeepseekV3ForCausalLM, "
                           "which has them, needs MLA: set model.kv_lora_rank > 0 (with q_lora_rank, "
                           "qk_nope_head_dim, qk_rope_head_dim and v_head_dim; this model's attention is GQA, "
                           "model.n_kv_heads=" + std::to_string(c.n_kv_heads) + ") to train a model that exports "
                           "as DeepSeek-V3 (hint: a Qwen3-MoE-shaped model — softmax scores, no shared experts, "
                           "model.qk_norm = true — exports too)");
    if (!c.qk_norm)
      return Status::Error("model: an MoE model without per-head q/k norms (model.qk_norm=false) has no Hugging Face "
                           "equivalent: Qwen3MoeForCausalLM, the MoE family with softmax routing, always normalises q "
                           "and k (hint: train with model.qk_norm = true to export as Qwen3-MoE)");
    if (c.qkv_bias)
      return Status::Error("model: q/k/v biases (model.qkv_bias=true) in an MoE model have no Hugging Face equivalent "
                           "(Qwen3MoeForCausalLM has none)");
    arch = "Qwen3MoeForCausalLM", type = "qwen3_moe";
  } else if (c.qkv_bias && c.qk_norm) {
    return Status::Error("model: q/k/v biases together with per-head q/k norms (model.qkv_bias and model.qk_norm) have "
                         "no Hugging Face equivalent (Qwen2ForCausalLM has the biases, Qwen3ForCausalLM the norms)");
  } else if (c.qkv_bias) {
    arch = "Qwen2ForCausalLM", type = "qwen2";
  } else if (c.qk_norm) {
    arch = "Qwen3ForCausalLM", type = "qwen3";
  } else {
    arch = "LlamaForCausalLM", type = "llama";
  }
  if (c.mtp_depth > 0 && !options.drop_mtp)
    return Status::Error("model: multi-token prediction modules (model.mtp_depth=" + std::to_string(c.mtp_depth) +
                         ") have no " + arch + " equivalent (hint: --drop-mtp exports the main model without them; " +
                         "they do not change its logits)");
  const bool qwen3 = type == "qwen3" || type == "qwen3_moe";
  nlohmann::ordered_json j = {{"architectures", {arch}},
                              {"model_type", type},
                              {"vocab_size", c.vocab_size},
                              {"hidden_size", c.d_model},
                              {"intermediate_size", c.d_ff},
                              {"num_hidden_layers", c.n_layers},
                              {"num_attention_heads", c.n_heads},
                              {"num_key_value_heads", c.n_kv_heads}};
  // Qwen3's default head_dim is 128, the others' hidden / heads.
  if (qwen3 || c.d_head > 0) j["head_dim"] = c.head_dim();
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = RopeScalingJson(c);
  j["tie_word_embeddings"] = c.tie_embeddings;
  if (type != "qwen2") j["attention_bias"] = false;  // (Qwen2's q/k/v biases have no key)
  if (type == "llama") j["mlp_bias"] = false;
  if (type == "qwen2") j["use_sliding_window"] = false;
  if (moe) {
    j["num_experts"] = c.n_routed_experts;
    j["num_experts_per_tok"] = c.top_k;
    j["moe_intermediate_size"] = c.d_expert;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["decoder_sparse_step"] = 1;
    std::vector<int64_t> dense;  // the dense prefix and the dense layers after it
    for (int64_t l = 0; l < c.n_layers; ++l)
      if (!c.is_moe_layer(l)) dense.push_back(l);
    j["mlp_only_layers"] = dense;
  }
  j["initializer_range"] = c.init_std;
  j["use_cache"] = true;
  j["torch_dtype"] = TorchDtype(options.dtype);
  if (options.bos_token_id >= 0) j["bos_token_id"] = options.bos_token_id;
  if (!options.eos_token_ids.empty()) j["eos_token_id"] = EosJson(options.eos_token_ids);
  return j;
}

namespace {

// Writes the folder's files into `dir` (which exists and is empty).
Status WriteFolder(const Model& model, const std::string& dir, const nlohmann::ordered_json& config,
                   const HfExportOptions& options, Env* env) {
  const ModelConfig& cfg = model.config();
  const std::string arch = config["architectures"][0];
  const auto& bias_names = model.layout().bias_names();
  auto is_mtp = [](const std::string& ours) { return ours.rfind("model.mtp.", 0) == 0; };
  const bool deepseek = arch == "DeepseekV3ForCausalLM";
  // No family but DeepSeek-V3 has a selection bias: elsewhere a trained one must be zero.
  for (size_t i = 0; i < bias_names.size() && !deepseek; ++i) {
    if (options.drop_mtp && is_mtp(bias_names[i])) continue;
    float max_abs = 0;
    for (float b : model.biases()[i]) max_abs = std::max(max_abs, std::fabs(b));
    if (max_abs > 0)
      return Status::Error("model: " + bias_names[i] + " is non-zero (max |b| = " + Num(max_abs) +
                           "): a selection bias has no " + arch + " equivalent (it was trained with "
                           "model.bias_update_rate > 0; hint: train with bias_update_rate = 0 to export)");
  }
  const std::vector<float> params = model.ParamsToHost();
  // The folder's layout where it differs from ours (FromOurLayout: DeepSeek's
  // interleaved RoPE rows and eh_proj halves), in copies that outlive the write.
  HfModelInfo layout_info;
  layout_info.config = cfg;
  layout_info.rope_interleave = config.value("rope_interleave", false);
  std::deque<std::vector<float>> changed;
  std::vector<HfTensorToWrite> tensors;
  const float* embed = nullptr;
  const float* head = nullptr;
  for (const ParamInfo& p : model.layout().params()) {
    if (options.drop_mtp && is_mtp(p.name)) continue;
    const float* data = params.data() + p.offset;
    std::vector<float> v(data, data + p.numel);
    FromOurLayout(layout_info, p, &v);
    if (!std::equal(v.begin(), v.end(), data)) data = changed.emplace_back(std::move(v)).data();
    if (p.name == "model.embed_tokens.weight") embed = data;
    if (p.name == "lm_head.weight") head = data;
    tensors.push_back({HfTensorName(cfg, p.name), p.shape, data, options.dtype});
  }
  if (deepseek) {
    // The selection biases as e_score_correction_bias (F32, as DeepSeek keeps
    // them), and each MTP layer's own copies of the embedding and the head.
    for (size_t i = 0; i < bias_names.size(); ++i) {
      if (options.drop_mtp && is_mtp(bias_names[i])) continue;
      tensors.push_back({HfTensorName(cfg, bias_names[i]), {cfg.n_routed_experts}, model.biases()[i].data(), "F32"});
    }
    const int64_t mtp = options.drop_mtp ? 0 : cfg.mtp_depth;
    for (int64_t j = 0; j < mtp; ++j) {
      const std::string layer = "model.layers." + std::to_string(cfg.n_layers + j) + ".";
      tensors.push_back({layer + "embed_tokens.weight", {cfg.vocab_size, cfg.d_model}, embed, options.dtype});
      tensors.push_back({layer + "shared_head.head.weight", {cfg.vocab_size, cfg.d_model},
                         cfg.tie_embeddings ? embed : head, options.dtype});
    }
  }
  LOG_INFO("export: %s, %zu tensors (%s) to %s", arch.c_str(), tensors.size(), options.dtype.c_str(), dir.c_str());
  HfWriteOptions wo;
  wo.max_shard_bytes = options.max_shard_bytes;
  ASSIGN_OR_RETURN(HfWrittenWeights written, WriteHfWeights(env, dir, tensors, wo));
  LOG_INFO("export: weights: %zu file(s), %.1f MB of tensors", written.files.size(), written.total_size / 1e6);
  RETURN_IF_ERROR(WriteFileAtomic(env, dir + "/config.json", config.dump(2) + "\n"));
  nlohmann::ordered_json gen = nlohmann::ordered_json::object();
  if (options.bos_token_id >= 0) gen["bos_token_id"] = options.bos_token_id;
  if (!options.eos_token_ids.empty()) gen["eos_token_id"] = EosJson(options.eos_token_ids);
  RETURN_IF_ERROR(WriteFileAtomic(env, dir + "/generation_config.json", gen.dump(2) + "\n"));
  if (!options.tokenizer_from.empty()) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path from(options.tokenizer_from);
    const bool is_dir = fs::is_directory(from, ec);
    if (!is_dir) {
      const auto& names = TokenizerFileNames();
      if (!fs::exists(from, ec)) return Status::Error(options.tokenizer_from + ": tokenizer not found");
      if (std::find(names.begin(), names.end(), from.filename().string()) == names.end())
        return Status::Error(options.tokenizer_from + ": not a tokenizer file name a Hugging Face folder has "
                             "(tokenizer.json, tokenizer.model, ...)");
    }
    const fs::path src_dir = is_dir ? from : from.parent_path();
    int copied = 0;
    for (const std::string& name : TokenizerFileNames()) {
      const fs::path src = src_dir / name;
      if (!fs::is_regular_file(src, ec)) continue;
      ASSIGN_OR_RETURN(std::string bytes, env->ReadFile(src.string()));
      RETURN_IF_ERROR(WriteFileAtomic(env, dir + "/" + name, bytes));
      ++copied;
    }
    if (copied == 0) return Status::Error(options.tokenizer_from + ": no tokenizer file to copy");
    LOG_INFO("export: %d tokenizer file(s) from %s", copied, src_dir.string().c_str());
  }
  return env->SyncDir(dir);
}

}  // namespace

Status ExportHfModel(const Model& model, const std::string& out_path, const HfExportOptions& options, Env* env) {
  namespace fs = std::filesystem;
  std::string out_dir = out_path;  // (out/ would put out/.tmp inside it)
  while (out_dir.size() > 1 && out_dir.back() == '/') out_dir.pop_back();
  ASSIGN_OR_RETURN(nlohmann::ordered_json config, HfConfigFor(model.config(), options));
  std::error_code ec;
  const bool exists = fs::exists(out_dir, ec);
  if (exists && !fs::is_directory(out_dir, ec)) return Status::Error(out_dir + ": exists and is not a folder");
  if (exists && !fs::is_empty(out_dir, ec) && !options.overwrite)
    return Status::Error(out_dir + ": exists and is not empty (hint: --force replaces it)");
  // Written beside out_dir, then renamed into place: out_dir is never half written.
  const std::string tmp = out_dir + ".tmp", old = out_dir + ".old";
  (void)env->RemoveAll(tmp);
  RETURN_IF_ERROR(env->CreateDirs(tmp));
  Status s = WriteFolder(model, tmp, config, options, env);
  if (s.ok() && exists) {
    (void)env->RemoveAll(old);
    s = env->RenameFile(out_dir, old);
  }
  if (s.ok()) s = env->RenameFile(tmp, out_dir);
  if (!s.ok()) {
    if (exists && !fs::exists(out_dir, ec) && fs::exists(old, ec)) (void)env->RenameFile(old, out_dir);  // put it back
    (void)env->RemoveAll(tmp);
    // Messages name the output, not the temporary folder it is written in.
    std::string m = s.message();
    for (size_t at = m.find(tmp); at != std::string::npos; at = m.find(tmp, at + out_dir.size()))
      m.replace(at, tmp.size(), out_dir);
    return Status::Error(m);
  }
  if (exists) (void)env->RemoveAll(old);
  const std::string parent = fs::path(out_dir).parent_path().string();
  RETURN_IF_ERROR(env->SyncDir(parent.empty() ? "." : parent));
  LOG_INFO("export: %s written to %s", config["architectures"][0].get<std::string>().c_str(), out_dir.c_str());
  return Status::Ok();
}

}  // namespace myriad::hf

#include "model/config.h"

#include <cmath>
#include <utility>

#include "core/checked_size.h"

namespace myriad {

namespace {

// Every integer key of [model] and its range (docs/config.md, "Ranges"):
// wide enough for any model Myriad plans or trains, narrow enough that no
// value makes a loop run for ever or a size wrap. Sizes built from several
// keys are checked separately (CheckSizes).
struct IntKey {
  const char* name;
  int64_t ModelConfig::*field;
  int64_t lo, hi;
};
constexpr int64_t kMaxWidth = int64_t{1} << 22;  // FFN and expert widths
constexpr IntKey kIntKeys[] = {
    {"vocab_size", &ModelConfig::vocab_size, 1, (int64_t{1} << 31) - 1},  // token ids are int32
    {"d_model", &ModelConfig::d_model, 1, int64_t{1} << 20},
    {"n_layers", &ModelConfig::n_layers, 1, 1024},
    {"n_heads", &ModelConfig::n_heads, 1, 65536},
    {"n_kv_heads", &ModelConfig::n_kv_heads, 1, 65536},
    {"d_ff", &ModelConfig::d_ff, 0, kMaxWidth},
    {"n_dense_layers", &ModelConfig::n_dense_layers, 0, 1024},
    {"n_routed_experts", &ModelConfig::n_routed_experts, 0, 256},  // the router's limit
    {"n_shared_experts", &ModelConfig::n_shared_experts, 0, 64},
    {"top_k", &ModelConfig::top_k, 0, 64},
    {"d_expert", &ModelConfig::d_expert, 0, kMaxWidth},
    {"mtp_depth", &ModelConfig::mtp_depth, 0, 16},
    {"max_seq_len", &ModelConfig::max_seq_len, 1, int64_t{1} << 24},
    {"dsa_topk", &ModelConfig::dsa_topk, 1, int64_t{1} << 24},
    {"dsa_index_heads", &ModelConfig::dsa_index_heads, 1, 1024},
    {"dsa_index_dim", &ModelConfig::dsa_index_dim, 1, 4096},
    {"dsa_index_share", &ModelConfig::dsa_index_share, 1, 1024},
    {"dsa_warmup_steps", &ModelConfig::dsa_warmup_steps, 0, 1000000000},
    {"dsa_index_rope_dim", &ModelConfig::dsa_index_rope_dim, 0, 4096},
    {"d_head", &ModelConfig::d_head, 0, 65536},
    {"rope_original_max_pos", &ModelConfig::rope_original_max_pos, 0, int64_t{1} << 24},
    {"n_group", &ModelConfig::n_group, 1, 256},
    {"topk_group", &ModelConfig::topk_group, 1, 256},
    {"q_lora_rank", &ModelConfig::q_lora_rank, 0, 65536},
    {"kv_lora_rank", &ModelConfig::kv_lora_rank, 0, 65536},
    {"qk_nope_head_dim", &ModelConfig::qk_nope_head_dim, 0, 4096},
    {"qk_rope_head_dim", &ModelConfig::qk_rope_head_dim, 0, 4096},
    {"v_head_dim", &ModelConfig::v_head_dim, 0, 4096},
};

// The float keys, each finite; `positive` ones > 0.
struct FloatKey {
  const char* name;
  double ModelConfig::*field;
  bool positive;
};
constexpr FloatKey kFloatKeys[] = {
    {"aux_loss_weight", &ModelConfig::aux_loss_weight, false},
    {"bias_update_rate", &ModelConfig::bias_update_rate, false},
    {"mtp_loss_weight", &ModelConfig::mtp_loss_weight, false},
    {"rope_theta", &ModelConfig::rope_theta, true},
    {"norm_eps", &ModelConfig::norm_eps, true},
    {"init_std", &ModelConfig::init_std, true},
    {"rope_factor", &ModelConfig::rope_factor, true},
    {"rope_low_freq_factor", &ModelConfig::rope_low_freq_factor, true},
    {"rope_high_freq_factor", &ModelConfig::rope_high_freq_factor, true},
    {"rope_beta_fast", &ModelConfig::rope_beta_fast, true},
    {"rope_beta_slow", &ModelConfig::rope_beta_slow, true},
    {"rope_attention_factor", &ModelConfig::rope_attention_factor, false},
    {"routed_scaling_factor", &ModelConfig::routed_scaling_factor, true},
    {"rope_mscale_all_dim", &ModelConfig::rope_mscale_all_dim, false},
};

// The bool keys.
struct BoolKey {
  const char* name;
  bool ModelConfig::*field;
};
constexpr BoolKey kBoolKeys[] = {
    {"tie_embeddings", &ModelConfig::tie_embeddings}, {"qkv_bias", &ModelConfig::qkv_bias},
    {"qk_norm", &ModelConfig::qk_norm},               {"rope_truncate", &ModelConfig::rope_truncate},
    {"norm_topk_prob", &ModelConfig::norm_topk_prob}, {"mtp_after_final_norm", &ModelConfig::mtp_after_final_norm},
};

}  // namespace

ModelConfig ModelConfig::Read(ConfigDoc* doc, const ModelConfig* base) {
  ModelConfig c = base ? *base : ModelConfig();
  for (const IntKey& k : kIntKeys) {
    // A TOML config without dsa_index_rope_dim gets dsa_index_dim / 2 (read before it).
    if (k.field == &ModelConfig::dsa_index_rope_dim && !base) c.dsa_index_rope_dim = (c.dsa_index_dim / 2) & ~int64_t{1};
    c.*k.field = doc->GetInt(std::string("model.") + k.name, c.*k.field, k.lo, k.hi);
  }
  c.score_func = doc->GetString("model.score_func", c.score_func);
  for (const FloatKey& k : kFloatKeys) c.*k.field = doc->GetFloat(std::string("model.") + k.name, c.*k.field);
  for (const BoolKey& k : kBoolKeys) c.*k.field = doc->GetBool(std::string("model.") + k.name, c.*k.field);
  c.rope_scaling = doc->GetString("model.rope_scaling", c.rope_scaling);
  if (!base || doc->Has("model.dense_layers")) c.dense_layers = doc->GetIntList("model.dense_layers", 0, 1 << 20);
  c.attention = doc->GetString("model.attention", c.attention);
  c.dsa_index_precision = doc->GetString("model.dsa_index_precision", c.dsa_index_precision);
  return c;
}

ModelConfig ModelConfig::WithTrainingKeysOf(const ModelConfig& other) const {
  ModelConfig c = *this;
  c.aux_loss_weight = other.aux_loss_weight;
  c.bias_update_rate = other.bias_update_rate;
  c.mtp_loss_weight = other.mtp_loss_weight;
  c.init_std = other.init_std;
  c.dsa_warmup_steps = other.dsa_warmup_steps;
  return c;
}

Status ModelConfig::CheckSizes() const {
  // Upper bounds, in bytes, of what the model's shapes allocate; each is
  // computed with CheckedSize, so a size that would wrap names its keys.
  using S = CheckedSize;
  const S V = S::Key("model.vocab_size", vocab_size), C = S::Key("model.d_model", d_model);
  const S L = S::Key("model.n_layers", n_layers) + S::Key("model.mtp_depth", mtp_depth);
  const S F = S::Key("model.d_ff", d_ff), E = S::Key("model.n_routed_experts", n_routed_experts);
  const S Fe = S::Key("model.d_expert", d_expert), Sh = S::Key("model.n_shared_experts", n_shared_experts);
  const S T = S::Key("model.max_seq_len", max_seq_len);
  // A block: attention (q, k, v, o: at most C x C each), the dense FFN and
  // the MoE (router, routed and shared experts) both counted, the indexer,
  // and an MTP module's projection [C, 2C].
  const S HD = S::Key("model.n_heads", n_heads) * S::Key("model.d_head", head_dim());
  S block = S(4) * C * C + S(4) * HD * C + S(4) * HD + S(3) * C * F + E * C + S(3) * E * C * Fe + S(3) * Sh * C * Fe + S(2) * C * C + S(8) * C;
  if (mla()) {
    const S Hs = S::Key("model.n_heads", n_heads), R = S::Key("model.kv_lora_rank", kv_lora_rank);
    const S Qr = S::Key("model.q_lora_rank", q_lora_rank), Dr = S::Key("model.qk_rope_head_dim", qk_rope_head_dim);
    const S Dqk = S::Key("model.qk_nope_head_dim", qk_nope_head_dim) + Dr, Dv = S::Key("model.v_head_dim", v_head_dim);
    block += Qr * C + (Qr + C) * Hs * Dqk + (R + Dr) * C + R * Hs * (Dqk + Dv) + C * Hs * Dv + Qr + R;
  }
  if (dsa())
    block += (S::Key("model.dsa_index_heads", dsa_index_heads) + S(1)) * (S::Key("model.dsa_index_dim", dsa_index_dim) + S(1)) * C;
  const S params = S(2) * V * C + L * block;
  // Weights, gradients and two AdamW moments, fp32.
  RETURN_IF_ERROR((S(16) * params).Check("model: the parameters' size"));
  RETURN_IF_ERROR((S(8) * T * C).Check("model: the RoPE tables' size"));
  // Keys and values of one sequence of max_seq_len tokens, every layer (fp32).
  RETURN_IF_ERROR((S(8) * L * T * C).Check("model: one sequence's KV cache size"));
  if (mla())  // the latent cache, and the attention rows training pads to one width
    RETURN_IF_ERROR((S(12) * L * T * S::Key("model.n_heads", n_heads) *
                     (S::Key("model.kv_lora_rank", kv_lora_rank) + S::Key("model.qk_rope_head_dim", qk_rope_head_dim) +
                      S::Key("model.qk_nope_head_dim", qk_nope_head_dim) + S::Key("model.v_head_dim", v_head_dim)))
                        .Check("model: one sequence's MLA attention rows"));
  return Status::Ok();
}

Status ModelConfig::Validate() const {
  auto bad = [](const std::string& m) { return Status::Error(m); };
  // The ranges first (a config read from JSON has not been through Read's).
  for (const IntKey& k : kIntKeys)
    if (this->*k.field < k.lo || this->*k.field > k.hi)
      return bad(OutOfRange(std::string("model.") + k.name, this->*k.field, k.lo, k.hi));
  // Floats: finite, and (written so that NaN fails too) on the right side of 0.
  for (const FloatKey& k : kFloatKeys) {
    const double v = this->*k.field;
    if (!std::isfinite(v)) return bad(std::string("model.") + k.name + "=" + std::to_string(v) + " must be a finite number");
    if (k.positive && !(v > 0)) return bad(std::string("model.") + k.name + "=" + std::to_string(v) + " must be positive");
  }
  auto positive = [&](const char* name, int64_t v) -> Status {
    if (v <= 0) return bad(std::string("model.") + name + "=" + std::to_string(v) + " must be positive");
    return Status::Ok();
  };
  if (d_head == 0 && d_model % n_heads)
    return bad("model.n_heads=" + std::to_string(n_heads) + " does not divide d_model=" + std::to_string(d_model) +
               " (hint: d_model must be a multiple of n_heads)");
  if (head_dim() % 2)
    return bad("model.head_dim=" + std::to_string(head_dim()) + " is odd (hint: RoPE needs an even head dim)");
  if (!mla() && n_heads % n_kv_heads)  // (MLA has no kv heads)
    return bad("model.n_kv_heads=" + std::to_string(n_kv_heads) + " does not divide n_heads=" + std::to_string(n_heads) +
               " (hint: each kv head serves a whole group of query heads)");
  if (n_dense_layers > n_layers)
    return bad("model.n_dense_layers=" + std::to_string(n_dense_layers) + " must be in [0, n_layers=" +
               std::to_string(n_layers) + "]");
  for (size_t i = 0; i < dense_layers.size(); ++i) {
    const int64_t l = dense_layers[i];
    if (n_routed_experts == 0 || l < n_dense_layers || l >= n_layers || (i > 0 && l <= dense_layers[i - 1]))
      return bad("model.dense_layers: " + std::to_string(l) + " is not a layer after the dense prefix (hint: ascending "
                 "indices in [n_dense_layers=" + std::to_string(n_dense_layers) + ", n_layers=" +
                 std::to_string(n_layers) + ") of an MoE model)");
  }
  bool any_dense = has_dense_layers() || (mtp_depth > 0 && !mtp_block_is_moe());
  if (any_dense && d_ff <= 0) return bad("model.d_ff=" + std::to_string(d_ff) + " must be positive for dense layers");
  if (n_moe_layers() > 0) {
    if (top_k <= 0 || top_k > n_routed_experts)
      return bad("model.top_k=" + std::to_string(top_k) + " must be in [1, n_routed_experts=" +
                 std::to_string(n_routed_experts) + "]");
    RETURN_IF_ERROR(positive("d_expert", d_expert));
  }
  if (n_routed_experts == 0 && n_dense_layers < n_layers)
    return bad("model.n_dense_layers=" + std::to_string(n_dense_layers) + " < n_layers=" + std::to_string(n_layers) +
               " but n_routed_experts=0 (hint: set n_dense_layers = n_layers for a dense model)");
  if (score_func != "softmax" && score_func != "sigmoid")
    return bad("model.score_func=\"" + score_func + "\" is not known (hint: \"softmax\" or \"sigmoid\")");
  for (auto [name, v] : {std::pair{"aux_loss_weight", aux_loss_weight}, {"bias_update_rate", bias_update_rate},
                         {"mtp_loss_weight", mtp_loss_weight}})
    if (v < 0) return bad(std::string("model.") + name + "=" + std::to_string(v) + " must be >= 0");
  if (!(rope_theta > 1)) return bad("model.rope_theta must be > 1");
  if (rope_scaling != "none" && rope_scaling != "linear" && rope_scaling != "llama3" && rope_scaling != "yarn")
    return bad("model.rope_scaling=\"" + rope_scaling + "\" is not known (hint: \"none\", \"linear\", \"llama3\" or \"yarn\")");
  if (rope_scaling == "llama3" && !(rope_high_freq_factor > rope_low_freq_factor))
    return bad("model.rope_high_freq_factor must be greater than rope_low_freq_factor");
  if (rope_attention_factor < 0) return bad("model.rope_attention_factor must be >= 0 (0: the yarn default)");
  if (n_routed_experts > 0) {
    if (n_routed_experts % n_group)
      return bad("model.n_group=" + std::to_string(n_group) + " does not divide n_routed_experts=" +
                 std::to_string(n_routed_experts));
    if (topk_group > n_group)
      return bad("model.topk_group=" + std::to_string(topk_group) + " must be in [1, n_group=" + std::to_string(n_group) + "]");
    if (top_k > topk_group * (n_routed_experts / n_group))
      return bad("model.top_k=" + std::to_string(top_k) + " exceeds the experts of topk_group=" +
                 std::to_string(topk_group) + " groups (" + std::to_string(topk_group * (n_routed_experts / n_group)) + ")");
  }
  if (mla()) {
    auto mla_bad = [&](const std::string& m) { return bad("model.kv_lora_rank=" + std::to_string(kv_lora_rank) + " (MLA): " + m); };
    if (qk_rope_head_dim <= 0 || qk_rope_head_dim % 2)
      return mla_bad("qk_rope_head_dim=" + std::to_string(qk_rope_head_dim) + " must be positive and even (hint: RoPE rotates pairs)");
    if (qk_nope_head_dim <= 0) return mla_bad("qk_nope_head_dim=" + std::to_string(qk_nope_head_dim) + " must be positive");
    if (v_head_dim <= 0) return mla_bad("v_head_dim=" + std::to_string(v_head_dim) + " must be positive");
    if (qkv_bias || qk_norm || d_head != 0)
      return mla_bad("qkv_bias, qk_norm and d_head belong to q/k/v attention (hint: unset them; MLA has its own widths)");
    if (dsa()) return mla_bad("attention=\"dsa\" is not supported with MLA (hint: attention=\"dense\")");
  } else if (q_lora_rank || qk_nope_head_dim || qk_rope_head_dim || v_head_dim) {
    return bad("model.q_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim are MLA's (hint: set kv_lora_rank > 0 "
               "for multi-head latent attention, or leave them 0)");
  }
  if (rope_mscale_all_dim < 0) return bad("model.rope_mscale_all_dim must be >= 0");
  if (attention != "dense" && attention != "dsa")
    return bad("model.attention=\"" + attention + "\" is not known (hint: \"dense\" or \"dsa\")");
  if (dsa()) {
    if (dsa_index_precision != "fp32" && dsa_index_precision != "int8")
      return bad("model.dsa_index_precision=\"" + dsa_index_precision + "\" is not known (hint: \"fp32\" or \"int8\")");
    if (dsa_index_rope_dim > dsa_index_dim || dsa_index_rope_dim % 2)
      return bad("model.dsa_index_rope_dim=" + std::to_string(dsa_index_rope_dim) +
                 " must be even and within [0, dsa_index_dim=" + std::to_string(dsa_index_dim) + "]");
    if (dsa_index_precision == "int8" && dsa_index_dim > 256)
      return bad("model.dsa_index_dim=" + std::to_string(dsa_index_dim) + " is too large for the int8 indexer (at most 256)");
  }
  return CheckSizes();
}

nlohmann::json ModelConfig::ToJson() const {
  nlohmann::json j = {{"vocab_size", vocab_size}, {"d_model", d_model}, {"n_layers", n_layers},
          {"n_heads", n_heads}, {"n_kv_heads", n_kv_heads}, {"d_ff", d_ff},
          {"n_dense_layers", n_dense_layers}, {"n_routed_experts", n_routed_experts},
          {"n_shared_experts", n_shared_experts}, {"top_k", top_k}, {"d_expert", d_expert},
          {"score_func", score_func}, {"aux_loss_weight", aux_loss_weight},
          {"bias_update_rate", bias_update_rate}, {"mtp_depth", mtp_depth},
          {"mtp_loss_weight", mtp_loss_weight}, {"tie_embeddings", tie_embeddings},
          {"rope_theta", rope_theta}, {"norm_eps", norm_eps}, {"max_seq_len", max_seq_len},
          {"init_std", init_std}};
  // The open-model keys only where they differ from our defaults, so that
  // our own configs keep their JSON (and old checkpoints match).
  const ModelConfig def;
  if (d_head != def.d_head) j["d_head"] = d_head;
  for (const BoolKey& k : kBoolKeys)
    if (k.field != &ModelConfig::tie_embeddings && this->*k.field != def.*k.field) j[k.name] = this->*k.field;
  if (rope_scaling != def.rope_scaling)
    j.update({{"rope_scaling", rope_scaling}, {"rope_factor", rope_factor},
              {"rope_low_freq_factor", rope_low_freq_factor}, {"rope_high_freq_factor", rope_high_freq_factor},
              {"rope_original_max_pos", rope_original_max_pos}, {"rope_beta_fast", rope_beta_fast},
              {"rope_beta_slow", rope_beta_slow}, {"rope_attention_factor", rope_attention_factor}});
  if (!dense_layers.empty()) j["dense_layers"] = dense_layers;
  if (routed_scaling_factor != def.routed_scaling_factor) j["routed_scaling_factor"] = routed_scaling_factor;
  if (n_group != def.n_group || topk_group != def.topk_group) j.update({{"n_group", n_group}, {"topk_group", topk_group}});
  if (mla())
    j.update({{"q_lora_rank", q_lora_rank}, {"kv_lora_rank", kv_lora_rank}, {"qk_nope_head_dim", qk_nope_head_dim},
              {"qk_rope_head_dim", qk_rope_head_dim}, {"v_head_dim", v_head_dim}});
  if (rope_mscale_all_dim != def.rope_mscale_all_dim) j["rope_mscale_all_dim"] = rope_mscale_all_dim;
  // Only when on, so that dense configs keep their JSON (and old checkpoints match).
  if (dsa())
    j.update({{"attention", attention}, {"dsa_topk", dsa_topk}, {"dsa_index_heads", dsa_index_heads},
              {"dsa_index_dim", dsa_index_dim}, {"dsa_index_share", dsa_index_share},
              {"dsa_warmup_steps", dsa_warmup_steps}, {"dsa_index_precision", dsa_index_precision},
              {"dsa_index_rope_dim", dsa_index_rope_dim}});
  return j;
}

Result<ModelConfig> ModelConfig::FromJson(const nlohmann::json& j) {
  ModelConfig c;
  try {
#define FROM(field) if (j.contains(#field)) j.at(#field).get_to(c.field)
    FROM(vocab_size); FROM(d_model); FROM(n_layers); FROM(n_heads); FROM(n_kv_heads); FROM(d_ff);
    FROM(n_dense_layers); FROM(n_routed_experts); FROM(n_shared_experts); FROM(top_k); FROM(d_expert);
    FROM(score_func); FROM(aux_loss_weight); FROM(bias_update_rate); FROM(mtp_depth);
    FROM(mtp_loss_weight); FROM(tie_embeddings); FROM(rope_theta); FROM(norm_eps);
    FROM(max_seq_len); FROM(init_std);
    FROM(attention); FROM(dsa_topk); FROM(dsa_index_heads); FROM(dsa_index_dim); FROM(dsa_index_share);
    FROM(dsa_warmup_steps); FROM(dsa_index_precision); FROM(dsa_index_rope_dim);
    FROM(d_head); FROM(qkv_bias); FROM(qk_norm); FROM(rope_truncate); FROM(norm_topk_prob);
    FROM(rope_scaling); FROM(rope_factor); FROM(rope_low_freq_factor); FROM(rope_high_freq_factor);
    FROM(rope_original_max_pos); FROM(rope_beta_fast); FROM(rope_beta_slow); FROM(rope_attention_factor);
    FROM(routed_scaling_factor); FROM(n_group); FROM(topk_group); FROM(dense_layers);
    FROM(q_lora_rank); FROM(kv_lora_rank); FROM(qk_nope_head_dim); FROM(qk_rope_head_dim); FROM(v_head_dim);
    FROM(rope_mscale_all_dim); FROM(mtp_after_final_norm);
#undef FROM
  } catch (const std::exception& e) {
    return Status::Error(std::string("model config: ") + e.what());
  }
  RETURN_IF_ERROR(c.Validate());
  return c;
}

}  // namespace myriad

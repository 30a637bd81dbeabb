#include "model/config.h"

namespace myriad {

#define MODEL_INT(field) c.field = doc->GetInt("model." #field, c.field)
#define MODEL_FLOAT(field) c.field = doc->GetFloat("model." #field, c.field)

ModelConfig ModelConfig::Read(ConfigDoc* doc) {
  ModelConfig c;
  MODEL_INT(vocab_size);
  MODEL_INT(d_model);
  MODEL_INT(n_layers);
  MODEL_INT(n_heads);
  MODEL_INT(n_kv_heads);
  MODEL_INT(d_ff);
  MODEL_INT(n_dense_layers);
  MODEL_INT(n_routed_experts);
  MODEL_INT(n_shared_experts);
  MODEL_INT(top_k);
  MODEL_INT(d_expert);
  c.score_func = doc->GetString("model.score_func", c.score_func);
  MODEL_FLOAT(aux_loss_weight);
  MODEL_FLOAT(bias_update_rate);
  MODEL_INT(mtp_depth);
  MODEL_FLOAT(mtp_loss_weight);
  c.tie_embeddings = doc->GetBool("model.tie_embeddings", c.tie_embeddings);
  MODEL_FLOAT(rope_theta);
  MODEL_FLOAT(norm_eps);
  MODEL_INT(max_seq_len);
  MODEL_FLOAT(init_std);
  c.attention = doc->GetString("model.attention", c.attention);
  MODEL_INT(dsa_topk);
  MODEL_INT(dsa_index_heads);
  MODEL_INT(dsa_index_dim);
  MODEL_INT(dsa_index_share);
  MODEL_INT(dsa_warmup_steps);
  c.dsa_index_precision = doc->GetString("model.dsa_index_precision", c.dsa_index_precision);
  c.dsa_index_rope_dim = doc->GetInt("model.dsa_index_rope_dim", (c.dsa_index_dim / 2) & ~int64_t{1});
  return c;
}

Status ModelConfig::Validate() const {
  auto bad = [](const std::string& m) { return Status::Error(m); };
  auto positive = [&](const char* name, int64_t v) -> Status {
    if (v <= 0) return bad(std::string("model.") + name + "=" + std::to_string(v) + " must be positive");
    return Status::Ok();
  };
  RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  RETURN_IF_ERROR(positive("d_model", d_model));
  RETURN_IF_ERROR(positive("n_layers", n_layers));
  RETURN_IF_ERROR(positive("n_heads", n_heads));
  RETURN_IF_ERROR(positive("n_kv_heads", n_kv_heads));
  RETURN_IF_ERROR(positive("max_seq_len", max_seq_len));
  if (vocab_size > (int64_t{1} << 31) - 1) return bad("model.vocab_size=" + std::to_string(vocab_size) + " is too large");
  if (d_model % n_heads)
    return bad("model.n_heads=" + std::to_string(n_heads) + " does not divide d_model=" + std::to_string(d_model) +
               " (hint: d_model must be a multiple of n_heads)");
  if (head_dim() % 2)
    return bad("model.d_model/n_heads=" + std::to_string(head_dim()) + " is odd (hint: RoPE needs an even head dim)");
  if (n_heads % n_kv_heads)
    return bad("model.n_kv_heads=" + std::to_string(n_kv_heads) + " does not divide n_heads=" + std::to_string(n_heads) +
               " (hint: each kv head serves a whole group of query heads)");
  if (n_dense_layers < 0 || n_dense_layers > n_layers)
    return bad("model.n_dense_layers=" + std::to_string(n_dense_layers) + " must be in [0, n_layers=" +
               std::to_string(n_layers) + "]");
  bool any_dense = n_dense_layers > 0 || n_routed_experts == 0 || (mtp_depth > 0 && !mtp_block_is_moe());
  if (any_dense && d_ff <= 0) return bad("model.d_ff=" + std::to_string(d_ff) + " must be positive for dense layers");
  if (n_routed_experts < 0) return bad("model.n_routed_experts must be >= 0");
  if (n_routed_experts > 0 && n_layers > n_dense_layers) {
    if (top_k <= 0 || top_k > n_routed_experts)
      return bad("model.top_k=" + std::to_string(top_k) + " must be in [1, n_routed_experts=" +
                 std::to_string(n_routed_experts) + "]");
    RETURN_IF_ERROR(positive("d_expert", d_expert));
    if (n_routed_experts > 256) return bad("model.n_routed_experts=" + std::to_string(n_routed_experts) + " exceeds 256 (hint: the router supports up to 256 experts)");
    if (top_k > 64) return bad("model.top_k=" + std::to_string(top_k) + " exceeds 64");
    if (n_shared_experts < 0) return bad("model.n_shared_experts must be >= 0");
  }
  if (n_routed_experts == 0 && n_dense_layers < n_layers)
    return bad("model.n_dense_layers=" + std::to_string(n_dense_layers) + " < n_layers=" + std::to_string(n_layers) +
               " but n_routed_experts=0 (hint: set n_dense_layers = n_layers for a dense model)");
  if (score_func != "softmax" && score_func != "sigmoid")
    return bad("model.score_func=\"" + score_func + "\" is not known (hint: \"softmax\" or \"sigmoid\")");
  if (mtp_depth < 0) return bad("model.mtp_depth must be >= 0");
  if (aux_loss_weight < 0 || bias_update_rate < 0 || mtp_loss_weight < 0)
    return bad("model loss weights and rates must be >= 0");
  if (norm_eps <= 0) return bad("model.norm_eps must be positive");
  if (rope_theta <= 1) return bad("model.rope_theta must be > 1");
  if (init_std <= 0) return bad("model.init_std must be positive");
  if (attention != "dense" && attention != "dsa")
    return bad("model.attention=\"" + attention + "\" is not known (hint: \"dense\" or \"dsa\")");
  if (dsa()) {
    RETURN_IF_ERROR(positive("dsa_topk", dsa_topk));
    RETURN_IF_ERROR(positive("dsa_index_heads", dsa_index_heads));
    RETURN_IF_ERROR(positive("dsa_index_dim", dsa_index_dim));
    RETURN_IF_ERROR(positive("dsa_index_share", dsa_index_share));
    if (dsa_warmup_steps < 0) return bad("model.dsa_warmup_steps must be >= 0");
    if (dsa_index_precision != "fp32" && dsa_index_precision != "int8")
      return bad("model.dsa_index_precision=\"" + dsa_index_precision + "\" is not known (hint: \"fp32\" or \"int8\")");
    if (dsa_index_rope_dim < 0 || dsa_index_rope_dim > dsa_index_dim || dsa_index_rope_dim % 2)
      return bad("model.dsa_index_rope_dim=" + std::to_string(dsa_index_rope_dim) +
                 " must be even and within [0, dsa_index_dim=" + std::to_string(dsa_index_dim) + "]");
    if (dsa_index_precision == "int8" && dsa_index_dim > 256)
      return bad("model.dsa_index_dim=" + std::to_string(dsa_index_dim) + " is too large for the int8 indexer (at most 256)");
  }
  return Status::Ok();
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
#undef FROM
  } catch (const std::exception& e) {
    return Status::Error(std::string("model config: ") + e.what());
  }
  RETURN_IF_ERROR(c.Validate());
  return c;
}

}  // namespace myriad

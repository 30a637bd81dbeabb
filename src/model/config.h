// ModelConfig: the [model] section of a config, with its defaults and checks.
// docs/model.md defines what each field means.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/status.h"

namespace myriad {

struct ModelConfig {
  int64_t vocab_size = 4096;
  int64_t d_model = 256;
  int64_t n_layers = 4;
  int64_t n_heads = 8;
  int64_t n_kv_heads = 8;
  int64_t d_ff = 1024;
  int64_t n_dense_layers = 1;
  int64_t n_routed_experts = 8;
  int64_t n_shared_experts = 0;
  int64_t top_k = 2;
  int64_t d_expert = 512;
  std::string score_func = "softmax";  // or "sigmoid"
  double aux_loss_weight = 0.0;
  double bias_update_rate = 0.001;
  int64_t mtp_depth = 0;
  double mtp_loss_weight = 0.3;
  bool tie_embeddings = false;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  int64_t max_seq_len = 1024;
  double init_std = 0.02;
  // Attention: "dense" (causal flash attention) or "dsa" (DeepSeek-style
  // sparse attention: a lightning indexer picks each query's top-k keys;
  // docs/sparse-attention.md).
  std::string attention = "dense";
  int64_t dsa_topk = 2048;          // keys per query (clamped to the length)
  int64_t dsa_index_heads = 4;      // indexer heads
  int64_t dsa_index_dim = 32;       // indexer head dim
  int64_t dsa_index_share = 1;      // each group of N layers selects once, in its first layer
  int64_t dsa_warmup_steps = 0;     // training: dense attention + indexer KL to it for these steps
  std::string dsa_index_precision = "fp32";  // the selection's arithmetic: "fp32" or "int8" (backend/cpu/dsa/dsa.h)
  // RoPE on the first dsa_index_rope_dim dims of the indexer's queries and
  // key (even, <= dsa_index_dim; 0: none). A TOML config without the key
  // gets dsa_index_dim / 2; a checkpoint's JSON without it, 0 (as trained).
  int64_t dsa_index_rope_dim = 0;

  // Open-model features (docs/open-models.md); the defaults are our own
  // architecture's, and ToJson writes a key only when it differs from them.
  int64_t d_head = 0;               // head width D; 0: d_model / n_heads
  bool qkv_bias = false;            // q/k/v projections have biases (Qwen2)
  bool qk_norm = false;             // per-head RMSNorm of q and k before RoPE (Qwen3)
  // RoPE frequency scaling: "none", "linear", "llama3" or "yarn", with the
  // parameters Hugging Face's rope_scaling gives them.
  std::string rope_scaling = "none";
  double rope_factor = 1.0;
  double rope_low_freq_factor = 1.0;   // llama3
  double rope_high_freq_factor = 4.0;  // llama3
  int64_t rope_original_max_pos = 0;   // llama3, yarn: the pre-training context (0: max_seq_len)
  double rope_beta_fast = 32.0;        // yarn
  double rope_beta_slow = 1.0;         // yarn
  double rope_attention_factor = 0.0;  // yarn: scales cos and sin (0: 0.1 ln(factor) + 1)
  bool rope_truncate = true;           // yarn: round the correction range outwards
  // Routing: the K weights are normalised to sum 1 (else the scores
  // themselves), then multiplied by routed_scaling_factor; group-limited
  // selection keeps the topk_group best of n_group expert groups (a group's
  // score: the sum of its two best biased scores) before the top-K.
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  // Multi-head latent attention (DeepSeek-V2/V3; docs/open-models.md), on
  // when kv_lora_rank > 0: q = q_b(norm(q_a x)) (or q_proj x when
  // q_lora_rank is 0), per head [qk_nope_head_dim | qk_rope_head_dim]; one
  // latent row kv_a x = [c_kv (kv_lora_rank) | k_pe (qk_rope_head_dim)],
  // c_kv normed and up-projected by kv_b to each head's [k_nope | v
  // (v_head_dim)]; k_pe is one RoPE'd key part shared by all heads.
  // n_kv_heads and d_head are not used.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // MLA under a rope scaling: the softmax scale is multiplied by
  // (0.1 rope_mscale_all_dim ln(rope_factor) + 1)^2 (0: by 1).
  double rope_mscale_all_dim = 0.0;
  // MTP module 1 reads the main model's last hidden state after the final
  // norm (DeepSeek-V3's checkpoints), not before it (ours).
  bool mtp_after_final_norm = false;

  // Dense layers after the first MoE layer (Qwen3-MoE's mlp_only_layers and
  // decoder_sparse_step): ascending, each in [n_dense_layers, n_layers).
  std::vector<int64_t> dense_layers;

  int64_t head_dim() const { return d_head > 0 ? d_head : d_model / n_heads; }
  bool mla() const { return kv_lora_rank > 0; }
  // Width of one head's q and k (their dot product), and of its v.
  int64_t qk_head_dim() const { return mla() ? qk_nope_head_dim + qk_rope_head_dim : head_dim(); }
  int64_t v_dim() const { return mla() ? v_head_dim : head_dim(); }
  // Dims of each head that RoPE rotates (the last ones of q and k under MLA).
  int64_t rope_dim() const { return mla() ? qk_rope_head_dim : head_dim(); }
  // The KV cache of one token and layer, the one definition every cache
  // follows (InferenceSession, the serving pool, every KV tier): keys as
  // kv_cache_heads() rows of kv_cache_dim() floats, values as many unless
  // kv_cache_v_is_k(). GQA: n_kv_heads heads of head_dim() each for k and
  // for v. MLA: one latent row [c_kv | k_pe] that decode attends with the
  // up-projections absorbed, as key and as value (only c_kv is read of it).
  int64_t kv_cache_heads() const { return mla() ? 1 : n_kv_heads; }
  int64_t kv_cache_dim() const { return mla() ? kv_lora_rank + qk_rope_head_dim : head_dim(); }
  bool kv_cache_v_is_k() const { return mla(); }
  int64_t kv_cache_floats_per_token_layer() const {
    return kv_cache_heads() * kv_cache_dim() * (kv_cache_v_is_k() ? 1 : 2);
  }
  bool is_moe_layer(int64_t l) const {
    return n_routed_experts > 0 && l >= n_dense_layers &&
           !std::binary_search(dense_layers.begin(), dense_layers.end(), l);
  }
  // Main layers with an MoE FFN.
  int64_t n_moe_layers() const {
    return n_routed_experts > 0 ? n_layers - n_dense_layers - static_cast<int64_t>(dense_layers.size()) : 0;
  }
  // Some main layer has a dense FFN (of width d_ff).
  bool has_dense_layers() const { return n_moe_layers() < n_layers; }
  // The MTP block is an MoE block when the main model has any MoE block.
  bool mtp_block_is_moe() const { return n_moe_layers() > 0; }
  bool sigmoid_scores() const { return score_func == "sigmoid"; }
  bool dsa() const { return attention == "dsa"; }
  // Main layer l computes top-k indices (the first of its sharing group).
  bool dsa_indexer_layer(int64_t l) const { return dsa() && l < n_layers && l % dsa_index_share == 0; }
  // Main layers that compute indices (one per sharing group).
  int64_t dsa_indexer_layers() const { return dsa() ? (n_layers + dsa_index_share - 1) / dsa_index_share : 0; }

  // Reads [model] from `doc` (defaults above for missing keys, or `base`'s
  // values when given: train.init_from's model); problems are recorded in
  // the doc and reported by doc->Finish() and Validate().
  static ModelConfig Read(ConfigDoc* doc, const ModelConfig* base = nullptr);
  // This config with `other`'s training-only keys: aux_loss_weight,
  // bias_update_rate, mtp_loss_weight, init_std, dsa_warmup_steps, which
  // shape training but not the function the model computes (a fine-tune may
  // set them; an export has no key for them).
  ModelConfig WithTrainingKeysOf(const ModelConfig& other) const;
  // Every integer within its documented range, every float finite, the
  // consistency checks, then CheckSizes; each error names the key(s), the
  // value and a hint.
  Status Validate() const;
  // The sizes the shapes imply (parameters with their gradients and moments,
  // RoPE tables, one sequence's KV cache) fit in 64-bit byte counts; an
  // overflow names the keys it grows with. Part of Validate.
  Status CheckSizes() const;
  nlohmann::json ToJson() const;
  static Result<ModelConfig> FromJson(const nlohmann::json& j);
};

}  // namespace myriad

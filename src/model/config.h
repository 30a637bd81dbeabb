// ModelConfig: the [model] section of a config, with its defaults and checks.
// docs/model.md defines what each field means.
#pragma once

#include <cstdint>
#include <string>

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

  int64_t head_dim() const { return d_model / n_heads; }
  bool is_moe_layer(int64_t l) const { return n_routed_experts > 0 && l >= n_dense_layers; }
  // The MTP block is an MoE block when the main model has any MoE block.
  bool mtp_block_is_moe() const { return n_routed_experts > 0 && n_layers > n_dense_layers; }
  bool sigmoid_scores() const { return score_func == "sigmoid"; }
  bool dsa() const { return attention == "dsa"; }
  // Main layer l computes top-k indices (the first of its sharing group).
  bool dsa_indexer_layer(int64_t l) const { return dsa() && l < n_layers && l % dsa_index_share == 0; }
  // Main layers that compute indices (one per sharing group).
  int64_t dsa_indexer_layers() const { return dsa() ? (n_layers + dsa_index_share - 1) / dsa_index_share : 0; }

  // Reads [model] from `doc` (defaults above for missing keys); problems are
  // recorded in the doc and reported by doc->Finish() and Validate().
  static ModelConfig Read(ConfigDoc* doc);
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

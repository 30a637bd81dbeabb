// Parameter layout: every parameter of the model lives in one flat fp32
// buffer, in the order docs/model.md gives; gradients and optimizer moments
// use the same layout. BlockWeights<P> is instantiated with P = int64_t
// (offsets into the buffer) and P = float* (pointers, after Bind).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/shard.h"

namespace myriad {

struct ParamInfo {
  std::string name;            // Hugging Face-style name, docs/model.md
  std::vector<int64_t> shape;
  int64_t offset = 0;          // into the flat buffer, in floats
  int64_t numel = 0;
  bool decay = false;          // weight decay applies (2-D matrices only)
  // Where this (local) tensor sits in the global model (ShardPlan):
  int block = -1;              // layer index, n_layers + j for MTP block j, -1 outside blocks
  bool expert = false;         // a routed expert's weight (replicated across dp*cp only)
  int tp_dim = -1;             // -1: whole tensor here; 0/1: rows/columns [tp_offset, +shape[tp_dim])
  int64_t tp_offset = 0;       //   of the global tensor
  std::vector<int64_t> global_shape;
};

template <typename P>
struct BlockWeights {
  bool moe = false;
  P attn_norm{}, wq{}, wk{}, wv{}, wo{}, ffn_norm{};
  P bq{}, bk{}, bv{};                            // q/k/v biases, adjacent (qkv_bias; absent: 0/null)
  P q_norm{}, k_norm{};                          // per-head RMSNorm weights [D] (qk_norm)
  // MLA (cfg.mla()): wq is q_proj [H*Dqk, C] when q_lora_rank is 0; else
  // q_a [q_lora, C], q_a_norm [q_lora], q_b [H*Dqk, q_lora]. kv_a [r + rope, C],
  // kv_a_norm [r], kv_b [H*(nope + v), r]; wk and wv are absent.
  bool mla = false;
  P q_a{}, q_a_norm{}, q_b{}, kv_a{}, kv_a_norm{}, kv_b{};
  P w_gate{}, w_up{}, w_down{};                  // dense FFN
  P router{};                                    // MoE [E, C]
  std::vector<P> e_gate, e_up, e_down;           // per routed expert
  P s_gate{}, s_up{}, s_down{};                  // shared experts (absent: 0/null)
  bool indexer = false;                          // DSA lightning indexer (first layer of a sharing group)
  P iq{}, ik{}, iw{};                            // [Hi*Di, C], [Di, C], [Hi, C]
};

template <typename P>
struct MtpWeights {
  P enorm{}, hnorm{}, eh_proj{}, norm{};
  BlockWeights<P> block;
};

template <typename P>
struct ModelWeights {
  P embed{};
  std::vector<BlockWeights<P>> layers;
  P norm{};
  P head{};  // == embed when tied
  std::vector<MtpWeights<P>> mtp;
};

class ParamLayout {
 public:
  // The layout of this rank's shard (the whole model for ShardPlan{}).
  explicit ParamLayout(const ModelConfig& cfg, const ShardPlan& plan = {});
  const ShardPlan& plan() const { return plan_; }
  const LocalDims& dims() const { return dims_; }
  int64_t total() const { return total_; }
  const std::vector<ParamInfo>& params() const { return params_; }
  const ModelWeights<int64_t>& offsets() const { return offsets_; }
  // Pointers into `base` (a params, grads or moments buffer of total() floats).
  ModelWeights<float*> Bind(float* base) const;
  // Names of the per-MoE-block bias buffers, in the order Model keeps them.
  const std::vector<std::string>& bias_names() const { return bias_names_; }

 private:
  // tp_dim/tp_parts: split of the global `shape` across tensor-parallel ranks.
  int64_t Add(const std::string& name, std::vector<int64_t> shape, bool decay, int tp_dim = -1,
              bool expert = false);
  BlockWeights<int64_t> AddBlock(const std::string& prefix, bool moe, bool indexer = false);
  const ModelConfig cfg_;
  const ShardPlan plan_;
  const LocalDims dims_;
  int block_ = -1;  // block being added
  std::vector<ParamInfo> params_;
  ModelWeights<int64_t> offsets_;
  std::vector<std::string> bias_names_;
  int64_t total_ = 0;
};

}  // namespace myriad

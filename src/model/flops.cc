#include "model/flops.h"

#include <algorithm>

namespace myriad {

ParamCounts CountParams(const ModelConfig& m) {
  ParamCounts p;
  const double C = static_cast<double>(m.d_model), hd = static_cast<double>(m.head_dim());
  const double H = static_cast<double>(m.n_heads), Hkv = static_cast<double>(m.n_kv_heads);
  const double V = static_cast<double>(m.vocab_size);
  p.embedding = V * C;
  p.head = (m.tie_embeddings ? 0 : V * C) + C;
  // Norms, q/o and k/v projections, q/k/v biases (qkv_bias), q/k norms (qk_norm).
  auto attn = [&]() {
    return 2 * C + C * H * hd * 2 + C * Hkv * hd * 2 + (m.qkv_bias ? (H + 2 * Hkv) * hd : 0) + (m.qk_norm ? 2 * hd : 0);
  };
  const double indexer = m.dsa() ? C * (m.dsa_index_heads * m.dsa_index_dim + m.dsa_index_dim + m.dsa_index_heads) : 0;
  // The indexer sits on one layer of each sharing group: averaged per layer.
  p.dense_per_layer = attn() + indexer * static_cast<double>(m.dsa_indexer_layers()) / static_cast<double>(m.n_layers);
  p.ffn_dense = 3 * C * static_cast<double>(m.d_ff);
  const double E = static_cast<double>(m.n_routed_experts);
  p.ffn_moe_shared = E * C + 3 * C * static_cast<double>(m.n_shared_experts * m.d_expert);
  p.expert = 3 * C * static_cast<double>(m.d_expert);
  const double n_moe = static_cast<double>(m.n_moe_layers());
  const double n_dense = static_cast<double>(m.n_layers) - n_moe;
  const double blocks = static_cast<double>(m.n_layers) * p.dense_per_layer + n_dense * p.ffn_dense +
                        n_moe * (p.ffn_moe_shared + E * p.expert);
  const double blocks_active = static_cast<double>(m.n_layers) * p.dense_per_layer + n_dense * p.ffn_dense +
                               n_moe * (p.ffn_moe_shared + static_cast<double>(m.top_k) * p.expert);
  // An MTP module: two norms, the projection of [embedding; hidden], a norm
  // and one block (MoE when the model's last layers are).
  const bool mtp_moe = m.mtp_block_is_moe();
  const double mtp_block = attn() + (mtp_moe ? p.ffn_moe_shared + E * p.expert : p.ffn_dense);
  const double mtp_block_active = attn() + (mtp_moe ? p.ffn_moe_shared + m.top_k * p.expert : p.ffn_dense);
  p.mtp = static_cast<double>(m.mtp_depth) * (3 * C + 2 * C * C + mtp_block);
  p.total = p.embedding + p.head + blocks + p.mtp;
  p.active = p.embedding + p.head + blocks_active + static_cast<double>(m.mtp_depth) * (3 * C + 2 * C * C + mtp_block_active);
  return p;
}

double CausalPairs(double s, double k) {
  if (k >= s) return s * (s + 1) / 2;
  return s * k - k * (k - 1) / 2;
}

TokenFlops ForwardFlopsPerToken(const ModelConfig& m, int64_t seq_len) {
  const ParamCounts p = CountParams(m);
  TokenFlops f;
  // The head is a GEMM even when tied; each MTP module reuses it.
  const double head_gemm = static_cast<double>(m.vocab_size * m.d_model);
  f.weights = 2 * (p.active - p.embedding + (m.tie_embeddings ? head_gemm : 0) +
                   static_cast<double>(m.mtp_depth) * head_gemm);
  const double s = static_cast<double>(seq_len);
  const double k = m.dsa() ? static_cast<double>(m.dsa_topk) : s;
  const double per_head_pair = 4 * static_cast<double>(m.n_heads * m.head_dim());
  f.attention = per_head_pair * (CausalPairs(s, k) * static_cast<double>(m.n_layers) +
                                 CausalPairs(s, s) * static_cast<double>(m.mtp_depth)) / s;
  if (m.dsa())
    f.indexer = 2 * static_cast<double>(m.dsa_index_heads * (m.dsa_index_dim + 1)) * CausalPairs(s, s) / s *
                static_cast<double>(m.dsa_indexer_layers());
  return f;
}

double TrainFlopsPerToken(const ModelConfig& m, int64_t seq_len) {
  return 3 * ForwardFlopsPerToken(m, seq_len).total();
}

}  // namespace myriad

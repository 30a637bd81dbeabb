// The model's size and arithmetic in closed form: parameter counts and FLOPs
// per token. The one count behind the trainer's MFU (train/trainer.cc) and
// the planner's cost model and report (plan/); docs/model.md, "FLOPs".
#pragma once

#include <cstdint>

#include "model/config.h"

namespace myriad {

// Parameter counts from the model's shapes (closed forms, not a layout;
// equal to ParamLayout(m).total(), checked in plan_test).
struct ParamCounts {
  double embedding = 0;      // input embedding (and the head when tied)
  double head = 0;           // untied output head + final norm
  double dense_per_layer = 0;   // attention + norms (+ indexer averaged) of one layer
  double ffn_dense = 0;      // one dense-FFN layer's FFN
  double ffn_moe_shared = 0; // one MoE layer's router + shared experts
  double expert = 0;         // one routed expert
  double mtp = 0;            // MTP modules in total
  double total = 0;          // everything
  double active = 0;         // per token: everything but the unchosen experts
};
ParamCounts CountParams(const ModelConfig& m);

// (query, key) pairs of one causal sequence of s tokens when each query
// attends to at most k keys (itself included): sum over t = 1..s of min(t, k).
double CausalPairs(double s, double k);

// Forward FLOPs of one token of a sequence of `seq_len` (MTP modules counted
// on every token, though module k sees seq_len - k), by part (a
// multiply-add is 2 FLOPs; norms' and softmaxes' element-wise work is not
// counted):
//   weights   2 per active weight (CountParams().active), but the input
//             embedding, a lookup; the head is a GEMM even when tied, and
//             each MTP module runs it again;
//   attention the causal core, q.k and p.v: 2 * H * (qk width + v width)
//             per pair (4 * H * head_dim without MLA; MLA's as trained,
//             unabsorbed, without the zero padding of its v). A
//             DSA model's main layers attend to their top-k keys
//             (CausalPairs(s, dsa_topk)); MTP blocks attend densely;
//   indexer   DSA: each indexer layer scores every causal key with Hi heads
//             of dim Di, sum_j w_j relu(q_j . k): 2 * Hi * (Di + 1) per pair.
struct TokenFlops {
  double weights = 0, attention = 0, indexer = 0;
  double total() const { return weights + attention + indexer; }
};
TokenFlops ForwardFlopsPerToken(const ModelConfig& m, int64_t seq_len);

// The KV cache per token (model/config.h, kv_cache_*): values per layer on
// one of tp ranks (GQA's kv heads split tp ways; MLA's latent row [c_kv |
// k_pe] is whole on every rank), and bytes per token over the main layers
// (what InferenceSession and the serving pool hold; MTP modules are not
// served) plus DSA's indexer keys, at bytes_per_value (4: the fp32 pool).
double KvValuesPerTokenLayer(const ModelConfig& m, int64_t tp = 1);
double KvBytesPerToken(const ModelConfig& m, double bytes_per_value = 4);
// The model with MLA replaced by GQA attention of equal width: n_heads heads
// of d_model / n_heads, n_kv_heads kv heads (what MLA's cache is judged
// against); the model itself when it has no MLA.
ModelConfig GqaAtEqualWidth(const ModelConfig& m);

// Model FLOPs of one trained token: forward + backward (twice the forward),
// without recomputation: 3 * ForwardFlopsPerToken(m, seq_len).total().
double TrainFlopsPerToken(const ModelConfig& m, int64_t seq_len);

}  // namespace myriad

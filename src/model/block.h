// One transformer block, forward and backward on plain pointers (llm.c
// style). A block knows nothing of parallelism; the caller owns the residual
// stream buffers. Shapes: N = B*T tokens, C = d_model, H/Hkv/D heads.
#pragma once

#include <cstdint>
#include <vector>

#include "model/buffer.h"
#include "model/config.h"
#include "model/params.h"
#include "model/shard.h"

namespace myriad {

// Rotary tables shared by every block: [max_seq_len, D/2].
struct RopeTables {
  Buf<float> cos, sin;  // device copies
  // Plain RoPE: angle pos * theta^(-2i/D), in double, rounded once.
  void Build(int64_t max_pos, int64_t D, double theta);
  // Angle pos * inv_freq[i]; cos and sin both scaled by mscale.
  void Build(int64_t max_pos, const std::vector<double>& inv_freq, double mscale);
  // The model's attention RoPE: rope_dim() wide, under cfg.rope_scaling.
  void Build(const ModelConfig& cfg);
};

// RoPE's inverse frequencies for head width D under cfg.rope_scaling ("none",
// "linear", "llama3", "yarn": the formulas of docs/open-models.md), in double.
std::vector<double> RopeInvFreq(const ModelConfig& cfg, int64_t D);
// The factor yarn multiplies cos and sin by (so q.k by its square); 1 otherwise.
double RopeAttentionFactor(const ModelConfig& cfg);
// The softmax scale of the attention scores: 1/sqrt(head_dim); MLA:
// 1/sqrt(qk_nope + qk_rope), times (0.1 rope_mscale_all_dim ln(rope_factor)
// + 1)^2 under a rope scaling with rope_mscale_all_dim > 0.
float AttentionScale(const ModelConfig& cfg);

// DSA: RoPE on the first cfg.dsa_index_rope_dim dims of each indexer query
// head qi [N, Hi, Di] and key ki [N, Di] (tables built for that many dims);
// inverse rotates back (the backward of the rotation). No-op at 0.
void IndexerRope(const ModelConfig& cfg, float* qi, float* ki, int64_t N, const int32_t* pos,
                 const RopeTables& t, bool inverse);

// Per-token routing of one MoE block, kept for backward and for statistics.
struct MoeActs {
  Buf<float> logits, scores;      // [N, E]
  Buf<int32_t> sel;               // [N, K] selected experts
  Buf<float> w;                   // [N, K] normalised weights
  Buf<int32_t> pos;               // [N, K] row in the permuted buffer
  Buf<int32_t> perm;              // [M=N*K] token of each buffer row
  Buf<int64_t> expert_offset;     // [E+1] (device)
  std::vector<int64_t> offset_host;  // [E+1] its host copy: sizes each expert's GEMMs
  Buf<float> x, gu, h, y;         // permuted: x [M,C], gu [M,2F] (gate|up), h [M,F], y [M,C]
  Buf<float> sgu, sh;             // shared experts: [N, 2*S*F], [N, S*F]
  Buf<double> stats;              // [2, B, E] balance-loss statistics (device)
  std::vector<float> f_frac;      // [B, E] balance-loss f_i per sequence (host)
  std::vector<int64_t> load;      // [E] assignments in this forward (host: bias updates)
  double aux_loss = 0;                    // alpha-weighted balance loss
};

// MLA's projections of N tokens (MlaProject): the compressed q before and
// after its norm [N, q_lora] with its rstd [N] (q_lora_rank > 0); the latent
// row kv_a x [N, r + rope] with k_pe (its last rope dims) rotated; its first
// r dims c_pre [N, r] and c_kv = kv_a_norm(c_pre) [N, r] with its rstd [N].
struct MlaRows {
  Buf<float> cq_pre, cq, rstd_cq, lat, c_pre, c, rstd_c;
};

struct BlockActs {
  int B = 0, T = 0;
  const float* x_in = nullptr;            // [N, C], owned by the caller
  Buf<float> a, rstd1;            // attn norm out [N,C], [N] (own rows under sequence parallelism)
  Buf<float> a_full, f_full;      // sequence parallelism: gathered norm outputs [N_full, C]
  Buf<float> q, k, v;             // [N, H*D], [N, Hkv*D] (after RoPE)
  Buf<float> q_pre, k_pre, rstd_q, rstd_k;  // qk_norm: q, k before the norm, [N*H], [N*Hkv]
  // MLA: the projections (MlaRows), kv_b c [N, H*(nope + v)] and the padded
  // attention output [N, H, Da]: q, k and v above hold the padded q, k, v
  // of width Da = max(nope + rope, v), att the v part [N, H*v] o_proj reads.
  MlaRows mla;
  Buf<float> kv_up, att_pad;
  Buf<float> att, lse;            // [N, H*D], [B, H, T]
  Buf<float> x_mid;               // [N, C]
  Buf<float> f, rstd2;            // ffn norm out [N,C], [N]
  Buf<float> gu, h;               // dense FFN: [N, 2F] (gate|up), [N, F]
  Buf<float> ffn_out;             // [N, C]
  MoeActs moe;
  // DSA (docs/sparse-attention.md): the indexer's projections (its first
  // layer of a sharing group only) and the keys each query attends to.
  Buf<float> ia;                  // [N, Hi*Di + Di + Hi]: qi | ki | wi
  Buf<int32_t> idx;               // [B, T, K] selected keys (first layer of the group)
  const int32_t* idx_used = nullptr;  // the group's idx this layer attended with
  int K = 0;                      // keys per query of idx_used
  bool sparse = false;            // sparse attention (else dense, idx covers every key)
  double indexer_loss = 0;        // KL of the indexer (set by backward)
};

// Scratch space for backward, shared by all blocks of a model.
struct BlockScratch {
  Buf<float> d_mid, d_f, d_att, d_q, d_k, d_v, d_qkv, d_a, d_gu, d_h, d_y, d_x, d_w, d_logits;
  Buf<float> balance;             // [B, E] balance-loss coefficients of the router backward
  Buf<float> qkv;  // forward: the fused q|k|v projection before it is split
  Buf<float> ones;  // [N] of 1: a bias is a GEMM with it (y += 1 b^T; db = dy^T 1)
  Buf<float> part, d_full, d_own;  // sequence parallelism: partial sums, gathered grads, own-row grads
  Buf<float> d_pad, d_kv_up, d_kpe, d_lat, d_low;  // MLA's backward
};

struct BlockContext {
  const ModelConfig* cfg;
  const RopeTables* rope;
  const RopeTables* index_rope = nullptr;  // DSA: tables for dsa_index_rope_dim
  const int32_t* pos;  // [N] positions of the tokens
  const float* bias;   // [E] selection bias (MoE blocks), may be null
  BlockScratch* scratch;  // shared temporaries (forward and backward)
  const LocalDims* dims;  // this rank's heads / widths / experts
  ParallelHooks* hooks = nullptr;  // null: single device
  int moe_block = -1;     // index among MoE blocks (for hooks), -1 if dense
  int block = -1;         // layer index, or n_layers + j for MTP module j
  // DSA: the acts of the layer that selects keys for this one (this layer's
  // own when it is the first of its group); null: dense attention.
  BlockActs* dsa_group = nullptr;
  bool dsa_dense = false;  // dense warm-up: attend to every key, train the indexer on it
};

// x_out[N,C] = Block(x_in). Saves what backward needs in `acts`.
void BlockForward(const BlockContext& ctx, const BlockWeights<float*>& w, const float* x_in,
                  int B, int T, BlockActs* acts, float* x_out);

// y[N, out] += b[out] on every row (Linear over a column of ones, which
// *ones holds afterwards); BiasBackward: db[out] += the column sums of dy.
void AddBias(const float* b, int64_t N, int64_t out, float* y, Buf<float>* ones);
void BiasBackward(const float* dy, int64_t N, int64_t out, float* db, Buf<float>* ones);

// q|k|v rows [N, (H+2Hkv)D] <-> separate q [N,H*D], k, v [N,Hkv*D].
void SplitQkv(const float* qkv, int64_t N, int64_t qd, int64_t kvd, float* q, float* k, float* v);
void JoinQkv(const float* q, const float* k, const float* v, int64_t N, int64_t qd, int64_t kvd, float* qkv);

// MLA's projections of the normed input a [N, C] at positions pos: writes
// q [N, H*(nope + rope)] = q_proj a, or q_b(q_a_norm(q_a a)), with each
// head's rope part rotated, and the rows of *r. The training block and
// inference both call it, so they compute the same rows (fp32 weights).
void MlaProject(const ModelConfig& cfg, const BlockWeights<float*>& w, const float* a, int64_t N,
                const int32_t* pos, const RopeTables& rope, MlaRows* r, float* q);
// The epsilon of MLA's q_a_layernorm and kv_a_layernorm: 1e-6 whatever
// norm_eps is (Hugging Face builds them without an eps argument).
constexpr float kMlaNormEps = 1e-6f;

// Given d x_out, writes d x_in [N,C] and accumulates weight grads into `gw`.
// loss_scale multiplies the balance-loss gradient (the same factor the caller
// applied to the main loss gradient).
void BlockBackward(const BlockContext& ctx, const BlockWeights<float*>& w,
                   const BlockWeights<float*>& gw, BlockActs* acts, const float* d_out,
                   float loss_scale, BlockScratch* s, float* d_in);

// The routing rule of cfg (score function, normalisation, scaling, groups)
// into rp; training and inference route with it.
void SetRouting(const ModelConfig& cfg, MoeRouteParams* rp);

// MoE feed-forward, used by the block: out[N,C] = MoE(f).
void MoeForward(const BlockContext& ctx, const BlockWeights<float*>& w, const float* f, int B, int T,
                MoeActs* a, float* out);
// Writes df [N,C]; accumulates grads.
void MoeBackward(const BlockContext& ctx, const BlockWeights<float*>& w,
                 const BlockWeights<float*>& gw, const float* f, int B, int T, MoeActs* a,
                 const float* d_out, float loss_scale, BlockScratch* s, float* df);

}  // namespace myriad

// Incremental inference with a KV cache. Two users share one forward
// (InferenceForward): InferenceSession, one sequence with a contiguous cache,
// and the serving engine's batched runner (serve/runner.h), many sequences
// over paged KV blocks. Weights are read from a Model (fp32), or from
// converted copies in fp16 or int8 (per-output-row scales) for decode, which
// is bound by weight bytes per token. The MTP modules draft tokens for
// speculative decoding (MtpForward; model/speculative.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/block.h"
#include "model/model.h"

namespace myriad {

enum class WeightFormat { kF32, kF16, kQ8 };
// "fp32" | "fp16" | "int8"; false when unknown.
bool ParseWeightFormat(const std::string& s, WeightFormat* out);
const char* WeightFormatName(WeightFormat f);

// A matrix [out, in] in one of the formats, applied to rows of x.
class InferLinear {
 public:
  void Init(const float* w, int64_t out, int64_t in, WeightFormat fmt);
  // y[n, out] = x[n, in] @ W^T.
  void Apply(const float* x, int64_t n, float* y) const;
  int64_t bytes() const;
  int64_t out() const { return out_; }

 private:
  const float* f32_ = nullptr;
  Buf<uint16_t> f16_;  // device copies in the reduced formats
  Buf<int8_t> q8_;
  Buf<float> scale_;
  int64_t out_ = 0, in_ = 0;
  WeightFormat fmt_ = WeightFormat::kF32;
};

// The weights of a model in one format, as inference reads them. Immutable
// after construction (but RefreshBiases), so any number of threads may read
// one. `model` must outlive it (fp32 weights are read in place).
class InferenceWeights {
 public:
  InferenceWeights(const Model& model, WeightFormat fmt);
  const Model& model() const { return model_; }
  const ModelConfig& config() const { return cfg_; }
  WeightFormat format() const { return fmt_; }
  // Copies the model's selection biases again (after they changed in
  // place; same sizes). fp32 weights need nothing more: they are read in
  // place. Nobody may read these weights meanwhile.
  void RefreshBiases();
  // Bytes of weights read per decoded token (for the roofline).
  int64_t WeightBytesPerToken() const;

  struct Layer {
    bool moe = false;
    const float *attn_norm = nullptr, *ffn_norm = nullptr, *router = nullptr;
    const float* bqkv = nullptr;                          // q|k|v biases (qkv_bias), fp32
    const float *q_norm = nullptr, *k_norm = nullptr;     // per-head norms (qk_norm)
    // w_gate, e_gate and s_gate hold gate and up projections together [2F, C].
    InferLinear wq, wk, wv, wo, w_gate, w_down, s_gate, s_down;
    std::vector<InferLinear> e_gate, e_down;
    const float* bias = nullptr;  // device (biases_ below)
    // DSA: this layer selects for its sharing group; iq|ik|iw adjacent,
    // [Hi*Di + Di + Hi, C], fp32 in every format (small).
    const float* indexer = nullptr;
    // MLA: the attention weights (MlaProject's; kv_b, absorbed into the
    // query and the output), fp32 in every format; wo as the format says.
    bool mla = false;
    BlockWeights<float*> mla_w;
  };
  const std::vector<Layer>& layers() const { return layers_; }
  // The MTP modules (mtp_depth): module j maps [RmsNorm(h, hnorm) |
  // RmsNorm(embed(t), enorm)] through eh_proj into its block, whose output's
  // RmsNorm(norm) the shared head reads (as Model::Forward trains them).
  struct Mtp {
    const float *enorm = nullptr, *hnorm = nullptr, *norm = nullptr;
    InferLinear eh_proj;  // [C, 2C]
    Layer block;
  };
  const std::vector<Mtp>& mtp() const { return mtp_; }
  const float* embed() const { return embed_; }
  const float* norm() const { return norm_; }
  const InferLinear& head() const { return head_; }

 private:
  void InitLayer(const BlockWeights<float*>& w, WeightFormat fmt, Layer* L, int* bias_i);
  const Model& model_;
  const ModelConfig cfg_;
  WeightFormat fmt_;
  std::vector<Layer> layers_;
  std::vector<Mtp> mtp_;
  const float* embed_ = nullptr;
  const float* norm_ = nullptr;
  InferLinear head_;
  std::vector<Buf<float>> biases_;  // the model's selection biases at construction (device)
};

// DSA rows of the new tokens on a layer that selects for its sharing group
// (the group's first): indexer queries qi [N, Hi*Di], keys ki [N, Di] and
// head weights wi [N, Hi] (scaled as in training).
struct DsaRows {
  const float* qi = nullptr;
  const float* ki = nullptr;
  const float* wi = nullptr;
};

// Where keys and values live: the caller's KV cache. For each layer the
// forward hands over the new tokens' q [N, H*D] and k, v [N, Hkv*D] (RoPE
// applied; D, Hkv: cfg.kv_cache_dim(), kv_cache_heads()); the implementation
// stores k and v and writes the attention output att [N, H*D] of every new
// token over its own sequence's cache, with the softmax scale
// AttentionScale(cfg). MLA (cfg.kv_cache_v_is_k()): k is each token's latent
// row [c_kv | k_pe] (one head of kv_lora_rank + qk_rope_head_dim), v == k and
// is not stored again, q holds the absorbed queries [W_UK^T q_nope | q_pe]
// per head; the forward reads the first kv_lora_rank dims of each head's
// output (softmax-weighted c_kv) and applies W_UV.
// DSA models: `dsa` is set on the layers that select (the cache stores the
// indexer keys too; DsaAttend does the rest), null on the others, which
// reuse their group's selection from the same forward.
class KvAttention {
 public:
  virtual ~KvAttention() = default;
  virtual void Attend(int layer, const float* q, const float* k, const float* v, float* att,
                      const DsaRows* dsa) = 0;
};

// DSA attention of n new tokens of one sequence over its Tk keys (the new
// ones last): q [n, H*D]; k, v [Tk, Hkv*D] and ki [Tk, Di] contiguous. With
// rows (a selecting layer) the indexer picks each token's dsa_topk keys into
// *idx [n, K]; without, *idx is the group's selection from the same forward.
// Dense attention when Tk <= dsa_topk (every key selected), as in training.
// The indexer's selection for n new rows of one sequence over its Tk keys
// (B = 1; qi [n, Hi*Di], ki [Tk, Di], wi [n, Hi], idx [n, dsa_topk]).
IndexerParams SequenceIndexer(const ModelConfig& cfg, int64_t n, int64_t Tk, const float* qi, const float* ki,
                              const float* wi, int32_t* idx);
void DsaAttend(const ModelConfig& cfg, int64_t n, int64_t Tk, const float* q, const float* k,
               const float* v, const float* ki, const float* qi, const float* wi, bool select,
               Buf<int32_t>* idx, float* att);

// Temporaries of one forward; reused across calls (grow-only).
struct InferenceScratch {  // device buffers, but `count`
  Buf<float> x, a, q, k, v, att, f, tmp, g, h, rstd, scores, xe, ye, last, logits;
  Buf<float> ones, qn, rstd_h;  // biases (AddBias), qk_norm's input and per-head rstd
  Buf<float> ia, qi, ki, wi;  // DSA indexer rows
  MlaRows mla;                // MLA's projections
  Buf<float> qa, lat, att_lat;  // MLA: absorbed queries, latent rows, attention over them
  Buf<int32_t> sel, perm, slot;
  Buf<int32_t> tok, pos, rows;  // device copies of the tokens, positions and output rows
  Buf<int64_t> offset;          // expert row offsets
  std::vector<int64_t> count;   // ... read back to the host to size each expert's GEMMs
  Buf<float> wsel;
};

// The one inference forward: N new tokens (tokens[N] at positions pos[N],
// any mix of sequences; `attn` knows which row is whose) through every
// layer, batched through the projections, the FFN and the MoE experts
// (tokens grouped by expert). Writes the logits [n_out, V] of rows
// out_rows[0..n_out) (usually each sequence's last new token). With
// `hidden` [N, C] (host) it also writes every row's hidden state as MTP
// module 1 reads it (the last residual, or its final norm under
// mtp_after_final_norm).
void InferenceForward(const InferenceWeights& w, const int32_t* tokens, const int32_t* pos, int64_t N,
                      KvAttention* attn, const int64_t* out_rows, int64_t n_out, InferenceScratch* s,
                      float* logits, float* hidden = nullptr);

// MTP module j over N rows: row i reads h[i] (the previous level's hidden
// state: `hidden` above for j = 0, module j-1's output otherwise) and the
// embedding of tokens[i], at position pos[i], and predicts the token after
// tokens[i]. Its block attends through `attn` as cache layer n_layers + j.
// Writes the logits of out_rows and, with out_hidden [N, C] (host), every
// row's output (what module j+1 reads).
void MtpForward(const InferenceWeights& w, int j, const float* h, const int32_t* tokens, const int32_t* pos,
                int64_t N, KvAttention* attn, const int64_t* out_rows, int64_t n_out, InferenceScratch* s,
                float* logits, float* out_hidden);

// One sequence's keys and values in contiguous buffers, [max_len, kv_dim]
// per cache layer, for layers [layer0, layer0 + n_layers) (the session's:
// the model's; an MTP drafter's: the MTP blocks', n_layers + j); DSA
// models also keep the indexer keys (the model's layers only). Each Attend
// stores the n new rows at [start, start + n) and attends over the keys
// [first_row, start + n): a drafter that starts after a prefix-cache hit
// sees only the rows it computed.
class ContiguousKv : public KvAttention {
 public:
  ContiguousKv(const ModelConfig& cfg, int layer0, int n_layers, int64_t max_len);
  void Attend(int layer, const float* q, const float* k, const float* v, float* att, const DsaRows* dsa) override;
  int64_t start = 0, n = 0;  // the new rows of the current forward
  int64_t first_row = 0;

 private:
  const ModelConfig& cfg_;
  int layer0_;
  int64_t max_len_;
  std::vector<Buf<float>> k_, v_, ki_;  // device
  Buf<int32_t> idx_;  // DSA: the current group's selection [n, K]
};

class InferenceSession {
 public:
  // `model` must outlive the session (fp32 weights are read in place).
  InferenceSession(const Model& model, int64_t max_len, WeightFormat fmt = WeightFormat::kF32);
  ~InferenceSession();

  // Appends tokens at positions [len(), len()+n) and returns the logits [V]
  // of the last one. Fails (CHECK) past max_len: callers check len() first.
  // With `hidden` [n, C] also the rows' hidden states (InferenceForward's;
  // MTP drafts read them).
  const float* Forward(const int32_t* tokens, int64_t n, float* hidden = nullptr);
  // The same, returning the logits [n, V] of every one of the n positions
  // (speculative decoding verifies a draft with one such call).
  const float* ForwardAll(const int32_t* tokens, int64_t n, float* hidden = nullptr);
  int64_t len() const { return len_; }
  int64_t max_len() const { return max_len_; }
  void Reset() { len_ = 0; }
  // Forgets every position from `len` on (a rejected draft's keys and
  // values); the next Forward writes over them.
  void Truncate(int64_t len);
  // Copies the model's selection biases again (after they changed in
  // place; same sizes). fp32 weights need nothing more: they are read in
  // place. Nobody may read these weights meanwhile.
  void RefreshBiases();
  // Bytes of weights read per decoded token (for the roofline).
  int64_t WeightBytesPerToken() const { return weights_.WeightBytesPerToken(); }
  const ModelConfig& config() const { return cfg_; }
  const InferenceWeights& weights() const { return weights_; }

 private:
  const float* Run(const int32_t* tokens, int64_t n, bool all_rows, float* hidden);
  const ModelConfig cfg_;
  int64_t max_len_, len_ = 0;
  InferenceWeights weights_;
  std::unique_ptr<ContiguousKv> cache_;
  InferenceScratch scratch_;
  std::vector<float> logits_;
  std::vector<int32_t> pos_;
};

}  // namespace myriad

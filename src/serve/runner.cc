#include "serve/runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <omp.h>

#include "core/check.h"
#include "ops/ops.h"

namespace myriad::serve {

class BatchRunner::PagedAttention : public KvAttention {
 public:
  PagedAttention(const ModelConfig& cfg, KvPool* pool) : cfg_(cfg), pool_(pool) {
    gather_.resize(std::max(1, omp_get_max_threads()));
  }

  void Attend(int layer, const float* q, const float* k, const float* v, float* att,
              const DsaRows* dsa) override {
    const int64_t n_seq = static_cast<int64_t>(chunks->size());
    if (cfg_.dsa() && static_cast<int64_t>(idx_.size()) < n_seq) idx_.resize(n_seq);
    int64_t max_n = 0;
    for (const auto& c : *chunks) max_n = std::max(max_n, c.n);
    if (max_n == 1 && n_seq > 1) {
#pragma omp parallel for schedule(dynamic)
      for (int64_t i = 0; i < n_seq; ++i) One(layer, i, q, k, v, att, dsa, &gather_[omp_get_thread_num()]);
    } else {
      for (int64_t i = 0; i < n_seq; ++i) One(layer, i, q, k, v, att, dsa, &gather_[0]);
    }
  }

  const std::vector<SeqChunk>* chunks = nullptr;
  std::vector<int64_t> row0;  // first row of each chunk in the batch

 private:
  // Sequence i: store its new keys/values in its blocks, gather [0, Tk) and attend.
  void One(int layer, int64_t i, const float* q, const float* k, const float* v, float* att,
           const DsaRows* dsa, std::vector<float>* scratch) {
    const SeqChunk& c = (*chunks)[i];
    const int64_t D = cfg_.head_dim(), H = cfg_.n_heads, Hkv = cfg_.n_kv_heads, kvd = Hkv * D;
    const int64_t Hi = cfg_.dsa_index_heads, Di = cfg_.dsa_index_dim;
    const int group = cfg_.dsa() ? static_cast<int>(layer / cfg_.dsa_index_share) : 0;
    const int64_t r0 = row0[i], Tk = c.start + c.n;
    for (int64_t t = 0; t < c.n; ++t) {
      const int64_t p = c.start + t;
      const int32_t b = c.blocks[p / kBlockTokens];
      const int slot = static_cast<int>(p % kBlockTokens);
      std::memcpy(pool_->k_row(b, layer, slot), k + (r0 + t) * kvd, kvd * sizeof(float));
      std::memcpy(pool_->v_row(b, layer, slot), v + (r0 + t) * kvd, kvd * sizeof(float));
      if (dsa)
        std::memcpy(pool_->ki_row(b, group, slot), dsa->ki + (r0 + t) * Di, Di * sizeof(float));
    }
    const int64_t need = 2 * Tk * kvd + (cfg_.dsa() ? Tk * Di : 0);
    if (scratch->size() < static_cast<size_t>(need)) scratch->resize(need);
    float* kg = scratch->data();
    float* vg = kg + Tk * kvd;
    float* kig = vg + Tk * kvd;
    for (int64_t p0 = 0; p0 < Tk; p0 += kBlockTokens) {
      const int32_t b = c.blocks[p0 / kBlockTokens];
      const int64_t m = std::min<int64_t>(kBlockTokens, Tk - p0);
      std::memcpy(kg + p0 * kvd, pool_->k_row(b, layer, 0), m * kvd * sizeof(float));
      std::memcpy(vg + p0 * kvd, pool_->v_row(b, layer, 0), m * kvd * sizeof(float));
      if (cfg_.dsa()) std::memcpy(kig + p0 * Di, pool_->ki_row(b, group, 0), m * Di * sizeof(float));
    }
    if (cfg_.dsa()) {
      DsaAttend(cfg_, c.n, Tk, q + r0 * H * D, kg, vg, kig, dsa ? dsa->qi + r0 * Hi * Di : nullptr,
                dsa ? dsa->wi + r0 * Hi : nullptr, dsa != nullptr, &idx_[i], att + r0 * H * D);
      return;
    }
    AttentionParams p;
    p.B = 1; p.Tq = static_cast<int>(c.n); p.Tk = static_cast<int>(Tk);
    p.H = static_cast<int>(H); p.Hkv = static_cast<int>(Hkv); p.D = static_cast<int>(D);
    p.scale = 1.f / std::sqrt(static_cast<float>(D));
    p.causal = true;
    p.q_batch_stride = c.n * H * D; p.kv_batch_stride = Tk * kvd; p.out_batch_stride = c.n * H * D;
    p.q = q + r0 * H * D; p.k = kg; p.v = vg; p.out = att + r0 * H * D; p.lse = nullptr;
    ops::Attention(p);
  }

  const ModelConfig& cfg_;
  KvPool* pool_;
  std::vector<std::vector<float>> gather_;  // per thread
  std::vector<std::vector<int32_t>> idx_;   // DSA: each sequence's group selection [n, K]
};

BatchRunner::BatchRunner(const Model& model, KvPool* pool, WeightFormat fmt)
    : weights_(model, fmt), pool_(pool), attn_(std::make_unique<PagedAttention>(weights_.config(), pool)) {}

BatchRunner::~BatchRunner() = default;

const float* BatchRunner::Forward(const std::vector<SeqChunk>& chunks) {
  CHECK(!chunks.empty());
  const int64_t max_pos = weights_.config().max_seq_len;
  tokens_.clear(); pos_.clear(); out_rows_.clear();
  attn_->row0.clear();
  for (const auto& c : chunks) {
    CHECK_MSG(c.n > 0 && c.start + c.n <= max_pos, "chunk [%lld, %lld) outside the model's context",
              static_cast<long long>(c.start), static_cast<long long>(c.start + c.n));
    CHECK_MSG(c.n_blocks * kBlockTokens >= c.start + c.n, "block table too short");
    attn_->row0.push_back(static_cast<int64_t>(tokens_.size()));
    for (int64_t t = 0; t < c.n; ++t) {
      tokens_.push_back(c.tokens[t]);
      pos_.push_back(static_cast<int32_t>(c.start + t));
    }
    out_rows_.push_back(static_cast<int64_t>(tokens_.size()) - 1);
  }
  attn_->chunks = &chunks;
  logits_.resize(chunks.size() * vocab());
  InferenceForward(weights_, tokens_.data(), pos_.data(), static_cast<int64_t>(tokens_.size()), attn_.get(),
                   out_rows_.data(), static_cast<int64_t>(out_rows_.size()), &scratch_, logits_.data());
  attn_->chunks = nullptr;
  return logits_.data();
}

}  // namespace myriad::serve

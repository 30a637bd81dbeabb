#include "serve/runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <omp.h>

#include "core/check.h"
#include "ops/ops.h"

namespace myriad::serve {

class BatchRunner::PoolAttention : public KvAttention {
 public:
  PoolAttention(const ModelConfig& cfg, KvPool* pool, AttentionPath path)
      : cfg_(cfg), pool_(pool), paged_(path == AttentionPath::kPaged) {
    gather_.resize(std::max(1, omp_get_max_threads()));
  }

  // Before a forward: the batch and the first row of each chunk in it
  // (null after it).
  void Begin(const std::vector<SeqChunk>* chunks, const std::vector<int64_t>& row0) {
    chunks_ = chunks;
    row0_ = row0;
    if (paged_ && chunks) SetTables();
  }

  void Attend(int layer, const float* q, const float* k, const float* v, float* att,
              const DsaRows* dsa) override {
    const int64_t n_seq = static_cast<int64_t>(chunks_->size());
    for (int64_t i = 0; i < n_seq; ++i) Store(layer, i, k, v, dsa);
    if (paged_) {
      if (cfg_.dsa()) SelectPaged(layer, dsa);
      params_.q = q;
      params_.k = pool_->k_row(0, layer, 0);
      params_.v = pool_->v_row(0, layer, 0);
      params_.out = att;
      ops::PagedAttention(params_);
      return;
    }
    if (cfg_.dsa() && static_cast<int64_t>(idx_.size()) < n_seq) idx_.resize(n_seq);
    int64_t max_n = 0;
    for (const auto& c : *chunks_) max_n = std::max(max_n, c.n);
    if (max_n == 1 && n_seq > 1) {
#pragma omp parallel for schedule(dynamic)
      for (int64_t i = 0; i < n_seq; ++i) GatherAttend(layer, i, q, att, dsa, &gather_[omp_get_thread_num()]);
    } else {
      for (int64_t i = 0; i < n_seq; ++i) GatherAttend(layer, i, q, att, dsa, &gather_[0]);
    }
  }

 private:
  // The paged op's per-forward tables: rows, key counts and the block tables
  // as one [n_seq, max_blocks] array (the layers differ only in k/v bases).
  void SetTables() {
    const int64_t n_seq = static_cast<int64_t>(chunks_->size());
    int64_t max_blocks = 1;
    for (const auto& c : *chunks_) max_blocks = std::max(max_blocks, c.n_blocks);
    q_start_.assign(1, 0);
    kv_len_.clear();
    blocks_.assign(n_seq * max_blocks, -1);
    for (int64_t i = 0; i < n_seq; ++i) {
      const SeqChunk& c = (*chunks_)[i];
      q_start_.push_back(static_cast<int32_t>(row0_[i] + c.n));
      kv_len_.push_back(static_cast<int32_t>(c.start + c.n));
      std::copy(c.blocks, c.blocks + c.n_blocks, blocks_.begin() + i * max_blocks);
    }
    params_ = PagedAttentionParams{};
    params_.n_seq = static_cast<int>(n_seq);
    params_.H = static_cast<int>(cfg_.n_heads);
    params_.Hkv = static_cast<int>(cfg_.kv_cache_heads());
    params_.D = static_cast<int>(cfg_.kv_cache_dim());
    params_.scale = AttentionScale(cfg_);
    params_.q_start = q_start_.data();
    params_.kv_len = kv_len_.data();
    params_.blocks = blocks_.data();
    params_.max_blocks = static_cast<int>(max_blocks);
    params_.block_tokens = kBlockTokens;
    params_.num_blocks = pool_->num_blocks();
    params_.block_stride = pool_->block_floats();
    params_.token_stride = pool_->kv_dim();
    // Checked on the host, then copied to the device once per forward.
    ops::CheckPagedAttentionTables(params_);
    FromHost(&dq_start_, q_start_);
    FromHost(&dkv_len_, kv_len_);
    FromHost(&dblocks_, blocks_);
    params_.q_start = dq_start_.data();
    params_.kv_len = dkv_len_.data();
    params_.blocks = dblocks_.data();
  }

  // DSA, paged: the first layer of a sharing group selects each new row's
  // dsa_topk keys (IndexerTopK over the sequence's indexer keys, read in
  // place through its block table; while the context fits in dsa_topk that
  // is every earlier key, the dense case); the group's layers then attend
  // through the block table to those keys (PagedAttentionParams::sel).
  // Nothing is gathered.
  void SelectPaged(int layer, const DsaRows* dsa) {
    const int K = static_cast<int>(cfg_.dsa_topk);
    params_.sel_k = K;
    if (!dsa) {  // a later layer of the group: the group's selection
      params_.sel = sel_.data();
      return;
    }
    const int64_t Hi = cfg_.dsa_index_heads, Di = cfg_.dsa_index_dim;
    const int group = static_cast<int>(layer / cfg_.dsa_index_share);
    const int64_t rows = row0_.empty() ? 0 : row0_.back() + chunks_->back().n;
    sel_.resize(static_cast<size_t>(rows) * K);
    for (size_t i = 0; i < chunks_->size(); ++i) {
      const SeqChunk& c = (*chunks_)[i];
      const int64_t Tk = c.start + c.n, r0 = row0_[i];
      IndexerParams ip = SequenceIndexer(cfg_, c.n, Tk, dsa->qi + r0 * Hi * Di, pool_->ki_row(0, group, 0),
                                         dsa->wi + r0 * Hi, sel_.data() + r0 * K);
      ip.ki_blocks = params_.blocks + static_cast<int64_t>(i) * params_.max_blocks;
      ip.ki_max_blocks = params_.max_blocks;
      ip.ki_block_tokens = kBlockTokens;
      ip.ki_block_stride = pool_->block_floats();
      ops::IndexerTopK(ip);
    }
    params_.sel = sel_.data();
  }

  // Sequence i's new keys/values (and DSA indexer keys) into its blocks.
  void Store(int layer, int64_t i, const float* k, const float* v, const DsaRows* dsa) {
    const SeqChunk& c = (*chunks_)[i];
    const int64_t kvd = pool_->kv_dim(), Di = cfg_.dsa_index_dim;
    const int group = cfg_.dsa() ? static_cast<int>(layer / cfg_.dsa_index_share) : 0;
    // One device copy per block the new tokens touch (its slots are contiguous).
    for (int64_t t = 0; t < c.n;) {
      const int64_t p = c.start + t, row = row0_[i] + t;
      const int32_t b = c.blocks[p / kBlockTokens];
      const int slot = static_cast<int>(p % kBlockTokens);
      const int64_t m = std::min<int64_t>(kBlockTokens - slot, c.n - t);
      ops::Copy(k + row * kvd, m * kvd, pool_->k_row(b, layer, slot));
      if (!pool_->v_is_k()) ops::Copy(v + row * kvd, m * kvd, pool_->v_row(b, layer, slot));
      if (dsa) ops::Copy(dsa->ki + row * Di, m * Di, pool_->ki_row(b, group, slot));
      t += m;
    }
  }

  // Sequence i: gather [0, Tk) of its blocks into scratch and attend.
  void GatherAttend(int layer, int64_t i, const float* q, float* att, const DsaRows* dsa,
                    Buf<float>* scratch) {
    const SeqChunk& c = (*chunks_)[i];
    const int64_t D = cfg_.kv_cache_dim(), H = cfg_.n_heads, Hkv = cfg_.kv_cache_heads(), kvd = Hkv * D;
    const int64_t Hi = cfg_.dsa_index_heads, Di = cfg_.dsa_index_dim;
    const int group = cfg_.dsa() ? static_cast<int>(layer / cfg_.dsa_index_share) : 0;
    const int64_t r0 = row0_[i], Tk = c.start + c.n;
    const int64_t need = 2 * Tk * kvd + (cfg_.dsa() ? Tk * Di : 0);
    if (scratch->size() < static_cast<size_t>(need)) scratch->resize(need);  // (never shrinks)
    float* kg = scratch->data();
    float* vg = kg + Tk * kvd;
    float* kig = vg + Tk * kvd;
    for (int64_t p0 = 0; p0 < Tk; p0 += kBlockTokens) {
      const int32_t b = c.blocks[p0 / kBlockTokens];
      const int64_t m = std::min<int64_t>(kBlockTokens, Tk - p0);
      ops::Copy(pool_->k_row(b, layer, 0), m * kvd, kg + p0 * kvd);
      if (!pool_->v_is_k()) ops::Copy(pool_->v_row(b, layer, 0), m * kvd, vg + p0 * kvd);
      if (cfg_.dsa()) ops::Copy(pool_->ki_row(b, group, 0), m * Di, kig + p0 * Di);
    }
    if (cfg_.dsa()) {
      DsaAttend(cfg_, c.n, Tk, q + r0 * H * D, kg, vg, kig, dsa ? dsa->qi + r0 * Hi * Di : nullptr,
                dsa ? dsa->wi + r0 * Hi : nullptr, dsa != nullptr, &idx_[i], att + r0 * H * D);
      return;
    }
    AttentionParams p;
    p.B = 1; p.Tq = static_cast<int>(c.n); p.Tk = static_cast<int>(Tk);
    p.H = static_cast<int>(H); p.Hkv = static_cast<int>(Hkv); p.D = static_cast<int>(D);
    p.scale = AttentionScale(cfg_);
    p.causal = true;
    p.q_batch_stride = c.n * H * D; p.kv_batch_stride = Tk * kvd; p.out_batch_stride = c.n * H * D;
    p.q = q + r0 * H * D; p.k = kg; p.v = pool_->v_is_k() ? kg : vg; p.out = att + r0 * H * D; p.lse = nullptr;
    ops::Attention(p);
  }

  const ModelConfig& cfg_;
  KvPool* pool_;
  const bool paged_;  // attention through ops::PagedAttention (dense, or DSA in sparse mode)
  const std::vector<SeqChunk>* chunks_ = nullptr;
  std::vector<int64_t> row0_;               // first row of each chunk in the batch
  PagedAttentionParams params_;             // paged: everything but q, k, v, out
  std::vector<int32_t> q_start_, kv_len_, blocks_;  // host tables
  Buf<int32_t> dq_start_, dkv_len_, dblocks_;        // their device copies
  std::vector<Buf<float>> gather_;          // gather path: per thread (device)
  std::vector<Buf<int32_t>> idx_;           // DSA, gather path: each sequence's group selection [n, K]
  Buf<int32_t> sel_;                        // DSA, paged: the group's selection of every batch row [rows, K]
};

BatchRunner::BatchRunner(const Model& model, KvPool* pool, WeightFormat fmt, AttentionPath path)
    : weights_(model, fmt), pool_(pool),
      attn_(std::make_unique<PoolAttention>(weights_.config(), pool, path)) {}

BatchRunner::~BatchRunner() = default;

const float* BatchRunner::Forward(const std::vector<SeqChunk>& chunks, bool hidden) {
  CHECK(!chunks.empty());
  const int64_t max_pos = weights_.config().max_seq_len;
  tokens_.clear(); pos_.clear(); out_rows_.clear();
  row0_.clear(); logits_row_.clear();
  for (const auto& c : chunks) {
    CHECK_MSG(c.n > 0 && c.start + c.n <= max_pos, "chunk [%lld, %lld) outside the model's context",
              static_cast<long long>(c.start), static_cast<long long>(c.start + c.n));
    CHECK_MSG(c.n_blocks * kBlockTokens >= c.start + c.n, "block table too short");
    row0_.push_back(static_cast<int64_t>(tokens_.size()));
    logits_row_.push_back(static_cast<int64_t>(out_rows_.size()));
    for (int64_t t = 0; t < c.n; ++t) {
      tokens_.push_back(c.tokens[t]);
      pos_.push_back(static_cast<int32_t>(c.start + t));
      if (c.all_logits || t == c.n - 1) out_rows_.push_back(static_cast<int64_t>(tokens_.size()) - 1);
    }
  }
  const int64_t N = static_cast<int64_t>(tokens_.size());
  attn_->Begin(&chunks, row0_);
  logits_.resize(out_rows_.size() * vocab());
  if (hidden) hidden_.resize(static_cast<size_t>(N * weights_.config().d_model));
  InferenceForward(weights_, tokens_.data(), pos_.data(), N, attn_.get(), out_rows_.data(),
                   static_cast<int64_t>(out_rows_.size()), &scratch_, logits_.data(), hidden ? hidden_.data() : nullptr);
  attn_->Begin(nullptr, row0_);
  return logits_.data();
}

}  // namespace myriad::serve

#include "serve/kv_pool.h"

#include <string>

#include "core/check.h"
#include "core/checksum.h"
#include "ops/ops.h"

namespace myriad::serve {

ModelFingerprint FingerprintModel(const Model& model, WeightFormat weights) {
  std::vector<uint64_t> parts;
  const std::vector<float> params = model.ParamsToHost();
  parts.push_back(Checksum64(params.data(), params.size() * sizeof(float)));
  for (const auto& b : model.biases()) parts.push_back(Checksum64(b.data(), b.size() * sizeof(float)));
  parts.push_back(Checksum64(model.config().ToJson().dump()));
  // fp32 keeps the fingerprint blocks written before formats existed had.
  if (weights != WeightFormat::kF32) parts.push_back(Checksum64(std::string(WeightFormatName(weights))));
  ModelFingerprint fp;
  fp.value = Checksum64(parts.data(), parts.size() * sizeof(uint64_t));
  return fp;
}

KvPool::KvPool(const ModelConfig& cfg, int64_t num_blocks)
    : block_floats_(BlockFloats(cfg)),
      kv_dim_(cfg.kv_cache_heads() * cfg.kv_cache_dim()),
      kv_parts_(cfg.kv_cache_v_is_k() ? 1 : 2),
      kv_floats_(cfg.n_layers * kBlockTokens * cfg.kv_cache_floats_per_token_layer()),
      index_dim_(cfg.dsa_index_dim) {
  CHECK(num_blocks > 0);
  data_.zero(num_blocks * block_floats_);
  meta_.resize(num_blocks);
  free_.reserve(num_blocks);
  // A stack: block 0 is handed out first.
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

void KvPool::CopyOut(int32_t b, float* host) const {
  ops::CopyToHost(host, data(b), block_floats_ * sizeof(float));
}
void KvPool::CopyIn(int32_t b, const float* host) {
  ops::CopyToDevice(data(b), host, block_floats_ * sizeof(float));
}
void KvPool::CopyBlock(int32_t from, int32_t to) { ops::Copy(data(from), block_floats_, data(to)); }

int32_t KvPool::Allocate() {
  int32_t b = -1;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (auto victim = lru_.PopOldest()) {
    b = *victim;
    if (on_evict_) on_evict_(b);
    meta_[b].cached = false;
    --n_cached_;
    ++evictions_;
  } else {
    return -1;
  }
  CHECK(meta_[b].refs == 0);
  meta_[b].refs = 1;
  return b;
}

void KvPool::Ref(int32_t b) {
  Meta& m = meta_[b];
  if (m.refs == 0) {
    CHECK_MSG(m.cached, "Ref of an unreferenced block that is not cached");
    lru_.Erase(b);
  }
  ++m.refs;
}

void KvPool::Release(int32_t b) {
  Meta& m = meta_[b];
  CHECK(m.refs > 0);
  if (--m.refs > 0) return;
  if (m.cached) {
    lru_.Touch(b);
  } else {
    free_.push_back(b);
  }
}

void KvPool::MarkCached(int32_t b) {
  Meta& m = meta_[b];
  CHECK_MSG(m.refs > 0, "MarkCached of a block the caller does not reference");
  if (m.cached) return;
  m.cached = true;
  ++n_cached_;
}

int64_t KvPool::DropUnreferencedCached() {
  int64_t n = 0;
  while (auto b = lru_.PopOldest()) {
    CHECK(meta_[*b].refs == 0 && meta_[*b].cached);
    meta_[*b].cached = false;
    --n_cached_;
    free_.push_back(*b);
    ++n;
  }
  return n;
}

}  // namespace myriad::serve

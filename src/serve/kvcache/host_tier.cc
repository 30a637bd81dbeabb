#include "serve/kvcache/host_tier.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/check.h"
#include "core/half.h"

namespace myriad::serve {

Result<KvStorageFormat> ParseKvStorageFormat(const std::string& s) {
  if (s == "fp32") return KvStorageFormat::kFp32;
  if (s == "fp16") return KvStorageFormat::kFp16;
  if (s == "int8") return KvStorageFormat::kInt8;
  return Status::Error("kv storage format '" + s + "' is unknown (hint: fp32, fp16 or int8)");
}

const char* KvStorageFormatName(KvStorageFormat f) {
  switch (f) {
    case KvStorageFormat::kFp32: return "fp32";
    case KvStorageFormat::kFp16: return "fp16";
    case KvStorageFormat::kInt8: return "int8";
  }
  return "?";
}

int64_t KvRowFloats(const ModelConfig& cfg) {
  const int64_t kvd = cfg.kv_cache_heads() * cfg.kv_cache_dim();
  return cfg.dsa() ? std::gcd(kvd, cfg.dsa_index_dim) : kvd;
}

HostTier::HostTier(const HostTierOptions& options) : options_(options) {
  CHECK_MSG(options.capacity_blocks > 0, "HostTier: capacity_blocks=%lld must be > 0",
            static_cast<long long>(options.capacity_blocks));
  CHECK_MSG(options.format != KvStorageFormat::kInt8 || options.row_floats > 0,
            "HostTier: int8 storage needs row_floats = KvRowFloats(cfg) > 0");
}

// int8 layout: for each row, a float scale followed by row_floats int8 values.
void HostTier::EncodeInto(const std::vector<float>& src, Entry* e) const {
  const int64_t n = static_cast<int64_t>(src.size());
  e->n_floats = n;
  switch (options_.format) {
    case KvStorageFormat::kFp32:
      e->bytes.resize(n * sizeof(float));
      if (n) std::memcpy(e->bytes.data(), src.data(), n * sizeof(float));
      return;
    case KvStorageFormat::kFp16: {
      e->bytes.resize(n * sizeof(uint16_t));
      auto* h = reinterpret_cast<uint16_t*>(e->bytes.data());
      for (int64_t i = 0; i < n; ++i) h[i] = FloatToHalf(std::clamp(src[i], -65504.f, 65504.f));
      return;
    }
    case KvStorageFormat::kInt8: {
      const int64_t R = options_.row_floats, rows = n / R;
      e->bytes.resize(rows * (sizeof(float) + R));
      uint8_t* p = e->bytes.data();
      for (int64_t r = 0; r < rows; ++r, p += sizeof(float) + R) {
        const float* x = src.data() + r * R;
        float amax = 0.f;
        for (int64_t i = 0; i < R; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float scale = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
        std::memcpy(p, &scale, sizeof(float));
        auto* q = reinterpret_cast<int8_t*>(p + sizeof(float));
        for (int64_t i = 0; i < R; ++i) q[i] = static_cast<int8_t>(std::lrintf(x[i] * inv));
      }
      return;
    }
  }
}

void HostTier::DecodeFrom(const Entry& e, float* dst) const {
  const int64_t n = e.n_floats;
  switch (options_.format) {
    case KvStorageFormat::kFp32:
      if (n) std::memcpy(dst, e.bytes.data(), n * sizeof(float));
      return;
    case KvStorageFormat::kFp16: {
      const auto* h = reinterpret_cast<const uint16_t*>(e.bytes.data());
      for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(h[i]);
      return;
    }
    case KvStorageFormat::kInt8: {
      const int64_t R = options_.row_floats, rows = n / R;
      const uint8_t* p = e.bytes.data();
      for (int64_t r = 0; r < rows; ++r, p += sizeof(float) + R) {
        float scale;
        std::memcpy(&scale, p, sizeof(float));
        const auto* q = reinterpret_cast<const int8_t*>(p + sizeof(float));
#pragma omp simd
        for (int64_t i = 0; i < R; ++i) dst[r * R + i] = scale * q[i];
      }
      return;
    }
  }
}

void HostTier::RemoveLocked(std::unordered_map<BlockKey, Entry>::iterator it) {
  resident_bytes_ -= static_cast<int64_t>(it->second.bytes.size());
  lru_.Erase(it->first);
  blocks_.erase(it);
}

void HostTier::Put(const KvBlock& b) {
  const int64_t n = static_cast<int64_t>(b.data.size());
  if (options_.format == KvStorageFormat::kInt8 && n % options_.row_floats != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.errors;  // not a [layer][k|v][token][Hkv*D] block of this model
    return;
  }
  Entry fresh;
  EncodeInto(b.data, &fresh);  // outside the lock: the costly part
  std::vector<std::pair<BlockKey, Entry>> evicted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = blocks_.find(b.key); it != blocks_.end()) RemoveLocked(it);
    while (static_cast<int64_t>(blocks_.size()) >= options_.capacity_blocks) {
      auto victim = blocks_.find(*lru_.PopOldest());
      resident_bytes_ -= static_cast<int64_t>(victim->second.bytes.size());
      if (spill_) evicted.emplace_back(victim->first, std::move(victim->second));
      blocks_.erase(victim);
      ++stats_.evictions;
    }
    lru_.Touch(b.key);
    resident_bytes_ += static_cast<int64_t>(fresh.bytes.size());
    blocks_.emplace(b.key, std::move(fresh));
    ++stats_.puts;
    stats_.bytes_written += n * static_cast<int64_t>(sizeof(float));
  }
  KvBlock out;
  for (const auto& [key, e] : evicted) {
    out.key = key;
    out.data.resize(e.n_floats);
    DecodeFrom(e, out.data.data());
    spill_(out);
  }
}

void HostTier::SetSpill(SpillFn fn) {
  std::lock_guard<std::mutex> lock(mu_);
  spill_ = std::move(fn);
}

void HostTier::SpillAll() {
  if (!spill_) return;
  // Most recent first; each block is decoded under the lock, spilled outside it.
  std::vector<BlockKey> keys;
  {
    std::lock_guard<std::mutex> lock(mu_);
    keys = lru_.MostRecentFirst();
  }
  KvBlock out;
  for (BlockKey key : keys) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = blocks_.find(key);
      if (it == blocks_.end()) continue;
      out.key = key;
      out.data.resize(it->second.n_floats);
      DecodeFrom(it->second, out.data.data());
    }
    spill_(out);
  }
}

bool HostTier::Get(BlockKey key, KvBlock* out) {
  const auto t0 = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.find(key);
  if (it == blocks_.end()) {
    ++stats_.misses;
    return false;
  }
  lru_.Touch(key);
  out->key = key;
  out->data.resize(it->second.n_floats);
  DecodeFrom(it->second, out->data.data());
  ++stats_.hits;
  stats_.bytes_read += it->second.n_floats * static_cast<int64_t>(sizeof(float));
  stats_.read_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return true;
}

bool HostTier::Contains(BlockKey key) {
  std::lock_guard<std::mutex> lock(mu_);
  return blocks_.count(key) != 0;
}

void HostTier::Evict(BlockKey key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = blocks_.find(key); it != blocks_.end()) RemoveLocked(it);
}

int64_t HostTier::size_blocks() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(blocks_.size());
}

TierStats HostTier::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

int64_t HostTier::resident_bytes() {
  std::lock_guard<std::mutex> lock(mu_);
  return resident_bytes_;
}

}  // namespace myriad::serve

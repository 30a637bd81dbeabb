// T1: KV blocks in host memory, a fixed number of blocks, least recently
// used evicted first (and handed to the spill function, if one is set, so the
// engine can move them down to disk and the remote store). Blocks may be stored compressed (fp16, or int8 with a
// scale per [layer][k|v][token] row); Get always returns fp32.
//
// Thread-safe: every method takes one mutex. Never throws for a cache
// reason; a block whose size does not fit the int8 row layout is refused
// and counted in errors.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "serve/kvcache/lru_index.h"
#include "serve/kvcache/tier.h"

namespace myriad::serve {

enum class KvStorageFormat {
  kFp32,  // exact: the default, and the only one that keeps greedy outputs identical
  kFp16,  // IEEE half; |x| > 65504 clamps to +-65504; relative error <= 2^-11
  kInt8,  // symmetric, scale = max|row| / 127 per row; error <= max|row| / 254
};

// "fp32", "fp16", "int8" (config values); anything else is an error.
Result<KvStorageFormat> ParseKvStorageFormat(const std::string& s);
const char* KvStorageFormatName(KvStorageFormat f);

// The int8 scale granularity: one [layer][k|v][token] row, Hkv * D floats;
// for a DSA model, whose blocks end with dsa_index_dim floats of indexer key
// per token, gcd(Hkv * D, dsa_index_dim), so rows tile the whole block.
int64_t KvRowFloats(const ModelConfig& cfg);

struct HostTierOptions {
  int64_t capacity_blocks = 0;  // > 0
  KvStorageFormat format = KvStorageFormat::kFp32;
  int64_t row_floats = 0;       // KvRowFloats(cfg); required (> 0) for kInt8
};

class HostTier : public KvTier {
 public:
  // CHECKs capacity_blocks > 0 and, for int8, row_floats > 0.
  explicit HostTier(const HostTierOptions& options);

  std::string name() const override { return "host"; }
  void Put(const KvBlock& b) override;
  bool Get(BlockKey key, KvBlock* out) override;
  bool Contains(BlockKey key) override;
  void Evict(BlockKey key) override;
  int64_t size_blocks() override;
  // bytes_read / bytes_written count fp32 bytes delivered / accepted (the
  // same measure in every tier); resident_bytes() is what storage holds.
  TierStats stats() override;
  int64_t resident_bytes();
  bool CanSpill() const override { return true; }
  void SetSpill(SpillFn fn) override;  // call before use
  void SpillAll() override;

 private:
  struct Entry {
    int64_t n_floats = 0;
    std::vector<uint8_t> bytes;         // encoded in options_.format
  };
  void EncodeInto(const std::vector<float>& src, Entry* e) const;
  void DecodeFrom(const Entry& e, float* dst) const;
  void RemoveLocked(std::unordered_map<BlockKey, Entry>::iterator it);

  const HostTierOptions options_;
  std::mutex mu_;
  LruIndex<BlockKey> lru_;                      // the keys of blocks_, by Put/Get
  std::unordered_map<BlockKey, Entry> blocks_;
  int64_t resident_bytes_ = 0;
  TierStats stats_;
  SpillFn spill_;
};

}  // namespace myriad::serve

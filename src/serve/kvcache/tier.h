// The KV-cache tier seam (ARCHITECTURE.md, "Seams"): content-addressed KV
// blocks, put/get/contains/evict. The device pool (T0) lives in the engine;
// host memory (T1), local disk (T2) and a remote store (T3, Redis) implement
// KvTier, and TieredStore (store.h) stacks them. Policy lives above.
//
// A block holds the keys and values of kBlockTokens consecutive tokens for
// every layer: floats laid out [layer][k|v][token][Hkv*D]. Its key is a hash
// chain: key_i = H(key_{i-1}, tokens of block i, model fingerprint), so equal
// keys mean an equal prefix on the same model; only full blocks are keyed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"

namespace myriad::serve {

constexpr int kBlockTokens = 16;

using BlockKey = uint64_t;

// Identifies the weights a block was computed with (checkpoint content and
// config): blocks of another model never match.
struct ModelFingerprint {
  uint64_t value = 0;
  std::string hex() const;
};

// key of the block after `parent` (0 for the first) holding these tokens.
BlockKey ChainKey(BlockKey parent, const int32_t* tokens, int n, const ModelFingerprint& fp);

// Floats in one block for a model, the one definition every tier and the
// pool follow: layers * kBlockTokens * cfg.kv_cache_floats_per_token_layer()
// (GQA: k and v, 2 * Hkv * D; MLA: the latent row, kv_lora_rank +
// qk_rope_head_dim), and for a DSA model the indexer keys after them:
// indexer layers * kBlockTokens * dsa_index_dim (so every tier keeps them
// with the block).
int64_t BlockFloats(const ModelConfig& cfg);

struct KvBlock {
  BlockKey key = 0;
  std::vector<float> data;  // BlockFloats(cfg) floats, KvPool's layout
};

struct TierStats {
  int64_t hits = 0, misses = 0, puts = 0, evictions = 0, errors = 0;
  int64_t bytes_read = 0, bytes_written = 0;
  double read_seconds = 0;  // time inside Get that returned a block (for bandwidth)
};

class KvTier {
 public:
  virtual ~KvTier() = default;
  virtual std::string name() const = 0;  // "host", "disk", "redis"
  // Stores a copy (overwrites). May drop it when full (after evicting by its
  // own LRU); errors are counted, never thrown (a cache must not fail a request).
  virtual void Put(const KvBlock& b) = 0;
  // True and fills *out when present and intact; false on a miss or a
  // corrupt/foreign block (which is then removed and counted in errors).
  virtual bool Get(BlockKey key, KvBlock* out) = 0;
  virtual bool Contains(BlockKey key) = 0;
  // Contains for each key; a remote tier answers them in one round trip.
  virtual std::vector<bool> ContainsMany(const std::vector<BlockKey>& keys);
  virtual void Evict(BlockKey key) = 0;
  virtual int64_t size_blocks() = 0;
  virtual TierStats stats() = 0;  // never waits for a call in flight
  // A tier across a network (Redis): any call may wait for its timeout when
  // the server hangs. The engine calls a remote tier only from its own
  // lookup, I/O and write-back threads, never from the scheduler.
  virtual bool remote() const { return false; }

  // Spilling (the engine's write-back hierarchy, docs/serving.md): a tier
  // that spills hands each block it evicts for room -- not one removed by
  // Evict or found corrupt -- to `fn`, as fp32, outside its lock, on the
  // thread that called Put; SpillAll hands over every block it holds (at
  // shutdown). A tier that does not spill simply drops what it evicts.
  using SpillFn = std::function<void(const KvBlock&)>;
  virtual bool CanSpill() const { return false; }
  virtual void SetSpill(SpillFn /*fn*/) {}
  virtual void SpillAll() {}
};

}  // namespace myriad::serve

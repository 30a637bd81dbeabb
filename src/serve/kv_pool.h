// The device KV pool (T0): a fixed array of KV blocks of kBlockTokens tokens,
// shared by every running sequence through per-sequence block tables, with
// reference counts and a prefix index. A full block that has been published
// under its chain key (tier.h) stays in the index after its last user lets go
// (refcount 0: "cached") and is handed out again only when no never-keyed
// free block is left, least recently released first; the owner hears of that
// eviction first (on_evict) so it can write the block to the lower tiers.
// Blocks with a reference (a running request's) are never evicted.
//
// Not thread-safe: the engine's scheduler thread owns it. The block data
// pointers are stable for the pool's lifetime, so another thread may fill a
// block the scheduler has allocated for it (the engine's prefetch).
#pragma once

#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include "model/model.h"
#include "serve/kvcache/lru_index.h"
#include "serve/kvcache/tier.h"

namespace myriad::serve {

// The fingerprint of a model's weights: xxHash64 over the parameter bytes,
// the MoE selection biases and the config JSON.
ModelFingerprint FingerprintModel(const Model& model);

class KvPool {
 public:
  // num_blocks blocks of the model's KvBlock layout
  // [layer][k|v][token][Hkv*D], then for DSA [group][token][Di] indexer keys
  // (BlockFloats(cfg) floats each).
  KvPool(const ModelConfig& cfg, int64_t num_blocks);

  int64_t num_blocks() const { return static_cast<int64_t>(meta_.size()); }
  int64_t block_floats() const { return block_floats_; }
  float* data(int32_t b) { return data_.data() + static_cast<int64_t>(b) * block_floats_; }
  const float* data(int32_t b) const { return data_.data() + static_cast<int64_t>(b) * block_floats_; }
  // Rows of token `slot` in block b for one layer: keys, then values (kv_dim floats each).
  float* k_row(int32_t b, int layer, int slot) {
    return data(b) + (static_cast<int64_t>(layer) * 2 * kBlockTokens + slot) * kv_dim_;
  }
  float* v_row(int32_t b, int layer, int slot) {
    return data(b) + ((static_cast<int64_t>(layer) * 2 + 1) * kBlockTokens + slot) * kv_dim_;
  }
  int64_t kv_dim() const { return kv_dim_; }
  // DSA models: the indexer key of token `slot` for sharing group `group`
  // (dsa_index_dim floats), after every layer's keys and values.
  float* ki_row(int32_t b, int group, int slot) {
    return data(b) + kv_floats_ + (static_cast<int64_t>(group) * kBlockTokens + slot) * index_dim_;
  }

  // Blocks nobody references (free or cached): what Allocate can hand out.
  int64_t available() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
  int64_t used() const { return num_blocks() - available(); }
  int64_t cached() const { return static_cast<int64_t>(index_.size()); }

  // A block for the caller alone (refcount 1, no key): a free block first,
  // else the least recently released cached block, whose key leaves the
  // index after on_evict has seen it (data intact). -1 when all are in use.
  int32_t Allocate();
  // The block published under `key`, or -1. Counts as a use for the LRU only
  // when the caller then takes a reference.
  int32_t Find(BlockKey key) const;
  void Ref(int32_t b);
  // Drops a reference; at zero a keyed block becomes the most recently
  // released cached block, an unkeyed one goes back to the free list.
  void Release(int32_t b);
  // Enters block b (which the caller references, and whose tokens are all
  // written) in the index under `key`. False, and b stays unkeyed, when the
  // key is already held by another block (two requests computed the same
  // prefix at once) or b already has a key.
  bool Publish(int32_t b, BlockKey key);
  bool keyed(int32_t b) const { return meta_[b].keyed; }
  BlockKey key(int32_t b) const { return meta_[b].key; }
  int refs(int32_t b) const { return meta_[b].refs; }

  // Called with (block, key) just before a cached block is reused.
  void set_on_evict(std::function<void(int32_t, BlockKey)> f) { on_evict_ = std::move(f); }
  int64_t evictions() const { return evictions_; }

 private:
  struct Meta {
    int refs = 0;
    bool keyed = false;
    BlockKey key = 0;
  };
  int64_t block_floats_, kv_dim_, kv_floats_, index_dim_;
  std::vector<float> data_;
  std::vector<Meta> meta_;
  std::vector<int32_t> free_;   // unkeyed, unreferenced (a stack)
  LruIndex<int32_t> lru_;       // keyed, unreferenced, by time of release
  std::unordered_map<BlockKey, int32_t> index_;
  std::function<void(int32_t, BlockKey)> on_evict_;
  int64_t evictions_ = 0;
};

}  // namespace myriad::serve

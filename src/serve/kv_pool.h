// The device KV pool (T0): a fixed array of KV blocks of kBlockTokens tokens,
// shared by every running sequence through per-sequence block tables, with
// reference counts. A block its owner has marked cached (the prefix cache,
// prefix_cache.h, does so when it publishes a full block under its chain
// key) keeps its data after its last user lets go (refcount 0: "cached")
// and is handed out again only when no free block is left, least recently
// released first; the owner hears of that eviction first (on_evict) so it
// can forget the block's key and write the block to the lower tiers. Blocks
// with a reference (a running request's) are never evicted. What a block
// holds (its key) is the owner's business, not the pool's.
//
// Not thread-safe: the engine's scheduler thread owns it. The block data
// pointers are stable for the pool's lifetime, so another thread may fill a
// block the scheduler has allocated for it (the engine's prefetch).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/inference.h"
#include "model/model.h"
#include "serve/kvcache/lru_index.h"
#include "serve/kvcache/tier.h"  // kBlockTokens, BlockFloats, ModelFingerprint

namespace myriad::serve {

// The fingerprint of a model's weights as the engine computes with them:
// xxHash64 over the parameter bytes, the MoE selection biases, the config
// JSON and the weight format (fp16 and int8 weights give other KV, so
// servers with different --weights sharing a tier do not reuse each
// other's blocks).
ModelFingerprint FingerprintModel(const Model& model, WeightFormat weights = WeightFormat::kF32);

class KvPool {
 public:
  // num_blocks blocks of the model's KvBlock layout
  // [layer][k|v][token][kv_dim], then for DSA [group][token][Di] indexer keys
  // (BlockFloats(cfg) floats each). kv_dim = kv_cache_heads() *
  // kv_cache_dim(); MLA blocks hold [layer][token][kv_dim] latent rows,
  // which are the keys and the values (v_row == k_row).
  KvPool(const ModelConfig& cfg, int64_t num_blocks);

  int64_t num_blocks() const { return static_cast<int64_t>(meta_.size()); }
  int64_t block_floats() const { return block_floats_; }
  // Block b's data: device memory. The host reaches it only through
  // CopyOut/CopyIn (explicit device<->host copies) or device ops.
  float* data(int32_t b) { return data_.data() + static_cast<int64_t>(b) * block_floats_; }
  const float* data(int32_t b) const { return data_.data() + static_cast<int64_t>(b) * block_floats_; }
  // Rows of token `slot` in block b for one layer: keys, then values (kv_dim floats each).
  float* k_row(int32_t b, int layer, int slot) {
    return data(b) + (static_cast<int64_t>(layer) * kv_parts_ * kBlockTokens + slot) * kv_dim_;
  }
  float* v_row(int32_t b, int layer, int slot) {
    return data(b) + ((static_cast<int64_t>(layer) * kv_parts_ + kv_parts_ - 1) * kBlockTokens + slot) * kv_dim_;
  }
  // MLA: values are the keys' rows (nothing to store for them).
  bool v_is_k() const { return kv_parts_ == 1; }
  int64_t kv_dim() const { return kv_dim_; }
  // Block b to the host (block_floats() floats) and back; device to device.
  void CopyOut(int32_t b, float* host) const;
  void CopyIn(int32_t b, const float* host);
  void CopyBlock(int32_t from, int32_t to);
  // DSA models: the indexer key of token `slot` for sharing group `group`
  // (dsa_index_dim floats), after every layer's keys and values.
  float* ki_row(int32_t b, int group, int slot) {
    return data(b) + kv_floats_ + (static_cast<int64_t>(group) * kBlockTokens + slot) * index_dim_;
  }

  // Blocks nobody references (free or cached): what Allocate can hand out.
  int64_t available() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
  int64_t used() const { return num_blocks() - available(); }
  int64_t cached() const { return n_cached_; }  // marked cached, referenced or not

  // A block for the caller alone (refcount 1, not cached): a free block
  // first, else the least recently released cached block, after on_evict
  // has seen it (data intact). -1 when all are in use.
  int32_t Allocate();
  // Takes a reference on a referenced or cached block (a cached one leaves
  // the eviction order while referenced).
  void Ref(int32_t b);
  // Drops a reference; at zero a cached block becomes the most recently
  // released one, any other goes back to the free list.
  void Release(int32_t b);
  // Keeps block b (which the caller references) after its last release, as
  // a cached block, until Allocate evicts it.
  void MarkCached(int32_t b);
  // Forgets that every unreferenced cached block is cached: each goes back
  // to the free list without on_evict (its data is worthless: the weights
  // changed). Referenced cached blocks stay as they are; returns how many
  // were dropped.
  int64_t DropUnreferencedCached();
  bool is_cached(int32_t b) const { return meta_[b].cached; }
  int refs(int32_t b) const { return meta_[b].refs; }

  // Called with the block just before a cached block is reused.
  void set_on_evict(std::function<void(int32_t)> f) { on_evict_ = std::move(f); }
  int64_t evictions() const { return evictions_; }

 private:
  struct Meta {
    int refs = 0;
    bool cached = false;
  };
  int64_t block_floats_, kv_dim_, kv_parts_, kv_floats_, index_dim_;
  Buf<float> data_;  // device memory (the active backend's)
  std::vector<Meta> meta_;
  std::vector<int32_t> free_;   // not cached, unreferenced (a stack)
  LruIndex<int32_t> lru_;       // cached, unreferenced, by time of release
  int64_t n_cached_ = 0;
  std::function<void(int32_t)> on_evict_;
  int64_t evictions_ = 0;
};

}  // namespace myriad::serve

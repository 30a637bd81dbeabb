// T2: KV blocks as files in one directory, so that they outlive the process.
//
// One file per block, "<key as 16 hex digits>.kvb", holding a block record
// (block_record.h: magic, version, model fingerprint, key, float count,
// xxHash64 of the payload, then fp32 floats). Files are written through Env
// with WriteFileAtomic (tmp + fsync + rename + directory fsync), so a crash
// leaves either the old file or the new one, never a torn one under the real
// name. By default the fsyncs are skipped (sync_writes = false): every
// record carries its checksum, so a block torn or lost by a power cut is
// found on read and recomputed, and a killed process loses nothing (the page
// cache outlives it); the destructor flushes the file system (syncfs) so a
// clean shutdown is durable. Per-block fsyncs cost a journal commit each,
// which on a small machine takes CPU from the compute threads. Open scans the directory and indexes the files of this model's
// fingerprint; files of another fingerprint (another model sharing the
// directory) are left alone: not indexed, not deleted. Leftover
// "<key>.kvb.tmp" files (a write cut short by a crash) are deleted.
//
// Capacity is in bytes of files; when a Put would exceed it, the least
// recently used blocks (Put or Get) are deleted first. Get verifies the whole
// record; a block that fails (flipped bits, truncation, a foreign header) is
// deleted, counted in errors and misses, and Get returns false so the caller
// recomputes. Nothing throws; I/O failures are counted in errors.
//
// Thread-safe: one mutex, held across the file I/O of an operation. One
// DiskTier per directory at a time (two processes writing the same key
// would share its .tmp name).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/env.h"
#include "serve/kvcache/lru_index.h"
#include "serve/kvcache/tier.h"

namespace myriad::serve {

struct DiskTierOptions {
  std::string dir;                 // created if missing
  int64_t capacity_bytes = 0;      // > 0; file bytes (header + payload)
  ModelFingerprint fingerprint;    // blocks of this model only
  int64_t block_floats = 0;        // BlockFloats(cfg); 0 accepts any size
  Env* env = nullptr;              // nullptr: Env::Default()
  bool sync_writes = false;        // fsync each block file (and the directory)
};

class DiskTier : public KvTier {
 public:
  // Creates the directory, indexes this model's blocks (reading each file's
  // header once: the open costs one read of the tier's contents), evicts
  // down to capacity. Fails on a bad option or an unusable directory.
  static Result<std::unique_ptr<DiskTier>> Open(const DiskTierOptions& options);
  ~DiskTier() override;  // syncfs of the directory when writes were not synced

  std::string name() const override { return "disk"; }
  void Put(const KvBlock& b) override;
  bool Get(BlockKey key, KvBlock* out) override;
  bool Contains(BlockKey key) override;
  void Evict(BlockKey key) override;
  int64_t size_blocks() override;
  TierStats stats() override;
  int64_t resident_bytes();           // bytes of indexed files
  std::string PathOf(BlockKey key) const;  // the block's file (tests, tools)

 private:
  explicit DiskTier(const DiskTierOptions& options);
  Status Scan();
  struct Entry {
    int64_t file_bytes = 0;
  };
  using Map = std::unordered_map<BlockKey, Entry>;
  void Index(BlockKey key, int64_t file_bytes);  // most recent
  void DropLocked(Map::iterator it);             // forget and delete the file
  void MakeRoomLocked(int64_t need_bytes);

  const DiskTierOptions options_;
  Env* const env_;
  std::mutex mu_;
  LruIndex<BlockKey> lru_;  // the keys of index_, by Put/Get
  Map index_;
  int64_t resident_bytes_ = 0;
  int64_t reserved_bytes_ = 0;  // room held for writes in flight (written without the lock)
  int64_t unsynced_puts_ = 0;
  TierStats stats_;
};

}  // namespace myriad::serve

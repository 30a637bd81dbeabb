#include "serve/kvcache/disk_tier.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

#include "core/checksum.h"
#include "serve/kvcache/block_record.h"

namespace myriad::serve {
namespace {

constexpr const char* kSuffix = ".kvb";

// "<16 lowercase hex>.kvb" -> key; anything else (tmp files, other files) is not a block.
bool ParseBlockFileName(const std::string& name, BlockKey* key) {
  if (name.size() != 16 + 4 || name.compare(16, 4, kSuffix) != 0) return false;
  BlockKey k = 0;
  for (int i = 0; i < 16; ++i) {
    const char c = name[i];
    int v;
    if (c >= '0' && c <= '9') v = c - '0';
    else if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
    else return false;
    k = (k << 4) | static_cast<BlockKey>(v);
  }
  *key = k;
  return true;
}

}  // namespace

DiskTier::DiskTier(const DiskTierOptions& options)
    : options_(options), env_(options.env ? options.env : Env::Default()) {}

DiskTier::~DiskTier() {
  if (unsynced_puts_ == 0) return;
  const int fd = ::open(options_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || ::syncfs(fd) != 0) LogTierError("disk", 1, "syncfs of " + options_.dir + " failed");
  if (fd >= 0) ::close(fd);
}

Result<std::unique_ptr<DiskTier>> DiskTier::Open(const DiskTierOptions& options) {
  if (options.dir.empty())
    return Status::Error("disk kv tier: dir is empty (hint: set a directory for T2 blocks)");
  if (options.capacity_bytes <= 0)
    return Status::Error("disk kv tier " + options.dir + ": capacity_bytes=" +
                         std::to_string(options.capacity_bytes) + " must be > 0");
  std::unique_ptr<DiskTier> t(new DiskTier(options));
  RETURN_IF_ERROR(t->env_->CreateDirs(options.dir).With("disk kv tier"));
  RETURN_IF_ERROR(t->Scan().With("disk kv tier"));
  return t;
}

std::string DiskTier::PathOf(BlockKey key) const {
  return options_.dir + "/" + ChecksumHex(key) + kSuffix;
}

Status DiskTier::Scan() {
  ASSIGN_OR_RETURN(std::vector<std::string> names, env_->ListDir(options_.dir));
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& name : names) {
    BlockKey key;
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0 &&
        ParseBlockFileName(name.substr(0, name.size() - 4), &key)) {
      // A write torn by a crash (only one DiskTier uses a directory at a time).
      if (!env_->RemoveAll(options_.dir + "/" + name).ok()) ++stats_.errors;
      continue;
    }
    if (!ParseBlockFileName(name, &key)) continue;
    auto data = env_->ReadFile(options_.dir + "/" + name);
    if (!data.ok()) {
      ++stats_.errors;
      continue;
    }
    BlockRecordHeader h;
    // Not ours (another model, or not a block record at all): left alone.
    // Ours but inconsistent with its name or size: indexed anyway, and Get
    // will find it corrupt, delete it and count it.
    if (!ParseBlockRecordHeader(*data, &h) || h.fingerprint != options_.fingerprint.value) continue;
    Index(key, static_cast<int64_t>(data->size()));
  }
  MakeRoomLocked(0);
  return Status::Ok();
}

void DiskTier::Index(BlockKey key, int64_t file_bytes) {
  lru_.Touch(key);
  index_[key] = Entry{file_bytes};
  resident_bytes_ += file_bytes;
}

void DiskTier::DropLocked(Map::iterator it) {
  const std::string path = PathOf(it->first);
  resident_bytes_ -= it->second.file_bytes;
  lru_.Erase(it->first);
  index_.erase(it);
  if (Status s = env_->RemoveAll(path); !s.ok()) ++stats_.errors;
}

void DiskTier::MakeRoomLocked(int64_t need_bytes) {
  while (!lru_.empty() && resident_bytes_ + need_bytes > options_.capacity_bytes) {
    DropLocked(index_.find(*lru_.Oldest()));
    ++stats_.evictions;
  }
}

void DiskTier::Put(const KvBlock& b) {
  if (options_.block_floats > 0 && static_cast<int64_t>(b.data.size()) != options_.block_floats) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.errors;
    return;
  }
  const std::string record = EncodeBlockRecord(b, options_.fingerprint);
  const int64_t bytes = static_cast<int64_t>(record.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes > options_.capacity_bytes) return;  // can never fit: dropped, like any full cache
    auto old = index_.find(b.key);
    const int64_t old_bytes = old == index_.end() ? 0 : old->second.file_bytes;
    if (old != index_.end()) lru_.Touch(b.key);  // spare it
    // Evict others until the new size fits in place of the old one (room
    // reserved for writes in flight counts as taken).
    while (lru_.size() > (old != index_.end() ? 1u : 0u) &&
           resident_bytes_ + reserved_bytes_ - old_bytes + bytes > options_.capacity_bytes) {
      DropLocked(index_.find(*lru_.Oldest()));
      ++stats_.evictions;
    }
    reserved_bytes_ += bytes;
  }
  // The write (and its fsyncs) runs without the lock: lookups from the
  // engine's scheduler thread must not wait for the disk.
  const Status s = WriteFileAtomic(env_, PathOf(b.key), record, options_.sync_writes);
  std::lock_guard<std::mutex> lock(mu_);
  reserved_bytes_ -= bytes;
  if (!options_.sync_writes) ++unsynced_puts_;
  if (!s.ok()) {
    // The old file, if any, is intact (WriteFileAtomic's contract); its entry stays.
    ++stats_.errors;
    LogTierError("disk", stats_.errors, "write failed: " + s.message());
    return;
  }
  if (auto old = index_.find(b.key); old != index_.end()) {
    resident_bytes_ += bytes - old->second.file_bytes;
    old->second.file_bytes = bytes;
  } else {
    Index(b.key, bytes);
  }
  ++stats_.puts;
  stats_.bytes_written += static_cast<int64_t>(b.data.size() * sizeof(float));
}

bool DiskTier::Get(BlockKey key, KvBlock* out) {
  const auto t0 = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++stats_.misses;
    return false;
  }
  auto data = env_->ReadFile(PathOf(key));
  Status s = data.ok() ? DecodeBlockRecord(*data, options_.fingerprint, key, options_.block_floats, out)
                       : data.status();
  if (!s.ok()) {
    DropLocked(it);
    ++stats_.errors;
    ++stats_.misses;
    LogTierError("disk", stats_.errors, "block " + ChecksumHex(key) + " dropped: " + s.message());
    return false;
  }
  lru_.Touch(key);
  ++stats_.hits;
  stats_.bytes_read += static_cast<int64_t>(out->data.size() * sizeof(float));
  stats_.read_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return true;
}

bool DiskTier::Contains(BlockKey key) {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.count(key) != 0;
}

void DiskTier::Evict(BlockKey key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = index_.find(key); it != index_.end()) DropLocked(it);
}

int64_t DiskTier::size_blocks() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(index_.size());
}

TierStats DiskTier::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

int64_t DiskTier::resident_bytes() {
  std::lock_guard<std::mutex> lock(mu_);
  return resident_bytes_;
}

}  // namespace myriad::serve

// Token shards: the on-disk form of a tokenized corpus split, written by
// `myriad prepare` and read (mmap, no copy) by the DataLoader.
//
// Format, version 1. All integers little-endian.
//
//   offset  size  field
//        0     8  magic "MYRTOK01"
//        8     4  u32 version = 1
//       12     2  u16 token_bytes: 2 (u16 ids, vocab_size <= 65536) or 4 (u32 ids)
//       14     2  u16 reserved = 0
//       16     4  u32 vocab_size (<= 2^31): every id is < vocab_size
//       20     4  u32 header_checksum: low 32 bits of xxHash64 of the 48 header
//                 bytes with this field zeroed (catches damaged counts)
//       24     8  u64 token_count
//       32     8  u64 document_count
//       40     8  u64 payload_checksum: xxHash64 (seed 0) of every byte after the header
//       48        tokens: token_count ids of token_bytes each
//                 zero padding to the next multiple of 8 bytes
//                 document index: document_count + 1 u64 offsets, in tokens;
//                 document d is tokens [index[d], index[d+1]); index[0] = 0,
//                 non-decreasing, index[document_count] = token_count.
//
// Whatever the writer is given is stored as is: `myriad prepare` appends the
// eos id to each document before handing it over, so a shard's token stream
// is "doc0 eos doc1 eos ...".
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/env.h"
#include "core/safetensors.h"  // MappedFile
#include "core/status.h"

namespace myriad {

inline constexpr char kShardMagic[8] = {'M', 'Y', 'R', 'T', 'O', 'K', '0', '1'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 48;

// Buffers one shard in memory (token_bytes × tokens + 8 × documents; callers
// bound it by starting a new shard, e.g. every 32M tokens) and writes it on
// Finish: to `path`.tmp, fsync, rename over `path`, fsync of the folder, all
// through `env`. Until Finish returns ok, `path` is untouched. Single-threaded.
class ShardWriter {
 public:
  // `vocab_size` (1..2^31) fixes the id width: u16 when it is <= 65536.
  ShardWriter(std::string path, uint32_t vocab_size, Env* env = Env::Default());

  // Appends one document. Fails, naming the shard, the id and its position,
  // when an id is negative or >= vocab_size; nothing is appended then.
  Status AppendDocument(const int32_t* tokens, size_t count);
  Status AppendDocument(const std::vector<int32_t>& tokens) {
    return AppendDocument(tokens.data(), tokens.size());
  }

  uint64_t num_tokens() const { return token_count_; }
  uint64_t num_documents() const { return doc_offsets_.size() - 1; }
  const std::string& path() const { return path_; }

  // Writes the file. The writer must not be used afterwards.
  Status Finish();

 private:
  std::string path_;
  uint32_t vocab_size_;
  Env* env_;
  int token_bytes_;
  uint64_t token_count_ = 0;
  std::string payload_;  // token bytes, then (at Finish) padding and index
  std::vector<uint64_t> doc_offsets_{0};
  bool finished_ = false;
};

// A validated, read-only, memory-mapped shard. Open checks, and reports with
// the file name, the value and a hint: a short or truncated file, a foreign
// magic, an unsupported version or id width, trailing bytes, a payload whose
// checksum does not match the header (flipped bits), a malformed document
// index and ids >= vocab_size. Open reads the whole file once (checksum);
// afterwards accesses are plain loads from the mapping.
// Movable, not copyable; const methods are thread-safe.
class ShardReader {
 public:
  static Result<ShardReader> Open(const std::string& path);

  uint64_t num_tokens() const { return token_count_; }
  uint64_t num_documents() const { return document_count_; }
  uint32_t vocab_size() const { return vocab_size_; }
  int token_bytes() const { return token_bytes_; }
  const std::string& path() const { return file_.path(); }

  int32_t token(uint64_t i) const;
  // Copies tokens [begin, begin + count) into out, widening to int32.
  // The range must lie inside the shard (CHECKed).
  void Read(uint64_t begin, uint64_t count, int32_t* out) const;
  // Token range [first, second) of document d < num_documents().
  std::pair<uint64_t, uint64_t> document_range(uint64_t d) const;
  std::vector<int32_t> ReadDocument(uint64_t d) const;

 private:
  ShardReader() = default;
  MappedFile file_;
  const uint8_t* tokens_ = nullptr;
  const uint8_t* index_ = nullptr;  // u64 little-endian offsets, read with memcpy
  uint64_t token_count_ = 0;
  uint64_t document_count_ = 0;
  uint32_t vocab_size_ = 0;
  int token_bytes_ = 2;
};

// "train" + 3 -> "train_003.bin".
std::string ShardFileName(const std::string& split, int index);

}  // namespace myriad

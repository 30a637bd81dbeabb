// DataLoader: fixed-length training rows from the token shards of one split,
// in a shuffled order that is a pure function of (seed, epoch), with a small
// cursor that checkpoints save and restore.
//
// Packing. The split's shards <split>_000.bin, <split>_001.bin, ... (numbered
// without gaps) are read with mmap and seen as ONE token stream, in shard
// order, without copying. `myriad prepare` stores every document followed by
// the eos id, so the stream is "doc0 eos doc1 eos ..." and the model learns
// where documents end; documents are not padded and rows cross document
// boundaries (no bos is inserted; eos separates documents).
//
// Rows. Row r is the window of seq_len + 1 tokens starting at r * seq_len:
// inputs are its first seq_len tokens, targets its last seq_len, so
// consecutive rows overlap by one token and every token but the first is a
// target exactly once per epoch. num_rows = (num_tokens - 1) / seq_len; the
// tail that does not fill a window is dropped.
//
// Order. Epoch e visits every row exactly once, in the order of a
// Fisher-Yates permutation drawn from Rng(mix(seed, e)). The cursor
// {epoch, index, seed} names the next row: permutation(seed, epoch)[index].
// NextBatch advances it, rolling into the next epoch after the last row.
//
// Thread safety: a DataLoader is not thread-safe; use one per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "data/shards.h"

namespace myriad {

struct DataCursor {
  uint64_t epoch = 0;
  uint64_t index = 0;  // rows of `epoch` already handed out
  uint64_t seed = 0;

  // {"epoch": 3, "index": 120, "seed": 1}
  nlohmann::json ToJson() const;
  // Fails, naming the field and the value, on a missing field or one that is
  // not a non-negative integer.
  static Result<DataCursor> FromJson(const nlohmann::json& json);
  bool operator==(const DataCursor&) const = default;
};

class DataLoader {
 public:
  // Opens <data_dir>/<split>_NNN.bin. Fails with the folder, the split and a
  // hint when the folder or the shards are missing, a shard is corrupt (see
  // ShardReader::Open), shards disagree on vocab_size, seq_len < 1, or the
  // split holds fewer than seq_len + 1 tokens (not even one row).
  static Result<std::unique_ptr<DataLoader>> Open(const std::string& data_dir,
                                                  const std::string& split, int seq_len,
                                                  uint64_t seed);

  // Writes `batch` rows into out[batch][seq_len + 1] (row-major) and advances
  // the cursor by `batch` rows (crossing into later epochs as needed).
  void NextBatch(int batch, int32_t* out);

  DataCursor cursor() const { return {epoch_, index_, seed_}; }
  // Restores a cursor from cursor(): the next NextBatch returns exactly what
  // it returned then. The cursor's seed replaces the loader's (a resumed run
  // keeps its data order even if the configured seed changed). Fails when
  // index > num_rows() (the data or seq_len changed since the cursor was taken).
  Status Seek(const DataCursor& cursor);

  uint64_t num_tokens() const { return num_tokens_; }
  uint64_t num_rows() const { return num_rows_; }
  int seq_len() const { return seq_len_; }
  uint32_t vocab_size() const { return vocab_size_; }
  size_t num_shards() const { return shards_.size(); }
  const std::string& split() const { return split_; }

  // Copies row `row` < num_rows() (seq_len + 1 tokens, stream order) to out;
  // independent of the cursor, e.g. for a sequential evaluation pass.
  void ReadRow(uint64_t row, int32_t* out) const;
  // Copies tokens [begin, begin + count) of the split's stream; must be in range.
  void ReadTokens(uint64_t begin, uint64_t count, int32_t* out) const;

  // The row visited at position `index` of `epoch` under `seed` (recomputes
  // the permutation; for tests and tools, not for the training loop).
  uint64_t RowAt(uint64_t seed, uint64_t epoch, uint64_t index) const;

 private:
  DataLoader() = default;
  void BuildPermutation(uint64_t seed, uint64_t epoch, std::vector<uint64_t>* perm) const;

  std::string data_dir_, split_;
  int seq_len_ = 0;
  uint32_t vocab_size_ = 0;
  std::vector<ShardReader> shards_;   // non-empty shards, in stream order
  std::vector<uint64_t> shard_start_; // first stream position of each shard
  uint64_t num_tokens_ = 0, num_rows_ = 0;

  uint64_t seed_ = 0, epoch_ = 0, index_ = 0;
  std::vector<uint64_t> perm_;  // permutation of epoch_ under seed_
};

}  // namespace myriad

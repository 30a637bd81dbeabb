// The weights of a Hugging Face model folder (issue 16): model.safetensors,
// or the shards that model.safetensors.index.json lists ("weight_map":
// tensor name -> file), every file mapped read-only and validated, every
// tensor readable as fp32 from F32, BF16 or F16; and their writer
// (WriteHfWeights, for `myriad export`).
//
// Errors are one line naming the folder or file and what is wrong: a folder
// with neither file, an index that is not JSON or has no weight_map, a shard
// name that is not a plain file name, a missing shard (with how many tensors
// it was to hold), a truncated or otherwise invalid safetensors file
// (SafetensorsFile::Open), a tensor the index puts in a shard that does not
// hold it, a tensor held by two shards, and on reading: a missing tensor, a
// dtype other than F32/BF16/F16, a shape other than the expected one.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/env.h"
#include "core/safetensors.h"
#include "core/status.h"

namespace myriad::hf {

// The folder's weights: one file, or the index of its shards.
inline constexpr const char* kSingleFile = "model.safetensors";
inline constexpr const char* kIndexFile = "model.safetensors.index.json";

// Every file of one folder, mapped; tensor names are unique across them.
class HfWeights {
 public:
  static Result<HfWeights> Open(const std::string& dir);

  HfWeights(HfWeights&&) noexcept = default;
  HfWeights& operator=(HfWeights&&) noexcept = default;

  // Every tensor name, sorted.
  std::vector<std::string> names() const;
  // nullptr when there is no such tensor.
  const TensorView* Find(const std::string& name) const;
  // The file that holds `name` ("" when none).
  std::string FileOf(const std::string& name) const;
  // The tensor converted to fp32 (exactly: BF16 and F16 widen without
  // rounding), after checking that it exists, has a float dtype and exactly
  // `shape`.
  Result<std::vector<float>> ReadF32(const std::string& name, const std::vector<int64_t>& shape) const;
  const std::string& dir() const { return dir_; }

 private:
  HfWeights() = default;
  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::pair<size_t, const TensorView*>> where_;  // name -> (file, view)
};

// ---- Writing a folder's weights (myriad export) ----

// One tensor to write: fp32 values stored as `dtype`.
struct HfTensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // NumElements(shape) floats; the caller keeps them alive for the call
  // "F32", "BF16" or "F16". BF16 and F16 are written only when every value
  // converts exactly (a value that would round is refused, naming it): the
  // folder then reads back bit for bit.
  std::string dtype = "F32";
};

struct HfWriteOptions {
  // A shard holds tensors of at most this many bytes in all (a larger tensor
  // gets a shard of its own); 0, or a total that fits, writes the one file
  // model.safetensors and no index.
  uint64_t max_shard_bytes = 0;
};

// What WriteHfWeights wrote.
struct HfWrittenWeights {
  std::vector<std::string> files;  // file names in `dir`, in order (the index last when sharded)
  uint64_t total_size = 0;         // bytes of tensor data (the index's metadata.total_size)
};

// Writes `tensors` into the existing folder `dir` in Hugging Face's layout:
// model.safetensors, or shards model-0000k-of-0000n.safetensors (tensors
// split contiguously in the given order) and model.safetensors.index.json
// (metadata.total_size, weight_map) written last. Every file is written
// atomically and durably (WriteSafetensors, WriteFileAtomic: temp file,
// fsync, rename, fsync of the folder) and carries __metadata__
// {"format": "pt"}, which transformers requires. A failure names the file or
// tensor; files written before it stay (callers write into a temporary
// folder: ExportHfModel). Other weight files already in `dir` are not
// removed, and a stale index would shadow a new single file: write into an
// empty folder.
Result<HfWrittenWeights> WriteHfWeights(Env* env, const std::string& dir, const std::vector<HfTensorToWrite>& tensors,
                                        const HfWriteOptions& options = {});

}  // namespace myriad::hf

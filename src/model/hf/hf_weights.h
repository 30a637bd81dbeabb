// The weights of a Hugging Face model folder, the first part of `myriad
// import` (issue 16): model.safetensors, or the shards that
// model.safetensors.index.json lists ("weight_map": tensor name -> file),
// every file mapped read-only and validated, every tensor readable as fp32
// from F32, BF16 or F16.
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

}  // namespace myriad::hf

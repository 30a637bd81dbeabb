// Safetensors: the Hugging Face tensor file format, read with mmap and
// written atomically through Env.
//
// Layout (all integers little-endian):
//   u64 N                      length of the JSON header in bytes
//   N bytes of JSON            {"__metadata__": {str: str}?,
//                               "<name>": {"dtype": "F32", "shape": [..],
//                                          "data_offsets": [begin, end)}, ...}
//   data section               offsets are relative to its start (8 + N)
//
// Files written here pad the header with spaces so the data section starts on
// an 8-byte boundary and lay tensors out in the order given, contiguously.
// Files from other writers are accepted as long as every tensor lies inside
// the file, tensors do not overlap and sizes agree with dtype × shape; gaps and
// trailing bytes after the last tensor are tolerated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/env.h"
#include "core/status.h"

namespace myriad {

// A borrowed, read-only view of one tensor's bytes. It never owns `data`:
// when produced by SafetensorsFile it points into that file's mapping and is
// valid as long as the file object lives (moving the object keeps it valid);
// when passed to a writer, the caller keeps `data` alive for the call.
// `data` may be unaligned for files written by other tools: copy with memcpy
// (ReadF32 does) rather than casting when alignment matters.
struct TensorView {
  std::string name;
  std::string dtype;  // "F32","F16","BF16","F64","I8","I16","I32","I64","U8","U16","U32","U64","BOOL",...
  std::vector<int64_t> shape;  // {} is a scalar (one element)
  const void* data = nullptr;
  size_t nbytes = 0;
};

// Bytes per element of a safetensors dtype name, or 0 if the name is unknown.
size_t DtypeSize(std::string_view dtype);

// Number of elements of `shape` (1 for a scalar), or -1 if a dimension is
// negative or the product overflows int64.
int64_t NumElements(const std::vector<int64_t>& shape);

// "[2, 3]": for messages and tables.
std::string ShapeString(const std::vector<int64_t>& shape);

// Checks what a writer needs: names unique, non-empty and not "__metadata__";
// dtype known; nbytes == elements × dtype size; data non-null when nbytes > 0.
Status ValidateTensorViews(const std::vector<TensorView>& tensors);

// The whole file as bytes, in memory. Tensors are laid out in the given order.
// Bad views are a bug in the caller: this CHECK-fails on them (validate first
// with ValidateTensorViews when they come from outside). Holds a full copy of
// all tensor data; prefer WriteSafetensors for large files.
std::string SerializeSafetensors(const std::vector<TensorView>& tensors,
                                 const std::map<std::string, std::string>& metadata);

// What a writer wrote: the file size and the xxHash64 (Checksum64) of its
// bytes, computed while writing so callers need not read the file back.
struct WrittenFileInfo {
  uint64_t size = 0;
  uint64_t checksum = 0;
};

// Writes a safetensors file durably and atomically: streams the header and
// each tensor (no extra copy of tensor data) into `path`.tmp, fsyncs it,
// renames it over `path` and fsyncs the directory. If anything fails before
// the rename, the old file at `path`, if any, is untouched and the .tmp file
// is removed (best effort); only the final directory fsync can fail after the
// new file is in place. Errors name the path. Invalid views are reported as
// errors here. Thread-safe for distinct paths.
// `info`, if non-null, receives size and checksum on success.
Status WriteSafetensors(Env* env, const std::string& path, const std::vector<TensorView>& tensors,
                        const std::map<std::string, std::string>& metadata,
                        WrittenFileInfo* info = nullptr);

// A whole file mapped read-only (mmap, MAP_PRIVATE). Movable, not copyable;
// unmaps in the destructor. An empty file maps to data() == nullptr, size 0.
// Thread-safe for concurrent reads. Reads bypass Env (Env has no mmap).
class MappedFile {
 public:
  static Result<MappedFile> Open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void Reset();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// A parsed, validated safetensors file over a read-only mapping. All views
// point into the mapping; nothing is copied. Movable (views stay valid), not
// copyable; unmaps in the destructor. Const methods are thread-safe.
//
// Open fails with a message naming the file for: a file shorter than 8 bytes,
// a header length beyond the file, a header that is not a JSON object, an
// unknown dtype, a bad shape, data_offsets that disagree with dtype × shape,
// lie outside the data section or overlap another tensor, and a __metadata__
// that is not a string→string map.
class SafetensorsFile {
 public:
  static Result<SafetensorsFile> Open(const std::string& path);
  // Parses an already mapped file (e.g. after its checksum was verified) and
  // takes ownership of the mapping.
  static Result<SafetensorsFile> FromMapped(MappedFile file);

  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // nullptr if there is no tensor of that name.
  const TensorView* Find(const std::string& name) const;
  // In data-offset order (the order a Myriad writer was given).
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return file_.path(); }
  // The raw file bytes (header included).
  std::string_view bytes() const {
    return {reinterpret_cast<const char*>(file_.data()), file_.size()};
  }

 private:
  SafetensorsFile() = default;
  MappedFile file_;
  std::vector<TensorView> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Copies tensor `name` out as floats after checking that it exists, is F32 and
// has exactly `expected_shape`. Errors name the file, the tensor and both
// shapes, e.g. "model.safetensors: tensor model.norm.weight has shape [64] but
// the config expects [32] (hint: the checkpoint was written for another model
// config)".
Result<std::vector<float>> ReadF32(const SafetensorsFile& file, const std::string& name,
                                   const std::vector<int64_t>& expected_shape);

}  // namespace myriad

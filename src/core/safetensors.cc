#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/config.h"

namespace myriad {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; a big-endian host needs byte swapping");

namespace {

// The reference implementation refuses headers above 100 MB; so do we, so that
// a corrupt length cannot make us parse gigabytes as JSON.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;
constexpr const char* kMetadataKey = "__metadata__";
constexpr const char* kNotSafetensorsHint =
    "(hint: the file is truncated or is not a safetensors file)";

Status FileError(const std::string& path, const std::string& message) {
  return Status::Error(path + ": " + message);
}

std::string DtypeList() {
  return "F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U64, U32, U16, U8, BOOL";
}

void PutU64LE(uint64_t v, char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t GetU64LE(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// The 8-byte length plus the JSON header, padded with spaces so the data
// section starts 8-byte aligned. Views must be valid.
std::string BuildPrefix(const std::vector<TensorView>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header[kMetadataKey] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const TensorView& t : tensors) {
    nlohmann::ordered_json entry;
    entry["dtype"] = t.dtype;
    entry["shape"] = t.shape;
    entry["data_offsets"] = {offset, offset + t.nbytes};
    header[t.name] = std::move(entry);
    offset += t.nbytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string prefix(8, '\0');
  PutU64LE(json.size(), prefix.data());
  prefix += json;
  return prefix;
}

// Reads a non-negative JSON integer; false if `j` is anything else.
bool GetNonNegative(const nlohmann::json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(j.get<int64_t>());
    return true;
  }
  return false;
}

// One header entry, checked against the data section of `data_size` bytes.
Status ParseTensorEntry(const std::string& path, const std::string& name,
                        const nlohmann::json& entry, const uint8_t* data, uint64_t data_size,
                        TensorView* out, uint64_t* begin_out) {
  const std::string where = "tensor " + name;
  if (!entry.is_object()) {
    return FileError(path, where + ": header entry is not an object " + kNotSafetensorsHint);
  }
  auto dt = entry.find("dtype");
  auto sh = entry.find("shape");
  auto off = entry.find("data_offsets");
  if (dt == entry.end() || sh == entry.end() || off == entry.end()) {
    return FileError(path, where + ": header entry needs dtype, shape and data_offsets " +
                               kNotSafetensorsHint);
  }
  if (!dt->is_string()) return FileError(path, where + ": dtype is not a string");
  const std::string dtype = dt->get<std::string>();
  const size_t elem = DtypeSize(dtype);
  if (elem == 0) {
    return FileError(path, where + " has unknown dtype \"" + dtype + "\" (hint: known dtypes are " +
                               DtypeList() + ")");
  }
  if (!sh->is_array()) return FileError(path, where + ": shape is not an array");
  std::vector<int64_t> shape;
  for (const auto& d : *sh) {
    uint64_t v;
    if (!GetNonNegative(d, &v) || v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return FileError(path, where + ": shape " + sh->dump() +
                                 " has a dimension that is not a non-negative integer");
    }
    shape.push_back(static_cast<int64_t>(v));
  }
  const int64_t n = NumElements(shape);
  if (n < 0 || static_cast<uint64_t>(n) > std::numeric_limits<uint64_t>::max() / elem) {
    return FileError(path, where + ": shape " + ShapeString(shape) + " is too large");
  }
  const uint64_t expected = static_cast<uint64_t>(n) * elem;
  uint64_t begin = 0, end = 0;
  if (!off->is_array() || off->size() != 2 || !GetNonNegative((*off)[0], &begin) ||
      !GetNonNegative((*off)[1], &end) || end < begin) {
    return FileError(path, where + ": data_offsets " + off->dump() +
                               " is not a pair [begin, end) with begin <= end " +
                               kNotSafetensorsHint);
  }
  if (end - begin != expected) {
    return FileError(path, where + ": dtype " + dtype + " and shape " + ShapeString(shape) +
                               " need " + std::to_string(expected) + " bytes but data_offsets [" +
                               std::to_string(begin) + ", " + std::to_string(end) + ") hold " +
                               std::to_string(end - begin) + " (hint: the file is corrupt)");
  }
  if (end > data_size) {
    return FileError(path, where + ": data_offsets [" + std::to_string(begin) + ", " +
                               std::to_string(end) + ") lie beyond the data section of " +
                               std::to_string(data_size) + " bytes " + kNotSafetensorsHint);
  }
  out->name = name;
  out->dtype = dtype;
  out->shape = std::move(shape);
  out->data = data + begin;
  out->nbytes = static_cast<size_t>(expected);
  *begin_out = begin;
  return Status::Ok();
}

}  // namespace

size_t DtypeSize(std::string_view dtype) {
  static const std::map<std::string_view, size_t> kSizes = {
      {"F64", 8}, {"F32", 4},     {"F16", 2},     {"BF16", 2}, {"F8_E4M3", 1},
      {"F8_E5M2", 1}, {"I64", 8}, {"I32", 4},     {"I16", 2},  {"I8", 1},
      {"U64", 8}, {"U32", 4},     {"U16", 2},     {"U8", 1},   {"BOOL", 1}};
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

Status ValidateTensorViews(const std::vector<TensorView>& tensors) {
  std::unordered_map<std::string, size_t> seen;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& t = tensors[i];
    const std::string where = "tensor #" + std::to_string(i) + " \"" + t.name + "\"";
    if (t.name.empty() || t.name == kMetadataKey) {
      return Status::Error(where + ": name must be non-empty and not __metadata__");
    }
    if (!seen.emplace(t.name, i).second) {
      return Status::Error(where + ": duplicate name (also tensor #" +
                           std::to_string(seen[t.name]) + ")");
    }
    const size_t elem = DtypeSize(t.dtype);
    if (elem == 0) {
      return Status::Error(where + ": unknown dtype \"" + t.dtype + "\" (hint: use one of " +
                           DtypeList() + ")");
    }
    const int64_t n = NumElements(t.shape);
    if (n < 0 || static_cast<uint64_t>(n) > std::numeric_limits<uint64_t>::max() / elem) {
      return Status::Error(where + ": invalid shape " + ShapeString(t.shape));
    }
    if (static_cast<uint64_t>(n) * elem != t.nbytes) {
      return Status::Error(where + ": " + t.dtype + " " + ShapeString(t.shape) + " needs " +
                           std::to_string(static_cast<uint64_t>(n) * elem) +
                           " bytes but the view has " + std::to_string(t.nbytes));
    }
    if (t.nbytes > 0 && t.data == nullptr) return Status::Error(where + ": data is null");
  }
  return Status::Ok();
}

std::string SerializeSafetensors(const std::vector<TensorView>& tensors,
                                 const std::map<std::string, std::string>& metadata) {
  Status valid = ValidateTensorViews(tensors);
  CHECK_MSG(valid.ok(), "SerializeSafetensors: %s", valid.message().c_str());
  std::string out = BuildPrefix(tensors, metadata);
  size_t total = out.size();
  for (const TensorView& t : tensors) total += t.nbytes;
  out.reserve(total);
  for (const TensorView& t : tensors) out.append(static_cast<const char*>(t.data), t.nbytes);
  return out;
}

Status WriteSafetensors(Env* env, const std::string& path, const std::vector<TensorView>& tensors,
                        const std::map<std::string, std::string>& metadata,
                        WrittenFileInfo* info) {
  RETURN_IF_ERROR(ValidateTensorViews(tensors).With(path));
  const std::string tmp = path + ".tmp";
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> hash(XXH64_createState(),
                                                                   &XXH64_freeState);
  CHECK(hash != nullptr);
  XXH64_reset(hash.get(), 0);
  uint64_t written = 0;
  Status s;
  {
    auto file = env->NewWritableFile(tmp);
    if (!file.ok()) return file.status();
    WritableFile* f = file->get();
    auto append = [&](const char* p, size_t n) {
      // Bounded pieces: hash each piece while it is still in cache, and give
      // fault-injection tests a write boundary to fail at.
      constexpr size_t kPiece = 4u << 20;
      while (n > 0 && s.ok()) {
        const size_t k = std::min(n, kPiece);
        XXH64_update(hash.get(), p, k);
        s = f->Append(std::string_view(p, k));
        written += k;
        p += k;
        n -= k;
      }
    };
    const std::string prefix = BuildPrefix(tensors, metadata);
    append(prefix.data(), prefix.size());
    for (const TensorView& t : tensors) append(static_cast<const char*>(t.data), t.nbytes);
    if (s.ok()) s = f->Sync();
    Status c = f->Close();
    if (s.ok()) s = c;
  }
  if (s.ok()) s = env->RenameFile(tmp, path);
  if (!s.ok()) {
    (void)env->RemoveAll(tmp);
    return s;
  }
  const std::string dir = std::filesystem::path(path).parent_path().string();
  RETURN_IF_ERROR(env->SyncDir(dir.empty() ? "." : dir));
  if (info) {
    info->size = written;
    info->checksum = XXH64_digest(hash.get());
  }
  return Status::Ok();
}

// ---- MappedFile ----

Result<MappedFile> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return FileError(path, std::string("cannot open: ") + std::strerror(errno) +
                               " (hint: check the path)");
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return FileError(path, std::string("cannot stat: ") + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return FileError(path, "not a regular file (hint: pass the path of a file, not a directory)");
  }
  MappedFile m;
  m.path_ = path;
  m.size_ = static_cast<size_t>(st.st_size);
  if (m.size_ > 0) {
    void* p = ::mmap(nullptr, m.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      m.size_ = 0;
      return FileError(path, std::string("mmap failed: ") + std::strerror(err));
    }
    m.data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file open
  return m;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Reset();
    path_ = std::move(other.path_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

MappedFile::~MappedFile() { Reset(); }

void MappedFile::Reset() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

// ---- SafetensorsFile ----

Result<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  return FromMapped(std::move(file));
}

Result<SafetensorsFile> SafetensorsFile::FromMapped(MappedFile file) {
  const std::string& path = file.path();
  const uint64_t size = file.size();
  if (size < 8) {
    return FileError(path, "file is " + std::to_string(size) +
                               " bytes, shorter than the 8-byte header length " +
                               kNotSafetensorsHint);
  }
  const uint64_t header_len = GetU64LE(file.data());
  if (header_len > size - 8) {
    return FileError(path, "header length " + std::to_string(header_len) +
                               " goes beyond the end of the file (" + std::to_string(size) +
                               " bytes) " + kNotSafetensorsHint);
  }
  if (header_len > kMaxHeaderBytes) {
    return FileError(path, "header length " + std::to_string(header_len) +
                               " exceeds the 100 MB limit " + kNotSafetensorsHint);
  }
  const char* hbegin = reinterpret_cast<const char*>(file.data()) + 8;
  nlohmann::json header =
      nlohmann::json::parse(hbegin, hbegin + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return FileError(path, std::string("header is not a valid JSON object ") +
                               kNotSafetensorsHint);
  }

  SafetensorsFile out;
  const uint8_t* data = file.data() + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  std::vector<std::pair<uint64_t, TensorView>> found;
  found.reserve(header.size());
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == kMetadataKey) {
      if (!it->is_object()) {
        return FileError(path, "__metadata__ is not an object (hint: it must map strings to strings)");
      }
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return FileError(path, "__metadata__ value for \"" + m.key() +
                                     "\" is not a string (hint: it must map strings to strings)");
        }
        out.metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    TensorView view;
    uint64_t begin = 0;
    RETURN_IF_ERROR(ParseTensorEntry(path, it.key(), *it, data, data_size, &view, &begin));
    found.emplace_back(begin, std::move(view));
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first < b.first;
    if (a.second.nbytes != b.second.nbytes) return a.second.nbytes < b.second.nbytes;
    return a.second.name < b.second.name;
  });
  // Sorted by begin: a tensor overlaps an earlier one iff it starts before the
  // furthest end seen so far (empty tensors occupy no bytes).
  uint64_t max_end = 0;
  const std::string* max_end_name = nullptr;
  for (const auto& [begin, view] : found) {
    if (view.nbytes == 0) continue;
    if (begin < max_end) {
      return FileError(path, "tensor " + view.name + " (bytes [" + std::to_string(begin) + ", " +
                                 std::to_string(begin + view.nbytes) + ")) overlaps tensor " +
                                 *max_end_name + " (hint: the file is corrupt)");
    }
    max_end = begin + view.nbytes;
    max_end_name = &view.name;
  }
  out.tensors_.reserve(found.size());
  for (auto& [begin, view] : found) {
    out.index_.emplace(view.name, out.tensors_.size());
    out.tensors_.push_back(std::move(view));
  }
  out.file_ = std::move(file);  // the mapping does not move: views stay valid
  return out;
}

const TensorView* SafetensorsFile::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Result<std::vector<float>> ReadF32(const SafetensorsFile& file, const std::string& name,
                                   const std::vector<int64_t>& expected_shape) {
  const TensorView* t = file.Find(name);
  if (t == nullptr) {
    std::string hint = "the checkpoint was written for another model config";
    size_t best = std::numeric_limits<size_t>::max();
    const std::string* closest = nullptr;
    for (const TensorView& v : file.tensors()) {
      const size_t d = EditDistance(name, v.name);
      if (d < best) {
        best = d;
        closest = &v.name;
      }
    }
    if (closest != nullptr && best <= std::max<size_t>(3, name.size() / 4)) {
      hint = "did you mean " + *closest + "? otherwise " + hint;
    }
    return FileError(file.path(), "no tensor named " + name + " among " +
                                      std::to_string(file.tensors().size()) + " tensors (hint: " +
                                      hint + ")");
  }
  if (t->dtype != "F32") {
    return FileError(file.path(), "tensor " + name + " has dtype " + t->dtype +
                                      " but F32 is required (hint: convert the checkpoint to "
                                      "F32 or load it with a reader for " + t->dtype + ")");
  }
  if (t->shape != expected_shape) {
    return FileError(file.path(), "tensor " + name + " has shape " + ShapeString(t->shape) +
                                      " but the config expects " + ShapeString(expected_shape) +
                                      " (hint: the checkpoint was written for another model "
                                      "config)");
  }
  std::vector<float> out(t->nbytes / sizeof(float));
  if (t->nbytes > 0) std::memcpy(out.data(), t->data, t->nbytes);
  return out;
}

}  // namespace myriad

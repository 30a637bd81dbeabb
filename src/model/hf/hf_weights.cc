#include "model/hf/hf_weights.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/half.h"

namespace myriad::hf {
namespace {

// The shard names Hugging Face writes: model-00001-of-00003.safetensors.
std::string ShardName(size_t k, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k, n);
  return buf;
}

bool PlainFileName(const std::string& n) {
  return !n.empty() && n != "." && n != ".." && n.find('/') == std::string::npos;
}

}  // namespace

Result<HfWeights> HfWeights::Open(const std::string& dir) {
  namespace fs = std::filesystem;
  HfWeights w;
  w.dir_ = dir;
  const std::string index_path = dir + "/" + kIndexFile, single = dir + "/" + kSingleFile;
  std::error_code ec;
  // Each shard's file name, and the tensors the index puts in it.
  std::map<std::string, std::vector<std::string>> shards;
  const bool indexed = fs::exists(index_path, ec);
  if (indexed) {
    std::ifstream in(index_path);
    std::stringstream ss;
    ss << in.rdbuf();
    const auto j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
    if (!in || j.is_discarded() || !j.is_object())
      return Status::Error(index_path + ": not a JSON object (hint: the download may be incomplete)");
    const auto map = j.find("weight_map");
    if (map == j.end() || !map->is_object() || map->empty())
      return Status::Error(index_path + ": has no \"weight_map\" object of tensor name -> shard file");
    for (auto it = map->begin(); it != map->end(); ++it) {
      if (!it->is_string() || !PlainFileName(it->get<std::string>()))
        return Status::Error(index_path + ": weight_map[\"" + it.key() + "\"] is not a plain file name in the folder");
      shards[it->get<std::string>()].push_back(it.key());
    }
  } else if (fs::exists(single, ec)) {
    shards[kSingleFile] = {};
  } else {
    return Status::Error(dir + ": neither " + kSingleFile + " nor " + kIndexFile +
                         " (hint: the folder of a Hugging Face model, with its weights in safetensors)");
  }
  for (const auto& [file, listed] : shards) {
    const std::string path = dir + "/" + file;
    if (!fs::exists(path, ec))
      return Status::Error(path + ": missing (" + kIndexFile + " lists " + std::to_string(listed.size()) +
                           " tensors in it, e.g. " + listed.front() + ")");
    ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(path));
    w.files_.push_back(std::move(f));
  }
  size_t i = 0;
  for (const auto& [file, listed] : shards) {
    const SafetensorsFile& f = w.files_[i];
    for (const TensorView& v : f.tensors()) {
      auto [it, fresh] = w.where_.emplace(v.name, std::make_pair(i, &v));
      if (!fresh)
        return Status::Error(dir + ": tensor " + v.name + " is in both " + w.files_[it->second.first].path() +
                             " and " + f.path());
    }
    for (const std::string& name : listed)
      if (!f.Find(name))
        return Status::Error(index_path + ": puts " + name + " in " + file + ", which does not hold it");
    ++i;
  }
  return w;
}

std::vector<std::string> HfWeights::names() const {
  std::vector<std::string> out;
  for (const auto& [name, at] : where_) out.push_back(name);
  return out;
}

const TensorView* HfWeights::Find(const std::string& name) const {
  const auto it = where_.find(name);
  return it == where_.end() ? nullptr : it->second.second;
}

std::string HfWeights::FileOf(const std::string& name) const {
  const auto it = where_.find(name);
  return it == where_.end() ? "" : files_[it->second.first].path();
}

Result<std::vector<float>> HfWeights::ReadF32(const std::string& name, const std::vector<int64_t>& shape) const {
  const TensorView* v = Find(name);
  if (!v) return Status::Error(dir_ + ": no tensor " + name + " (hint: the config's architecture expects it)");
  const std::string where = FileOf(name) + ": tensor " + name;
  if (v->shape != shape)
    return Status::Error(where + " has shape " + ShapeString(v->shape) + " but the config expects " +
                         ShapeString(shape));
  size_t n = 1;
  for (int64_t d : v->shape) n *= static_cast<size_t>(d);
  std::vector<float> out(n);
  const auto* bytes = static_cast<const uint8_t*>(v->data);
  if (v->dtype == "F32") {
    std::memcpy(out.data(), bytes, n * 4);
  } else if (v->dtype == "BF16" || v->dtype == "F16") {
    const bool bf16 = v->dtype == "BF16";
    for (size_t k = 0; k < n; ++k) {
      uint16_t h;
      std::memcpy(&h, bytes + 2 * k, 2);  // (the mapping need not be 2-byte aligned for every tensor)
      out[k] = bf16 ? Bf16ToFloat(h) : HalfToFloat(h);
    }
  } else {
    return Status::Error(where + " has dtype " + v->dtype + "; weights are read from F32, BF16 or F16");
  }
  return out;
}

Result<HfWrittenWeights> WriteHfWeights(Env* env, const std::string& dir, const std::vector<HfTensorToWrite>& tensors,
                                        const HfWriteOptions& options) {
  // Each tensor's bytes in its dtype; every check before anything is written.
  std::vector<uint64_t> bytes(tensors.size());
  std::set<std::string> names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const HfTensorToWrite& t = tensors[i];
    if (!names.insert(t.name).second) return Status::Error(dir + ": tensor " + t.name + " is given twice");
    const int64_t n = NumElements(t.shape);
    if (n < 0) return Status::Error(dir + ": tensor " + t.name + " has a bad shape " + ShapeString(t.shape));
    if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16")
      return Status::Error(dir + ": tensor " + t.name + ": dtype " + t.dtype + " cannot be written (F32, BF16 or F16)");
    if (n > 0 && !t.data) return Status::Error(dir + ": tensor " + t.name + " has no data");
    bytes[i] = static_cast<uint64_t>(n) * (t.dtype == "F32" ? 4 : 2);
    if (t.dtype == "F32") continue;
    const bool bf16 = t.dtype == "BF16";
    for (int64_t e = 0; e < n; ++e) {
      const float back = bf16 ? Bf16ToFloat(FloatToBf16(t.data[e])) : HalfToFloat(FloatToHalf(t.data[e]));
      if (std::memcmp(&back, &t.data[e], sizeof back) == 0) continue;
      char value[32];
      std::snprintf(value, sizeof value, "%.9g", t.data[e]);
      return Status::Error(dir + ": tensor " + t.name + " element " + std::to_string(e) + " = " + value +
                           " is not exactly representable in " + t.dtype + " (hint: write F32, the default; " +
                           t.dtype + " is for weights that are " + t.dtype + " values already)");
    }
  }
  // Shards: contiguous runs of tensors of at most max_shard_bytes.
  std::vector<std::pair<size_t, size_t>> shards;  // [begin, end) into tensors
  uint64_t total = 0, in_shard = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (shards.empty() || (options.max_shard_bytes > 0 && in_shard > 0 && in_shard + bytes[i] > options.max_shard_bytes)) {
      shards.push_back({i, i});
      in_shard = 0;
    }
    shards.back().second = i + 1;
    in_shard += bytes[i];
    total += bytes[i];
  }
  if (shards.empty()) shards.push_back({0, 0});
  const bool sharded = shards.size() > 1;
  HfWrittenWeights out;
  out.total_size = total;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string name = sharded ? ShardName(k + 1, shards.size()) : kSingleFile;
    const std::string path = dir + "/" + name;
    // 16-bit copies of this shard's converted tensors (fp32 ones are written from the caller's memory).
    std::vector<std::vector<uint16_t>> half(shards[k].second - shards[k].first);
    std::vector<TensorView> views;
    for (size_t i = shards[k].first; i < shards[k].second; ++i) {
      const HfTensorToWrite& t = tensors[i];
      const size_t n = static_cast<size_t>(NumElements(t.shape));
      TensorView v{t.name, t.dtype, t.shape, t.data, static_cast<size_t>(bytes[i])};
      if (t.dtype != "F32") {
        const bool bf16 = t.dtype == "BF16";
        std::vector<uint16_t>& h = half[i - shards[k].first];
        h.resize(n);
        for (size_t e = 0; e < n; ++e) h[e] = bf16 ? FloatToBf16(t.data[e]) : FloatToHalf(t.data[e]);
        v.data = h.data();
      }
      views.push_back(std::move(v));
      weight_map[t.name] = name;
    }
    RETURN_IF_ERROR(WriteSafetensors(env, path, views, metadata));
    out.files.push_back(name);
  }
  if (sharded) {
    const nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    RETURN_IF_ERROR(WriteFileAtomic(env, dir + "/" + kIndexFile, index.dump(2) + "\n"));
    out.files.push_back(kIndexFile);
  }
  return out;
}

}  // namespace myriad::hf

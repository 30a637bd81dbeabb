#include "model/hf/hf_weights.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/half.h"

namespace myriad::hf {
namespace {

std::string ShapeString(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
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

}  // namespace myriad::hf

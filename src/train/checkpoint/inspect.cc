// InspectCheckpoint: the human-readable report behind `myriad inspect`.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ostream>

#include "model/flops.h"
#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/manifest.h"

namespace myriad {
namespace {

struct TensorStats {
  bool has = false;  // only for dtypes we decode
  double mean = 0, std = 0, absmax = 0;
  int64_t nonfinite = 0;
};

float LoadBF16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float LoadF32(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, 4);  // views may be unaligned
  return f;
}

// Mean, population std and absmax over the finite values (two passes).
TensorStats ComputeStats(const TensorView& t) {
  TensorStats st;
  float (*load)(const uint8_t*) = nullptr;
  size_t step = 0;
  if (t.dtype == "F32") {
    load = LoadF32;
    step = 4;
  } else if (t.dtype == "BF16") {
    load = LoadBF16;
    step = 2;
  } else {
    return st;
  }
  st.has = true;
  const auto* p = static_cast<const uint8_t*>(t.data);
  const size_t n = t.nbytes / step;
  double sum = 0;
  int64_t finite = 0;
  for (size_t i = 0; i < n; ++i) {
    const float v = load(p + i * step);
    if (!std::isfinite(v)) {
      ++st.nonfinite;
      continue;
    }
    sum += v;
    st.absmax = std::max(st.absmax, static_cast<double>(std::fabs(v)));
    ++finite;
  }
  if (finite == 0) return st;
  st.mean = sum / static_cast<double>(finite);
  double sq = 0;
  for (size_t i = 0; i < n; ++i) {
    const float v = load(p + i * step);
    if (std::isfinite(v)) sq += (v - st.mean) * (v - st.mean);
  }
  st.std = std::sqrt(sq / static_cast<double>(finite));
  return st;
}

std::string Human(double n) {
  const char* units[] = {"", "K", "M", "B", "T"};
  int u = 0;
  while (n >= 1000 && u < 4) {
    n /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f%s" : "%.2f%s", n, units[u]);
  return buf;
}

std::string Clip(const std::string& s, size_t max) {
  return s.size() <= max ? s : s.substr(0, max) + "...";
}

std::string Pad(const std::string& s, size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

void PrintTensorTable(const SafetensorsFile& file, const std::string& title, std::ostream& out) {
  size_t name_w = 4, shape_w = 5;
  for (const TensorView& t : file.tensors()) {
    name_w = std::max(name_w, t.name.size());
    shape_w = std::max(shape_w, ShapeString(t.shape).size());
  }
  out << "\n" << title << ": " << file.tensors().size() << " tensors\n";
  out << "  " << Pad("name", name_w) << "  " << Pad("dtype", 7) << Pad("shape", shape_w)
      << "  " << "        mean          std       absmax  nonfinite\n";
  int64_t elements = 0;
  uint64_t bytes = 0;
  for (const TensorView& t : file.tensors()) {
    elements += NumElements(t.shape);
    bytes += t.nbytes;
    out << "  " << Pad(t.name, name_w) << "  " << Pad(t.dtype, 7)
        << Pad(ShapeString(t.shape), shape_w);
    const TensorStats st = ComputeStats(t);
    if (st.has) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "  %12.5g %12.5g %12.5g  %9lld", st.mean, st.std,
                    st.absmax, static_cast<long long>(st.nonfinite));
      out << buf;
    } else if (NumElements(t.shape) == 1 && (t.dtype == "I64" || t.dtype == "I32")) {
      int64_t v = 0;
      if (t.dtype == "I64") {
        std::memcpy(&v, t.data, 8);
      } else {
        int32_t v32;
        std::memcpy(&v32, t.data, 4);
        v = v32;
      }
      out << "  value " << v;  // e.g. the optimizer's step counter
    }
    out << "\n";
  }
  out << "  total: " << elements << " elements (" << Human(static_cast<double>(elements)) << "), "
      << bytes << " bytes\n";
}

}  // namespace

Status InspectCheckpoint(const std::string& path, std::ostream& out, Env* env) {
  ASSIGN_OR_RETURN(std::string dir, ResolveCheckpointDir(env, path));
  ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(env, dir));

  out << "checkpoint " << dir << "\n";
  std::vector<std::string> keys(std::begin(kManifestKeyOrder), std::end(kManifestKeyOrder));
  for (auto it = manifest.json.begin(); it != manifest.json.end(); ++it) {
    if (std::find(keys.begin(), keys.end(), it.key()) == keys.end()) keys.push_back(it.key());
  }
  for (const std::string& key : keys) {
    if (key == "files" || !manifest.json.contains(key)) continue;
    const nlohmann::json& v = manifest.json[key];
    const std::string value = v.is_string() ? v.get<std::string>() : v.dump();
    // The model config is shown whole; other entries (rng state...) clipped.
    out << "  " << Pad(key, 14) << "  " << (key == "model_config" ? value : Clip(value, 160))
        << "\n";
  }

  if (manifest.json.contains("model_config"))
    if (auto m = ModelConfig::FromJson(manifest.json["model_config"]); m.ok()) {
      // The KV cache a session or the serving pool holds per token (fp32), beside GQA's at equal width for MLA.
      out << "  " << Pad("kv_cache", 14) << "  " << KvBytesPerToken(*m) << " bytes per token (fp32, "
          << m->n_layers << " layers)";
      if (m->mla()) out << "; GQA at equal width " << KvBytesPerToken(GqaAtEqualWidth(*m)) << " bytes";
      out << "\n";
    }

  out << "\nfiles\n";
  size_t name_w = 4;
  for (const ManifestFile& f : manifest.files) name_w = std::max(name_w, f.name.size());
  int failures = 0;
  for (const ManifestFile& f : manifest.files) {
    Status s = VerifyManifestFile(env, dir, f, /*verify_checksum=*/true, nullptr);
    char size[32];
    std::snprintf(size, sizeof size, "%14llu", static_cast<unsigned long long>(f.size));
    out << "  " << Pad(f.name, name_w) << "  " << size << " bytes  xxh64 " << f.xxhash64 << "  "
        << (s.ok() ? "ok" : "FAILED") << "\n";
    if (!s.ok()) {
      ++failures;
      out << "    " << s.message() << "\n";
    }
  }
  if (manifest.Find(kCheckpointModelFile) == nullptr) {
    ++failures;
    out << "  (manifest lists no " << kCheckpointModelFile << ")\n";
  }

  for (const char* name : {kCheckpointModelFile, kCheckpointOptimizerFile}) {
    const std::string file_path = JoinPath(dir, name);
    if (manifest.Find(name) == nullptr || !env->FileExists(file_path)) continue;
    auto file = SafetensorsFile::Open(file_path);
    if (!file.ok()) {
      ++failures;
      out << "\n" << name << ": cannot parse: " << file.status().message() << "\n";
      continue;
    }
    PrintTensorTable(*file, name, out);
    if (std::string(name) == kCheckpointModelFile) {
      int64_t params = 0;
      for (const TensorView& t : file->tensors()) params += NumElements(t.shape);
      out << "parameters (incl. buffers): " << params << " ("
          << Human(static_cast<double>(params)) << ")\n";
    }
  }
  if (failures > 0) {
    return Status::Error(dir + ": " + std::to_string(failures) +
                         " problem(s) found, see the report above (hint: " +
                         EarlierCheckpointHint(env, dir) + ")");
  }
  return Status::Ok();
}

}  // namespace myriad

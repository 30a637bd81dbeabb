#include "train/checkpoint/manifest.h"

#include <cctype>

#include "core/checksum.h"
#include "train/checkpoint/checkpoint.h"

namespace myriad {
namespace {

bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == std::string::npos && name.find('\0') == std::string::npos;
}

bool IsHex16(const std::string& s) {
  if (s.size() != 16) return false;
  for (char c : s) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

std::string ParentDir(const std::string& dir) {
  const std::string d = StripTrailingSlashes(dir);
  const size_t slash = d.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return d.substr(0, slash);
}

std::string BaseName(const std::string& dir) {
  const std::string d = StripTrailingSlashes(dir);
  const size_t slash = d.rfind('/');
  return slash == std::string::npos ? d : d.substr(slash + 1);
}

}  // namespace

const ManifestFile* Manifest::Find(const std::string& name) const {
  for (const ManifestFile& f : files) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

std::string StripTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

nlohmann::ordered_json BuildManifest(const nlohmann::json& meta, int64_t step,
                                    const std::vector<ManifestFile>& files) {
  nlohmann::json m = meta.is_object() ? meta : nlohmann::json::object();
  m["format_version"] = kCheckpointFormatVersion;
  m["step"] = step;
  nlohmann::json list = nlohmann::json::array();
  for (const ManifestFile& f : files) {
    list.push_back({{"name", f.name}, {"size", f.size}, {"xxhash64", f.xxhash64}});
  }
  m["files"] = std::move(list);
  m.erase("manifest_xxhash64");
  m["manifest_xxhash64"] = ManifestChecksum(m);
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const char* key : kManifestKeyOrder) {
    if (m.contains(key)) out[key] = nlohmann::ordered_json(m[key]);
  }
  for (auto it = m.begin(); it != m.end(); ++it) {
    if (!out.contains(it.key())) out[it.key()] = nlohmann::ordered_json(*it);
  }
  return out;
}

std::string ManifestChecksum(const nlohmann::json& manifest) {
  nlohmann::json rest = manifest;
  if (rest.is_object()) rest.erase("manifest_xxhash64");
  return ChecksumHex(Checksum64(rest.dump()));
}

std::string EarlierCheckpointHint(Env* env, const std::string& dir) {
  const std::string parent = ParentDir(dir);
  const int64_t step = ParseCheckpointDirName(BaseName(dir));
  auto all = ListCheckpoints(env, parent);
  if (all.ok()) {
    for (auto it = all->rbegin(); it != all->rend(); ++it) {
      const int64_t s = ParseCheckpointDirName(BaseName(*it));
      if (step < 0 ? BaseName(*it) != BaseName(dir) : s < step) {
        return "use an earlier checkpoint: " + *it;
      }
    }
  }
  return "no earlier checkpoint in " + parent + "; restore this one from a backup";
}

Result<Manifest> ReadManifest(Env* env, const std::string& dir) {
  const std::string path = JoinPath(dir, kCheckpointManifest);
  if (!env->FileExists(path)) {
    return Status::Error(path + ": missing (hint: the checkpoint is incomplete or damaged; " +
                         EarlierCheckpointHint(env, dir) + ")");
  }
  ASSIGN_OR_RETURN(std::string text, env->ReadFile(path));
  Manifest m;
  m.json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const auto damaged = [&] {
    return " (hint: the manifest is damaged; " + EarlierCheckpointHint(env, dir) + ")";
  };
  if (m.json.is_discarded() || !m.json.is_object()) {
    return Status::Error(path + ": not a valid JSON object" + damaged());
  }
  auto version = m.json.find("format_version");
  if (version == m.json.end() || !version->is_number_integer()) {
    return Status::Error(path + ": has no integer format_version" + damaged());
  }
  if (version->get<int64_t>() != kCheckpointFormatVersion) {
    return Status::Error(path + ": format_version " + version->dump() +
                         " is not supported; this build reads version " +
                         std::to_string(kCheckpointFormatVersion) +
                         (version->get<int64_t>() == 1
                              ? " (hint: version 1 manifests carry no checksum of their own; resave the "
                                "checkpoint with the Myriad version that wrote it, or start over with --fresh)"
                              : " (hint: use the Myriad version that wrote the checkpoint)"));
  }
  auto own = m.json.find("manifest_xxhash64");
  if (own == m.json.end() || !own->is_string()) {
    return Status::Error(path + ": has no manifest_xxhash64 (the manifest's own checksum)" + damaged());
  }
  {
    std::string expected = own->get<std::string>();
    for (char& c : expected) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const std::string got = ManifestChecksum(m.json);
    if (got != expected) {
      return Status::Error(path + ": checksum mismatch (manifest_xxhash64 " + expected + ", the manifest hashes to " +
                           got + "): it was changed after it was written" + damaged());
    }
  }
  auto step = m.json.find("step");
  if (step == m.json.end() || !step->is_number_integer() || step->get<int64_t>() < 0) {
    return Status::Error(path + ": has no non-negative integer step" + damaged());
  }
  m.step = step->get<int64_t>();
  if (const int64_t named = ParseCheckpointDirName(BaseName(dir)); named >= 0 && named != m.step) {
    return Status::Error(path + ": says step " + std::to_string(m.step) + " but its directory is step " +
                         std::to_string(named) + damaged());
  }
  auto files = m.json.find("files");
  if (files == m.json.end() || !files->is_array()) {
    return Status::Error(path + ": has no files list" + damaged());
  }
  for (size_t i = 0; i < files->size(); ++i) {
    const nlohmann::json& f = (*files)[i];
    const std::string where = path + ": files[" + std::to_string(i) + "]";
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() ||
        !f.contains("size") || !f["size"].is_number_unsigned() || !f.contains("xxhash64") ||
        !f["xxhash64"].is_string()) {
      return Status::Error(where + " needs a string name, an unsigned size and a string "
                                   "xxhash64" + damaged());
    }
    ManifestFile mf{f["name"].get<std::string>(), f["size"].get<uint64_t>(),
                    f["xxhash64"].get<std::string>()};
    if (!IsPlainFileName(mf.name)) {
      return Status::Error(where + ": name \"" + mf.name +
                           "\" is not a plain file name inside the checkpoint" + damaged());
    }
    if (!IsHex16(mf.xxhash64)) {
      return Status::Error(where + ": xxhash64 \"" + mf.xxhash64 +
                           "\" is not 16 hex digits" + damaged());
    }
    if (m.Find(mf.name) != nullptr) {
      return Status::Error(where + ": " + mf.name + " is listed twice" + damaged());
    }
    m.files.push_back(std::move(mf));
  }
  return m;
}

Status VerifyManifestFile(Env* env, const std::string& dir, const ManifestFile& file,
                          bool verify_checksum, MappedFile* mapped) {
  const std::string path = JoinPath(dir, file.name);
  if (!env->FileExists(path)) {
    return Status::Error(path + ": listed in " + kCheckpointManifest + " but missing (hint: " +
                         EarlierCheckpointHint(env, dir) + ")");
  }
  ASSIGN_OR_RETURN(MappedFile m, MappedFile::Open(path));
  if (m.size() != file.size) {
    const char* what = m.size() < file.size ? "the file is truncated" : "the file has extra bytes";
    return Status::Error(path + ": size is " + std::to_string(m.size()) + " bytes but " +
                         kCheckpointManifest + " says " + std::to_string(file.size) + " — " +
                         what + " (hint: " + EarlierCheckpointHint(env, dir) + ")");
  }
  if (verify_checksum) {
    const std::string got = ChecksumHex(Checksum64(m.data(), m.size()));
    std::string expected = file.xxhash64;
    for (char& c : expected) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (got != expected) {
      return Status::Error(path + ": checksum mismatch (expected " + expected + ", got " + got +
                           ") — the file is corrupt (hint: " + EarlierCheckpointHint(env, dir) +
                           ")");
    }
  }
  if (mapped != nullptr) *mapped = std::move(m);
  return Status::Ok();
}

}  // namespace myriad

#include "train/checkpoint/checkpoint.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <utility>

#include "core/checksum.h"
#include "core/log.h"
#include "train/checkpoint/manifest.h"

namespace myriad {
namespace {

constexpr const char* kTmpSuffix = ".tmp";
// A checkpoint being deleted (pruned or replaced) is first renamed to this, so
// a crash mid-delete never leaves a half-deleted directory that looks complete.
constexpr const char* kDeletingSuffix = ".deleting";

std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Removes what interrupted saves and deletions left behind: step_*.tmp and
// step_*.deleting. Best effort: failures are logged.
void RemoveLeftovers(Env* env, const std::string& root) {
  auto names = env->ListDir(root);
  if (!names.ok()) return;
  for (const std::string& name : *names) {
    for (const char* suffix : {kTmpSuffix, kDeletingSuffix}) {
      if (!EndsWith(name, suffix)) continue;
      const std::string stem = name.substr(0, name.size() - std::string(suffix).size());
      if (ParseCheckpointDirName(stem) < 0) continue;
      Status s = env->RemoveAll(JoinPath(root, name));
      if (!s.ok()) LOG_WARN("checkpoint: cannot remove leftover %s", s.message().c_str());
    }
  }
}

// Deletes a complete checkpoint: rename aside, then remove. Best effort.
void DeleteCheckpoint(Env* env, const std::string& dir) {
  const std::string aside = dir + kDeletingSuffix;
  Status s = env->RenameFile(dir, aside);
  if (s.ok()) s = env->RemoveAll(aside);
  if (!s.ok()) LOG_WARN("checkpoint: cannot delete old checkpoint: %s", s.message().c_str());
}

// Keeps the keep_last highest steps, always including `keep`.
void Prune(Env* env, const std::string& root, const std::string& keep, int keep_last) {
  if (keep_last <= 0) return;
  auto all = ListCheckpoints(env, root);
  if (!all.ok()) {
    LOG_WARN("checkpoint: not pruning: %s", all.status().message().c_str());
    return;
  }
  std::vector<std::string> others;
  for (const std::string& d : *all) {
    if (d != keep) others.push_back(d);
  }
  // `others` is ascending by step; the newest keep_last - 1 stay.
  const size_t stay = static_cast<size_t>(keep_last - 1);
  for (size_t i = 0; i + stay < others.size(); ++i) DeleteCheckpoint(env, others[i]);
}

// Writes the step directory's contents into `tmp` and fsyncs it.
Status WriteStepDir(Env* env, const std::string& tmp, int64_t step, const CheckpointData& data) {
  RETURN_IF_ERROR(env->CreateDirs(tmp));
  std::vector<ManifestFile> files;
  auto write = [&](const char* name, const std::vector<TensorView>& tensors,
                   std::map<std::string, std::string> metadata) -> Status {
    WrittenFileInfo info;
    RETURN_IF_ERROR(WriteSafetensors(env, JoinPath(tmp, name), tensors, metadata, &info));
    files.push_back({name, info.size, ChecksumHex(info.checksum)});
    return Status::Ok();
  };
  const std::string step_str = std::to_string(step);
  // "format": "pt" lets Hugging Face loaders accept model.safetensors as is.
  RETURN_IF_ERROR(write(kCheckpointModelFile, data.model,
                        {{"format", "pt"}, {"myriad.step", step_str}}));
  if (!data.optimizer.empty()) {
    RETURN_IF_ERROR(write(kCheckpointOptimizerFile, data.optimizer, {{"myriad.step", step_str}}));
  }
  // The manifest goes last: a directory with a manifest has all its files.
  const nlohmann::ordered_json manifest = BuildManifest(data.meta, step, files);
  RETURN_IF_ERROR(WriteFileAtomic(env, JoinPath(tmp, kCheckpointManifest), manifest.dump(2) + "\n"));
  return env->SyncDir(tmp);
}

}  // namespace

CheckpointData CheckpointDataOf(const LoadedCheckpoint& ck) {
  CheckpointData d;
  d.meta = ck.manifest;
  for (const char* key : {"format_version", "step", "files", "manifest_xxhash64"}) d.meta.erase(key);
  d.model = ck.model.tensors();
  if (ck.optimizer) d.optimizer = ck.optimizer->tensors();
  return d;
}

std::string CheckpointDirName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

int64_t ParseCheckpointDirName(std::string_view name) {
  constexpr std::string_view kPrefix = "step_";
  if (name.size() <= kPrefix.size() || name.substr(0, kPrefix.size()) != kPrefix) return -1;
  const std::string_view digits = name.substr(kPrefix.size());
  if (digits.size() > 18) return -1;  // would not fit int64
  int64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

Result<std::vector<std::string>> ListCheckpoints(Env* env, const std::string& root_in) {
  const std::string root = StripTrailingSlashes(root_in);
  std::vector<std::pair<int64_t, std::string>> found;
  if (!env->FileExists(root)) return std::vector<std::string>{};
  ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(root));
  for (const std::string& name : names) {
    const int64_t step = ParseCheckpointDirName(name);
    if (step < 0) continue;
    const std::string dir = JoinPath(root, name);
    if (env->FileExists(JoinPath(dir, kCheckpointManifest))) found.emplace_back(step, dir);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  out.reserve(found.size());
  for (auto& [step, dir] : found) out.push_back(std::move(dir));
  return out;
}

Result<std::string> SaveCheckpoint(Env* env, const std::string& root_in, int64_t step,
                                   const CheckpointData& data, int keep_last) {
  const std::string root = StripTrailingSlashes(root_in);
  if (step < 0) {
    return Status::Error(root + ": cannot save a checkpoint for negative step " +
                         std::to_string(step) + " (hint: steps count from 0)");
  }
  if (keep_last < 0) {
    return Status::Error(root + ": keep_last=" + std::to_string(keep_last) +
                         " is negative (hint: 0 keeps every checkpoint)");
  }
  if (!data.meta.is_null() && !data.meta.is_object()) {
    return Status::Error(root + ": checkpoint meta must be a JSON object, got " +
                         std::string(data.meta.type_name()) + " (hint: a bug in the caller)");
  }
  const std::string name = CheckpointDirName(step);
  const std::string final_dir = JoinPath(root, name);
  const std::string tmp = final_dir + kTmpSuffix;
  auto failed = [&](const Status& s) {
    Status cleanup = env->RemoveAll(tmp);
    if (!cleanup.ok()) LOG_WARN("checkpoint: cannot remove %s", cleanup.message().c_str());
    // Free space is the hint only when the disk is full.
    const bool full = s.message().find("No space left on device") != std::string::npos;
    return Status::Error(root + ": saving step " + std::to_string(step) + " failed: " + s.message() +
                         " (hint: " + (full ? "free space under " : "check the file system and permissions under ") +
                         root + "; the previous checkpoint and 'latest' are untouched)");
  };

  Status s = env->CreateDirs(root);
  if (!s.ok()) return Status::Error(s.message() + " (hint: check the path and its permissions)");
  RemoveLeftovers(env, root);
  s = WriteStepDir(env, tmp, step, data);
  if (!s.ok()) return failed(s);

  // Re-saving an existing step: move the old one aside (rename cannot replace
  // a non-empty directory), put the new one in place, then delete the old.
  const bool replacing = env->FileExists(final_dir);
  const std::string aside = final_dir + kDeletingSuffix;
  if (replacing) {
    s = env->RenameFile(final_dir, aside);
    if (!s.ok()) return failed(s);
  }
  s = env->RenameFile(tmp, final_dir);
  if (!s.ok()) {
    if (replacing) (void)env->RenameFile(aside, final_dir);
    return failed(s);
  }
  // From here the new checkpoint is complete; errors say so.
  auto after_rename = [&](const Status& e) {
    return Status::Error(root + ": step " + std::to_string(step) + " was saved as " + final_dir +
                         " but " + e.message() +
                         " (hint: 'latest' may still name the previous checkpoint; load " +
                         final_dir + " explicitly or fix the file system and save again)");
  };
  s = env->SyncDir(root);
  if (!s.ok()) return after_rename(s);
  const std::string latest = JoinPath(root, kCheckpointLatest);
  s = WriteFileAtomic(env, latest, name + "\n");
  if (!s.ok()) {
    (void)env->RemoveAll(latest + kTmpSuffix);  // WriteFileAtomic's temp file, if left
    return after_rename(s);
  }

  if (replacing) {
    Status r = env->RemoveAll(aside);
    if (!r.ok()) LOG_WARN("checkpoint: cannot remove %s", r.message().c_str());
  }
  Prune(env, root, final_dir, keep_last);
  return final_dir;
}

Result<std::string> ResolveCheckpointDir(Env* env, const std::string& path_in) {
  const std::string path = StripTrailingSlashes(path_in);
  const std::string not_found_hint =
      " (hint: pass a checkpoint root holding step_NNNNNNNN/ directories and a 'latest' file, "
      "or one step directory)";
  if (path.empty() || !env->FileExists(path)) {
    return Status::Error(path + ": no checkpoint found" + not_found_hint);
  }
  const std::string base = BaseName(path);
  if (EndsWith(base, kTmpSuffix) || EndsWith(base, kDeletingSuffix)) {
    return Status::Error(path + ": an incomplete checkpoint (an interrupted save or deletion) "
                                "(hint: load the checkpoint root or a step_NNNNNNNN directory)");
  }
  if (env->FileExists(JoinPath(path, kCheckpointManifest))) return path;
  // A step directory without its manifest: ReadManifest reports it.
  if (ParseCheckpointDirName(base) >= 0) return path;

  const std::string latest_path = JoinPath(path, kCheckpointLatest);
  if (env->FileExists(latest_path)) {
    ASSIGN_OR_RETURN(std::string text, env->ReadFile(latest_path));
    const std::string name = Trim(text);
    auto all = ListCheckpoints(env, path);
    const std::string newest =
        all.ok() && !all->empty() ? "the newest complete one is " + all->back()
                                  : "there is no complete checkpoint in " + path;
    if (ParseCheckpointDirName(name) < 0) {
      return Status::Error(latest_path + ": holds \"" + name.substr(0, 64) +
                           "\", not a checkpoint directory name (hint: " + newest +
                           "; pass it explicitly or write its name into latest)");
    }
    const std::string dir = JoinPath(path, name);
    if (!env->FileExists(dir)) {
      return Status::Error(latest_path + ": points to " + name + ", which does not exist (hint: " +
                           newest + "; pass it explicitly or write its name into latest)");
    }
    return dir;
  }
  auto all = ListCheckpoints(env, path);
  if (all.ok() && !all->empty()) {
    LOG_WARN("checkpoint: %s has no 'latest' file; using the highest step, %s", path.c_str(),
             all->back().c_str());
    return all->back();
  }
  return Status::Error(path + ": no checkpoint found" + not_found_hint);
}

Result<LoadedCheckpoint> LoadCheckpoint(Env* env, const std::string& path,
                                        bool verify_checksums) {
  ASSIGN_OR_RETURN(std::string dir, ResolveCheckpointDir(env, path));
  ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(env, dir));
  if (manifest.Find(kCheckpointModelFile) == nullptr) {
    return Status::Error(JoinPath(dir, kCheckpointManifest) + ": lists no " +
                         kCheckpointModelFile + " (hint: " + EarlierCheckpointHint(env, dir) + ")");
  }
  std::optional<SafetensorsFile> model, optimizer;
  for (const ManifestFile& f : manifest.files) {
    const bool is_model = f.name == kCheckpointModelFile;
    const bool is_optimizer = f.name == kCheckpointOptimizerFile;
    MappedFile mapped;
    // Every listed file is verified, even ones this loader does not parse.
    RETURN_IF_ERROR(VerifyManifestFile(env, dir, f, verify_checksums,
                                       is_model || is_optimizer ? &mapped : nullptr));
    if (!is_model && !is_optimizer) continue;
    auto parsed = SafetensorsFile::FromMapped(std::move(mapped));
    if (!parsed.ok()) {
      return Status::Error(parsed.status().message() + " (in checkpoint " + dir +
                           "; hint: " + EarlierCheckpointHint(env, dir) + ")");
    }
    (is_model ? model : optimizer) = std::move(parsed).value();
  }
  return LoadedCheckpoint{dir, manifest.step, std::move(manifest.json), std::move(*model),
                          std::move(optimizer)};
}

namespace {

// `message` without a trailing " (hint: ...)": the fallback is the remedy
// such hints suggest, so repeating them would only mislead.
std::string WithoutHint(const std::string& message) {
  const size_t hint = message.rfind(" (hint: ");
  if (hint == std::string::npos || message.empty() || message.back() != ')') return message;
  return message.substr(0, hint);
}

}  // namespace

Result<LoadedCheckpoint> LoadNewestValidCheckpoint(Env* env, const std::string& root_in,
                                                   std::vector<std::string>* skipped) {
  const std::string root = StripTrailingSlashes(root_in);
  // A step directory: the caller chose that one.
  if (!root.empty() && (env->FileExists(JoinPath(root, kCheckpointManifest)) ||
                        ParseCheckpointDirName(BaseName(root)) >= 0)) {
    return LoadCheckpoint(env, root);
  }
  std::vector<std::string> skips;
  auto skip = [&](const std::string& what, const std::string& reason) {
    std::string entry = what + ": " + reason;
    LOG_WARN("checkpoint: skipping %s", entry.c_str());
    if (skipped) skipped->push_back(entry);
    skips.push_back(std::move(entry));
  };

  std::vector<std::string> candidates;
  const std::string latest_path = JoinPath(root, kCheckpointLatest);
  if (!root.empty() && env->FileExists(latest_path)) {
    auto text = env->ReadFile(latest_path);
    if (!text.ok()) {
      skip(latest_path, WithoutHint(text.status().message()));
    } else {
      const std::string name = Trim(*text);
      const std::string dir = JoinPath(root, name);
      if (ParseCheckpointDirName(name) < 0) {
        skip(latest_path, "holds \"" + name.substr(0, 64) + "\", not a checkpoint directory name");
      } else if (!env->FileExists(dir)) {
        skip(dir, "named by " + latest_path + " but does not exist");
      } else {
        candidates.push_back(dir);
      }
    }
  }
  if (!root.empty() && env->FileExists(root)) {
    ASSIGN_OR_RETURN(std::vector<std::string> all, ListCheckpoints(env, root));
    const std::string from_latest = candidates.empty() ? std::string() : candidates.front();
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      if (*it != from_latest) candidates.push_back(*it);
    }
  }
  if (candidates.empty() && skips.empty()) return LoadCheckpoint(env, root);  // its "not found"

  for (const std::string& dir : candidates) {
    auto loaded = LoadCheckpoint(env, dir);
    if (loaded.ok()) {
      if (!skips.empty()) {
        LOG_WARN("checkpoint: loaded %s after skipping %zu newer or named one(s)", dir.c_str(),
                 skips.size());
      }
      return loaded;
    }
    skip(dir, WithoutHint(loaded.status().message()));
  }
  std::string list;
  for (const std::string& s : skips) list += (list.empty() ? "" : "; ") + s;
  return Status::Error(root + ": no checkpoint loads; skipped " + std::to_string(skips.size()) +
                       ": " + list +
                       " (hint: restore a checkpoint from a backup, or start afresh in another "
                       "directory; nothing under " + root + " was changed)");
}

}  // namespace myriad

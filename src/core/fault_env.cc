#include "core/fault_env.h"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <utility>

namespace myriad {
namespace {

constexpr const char* kSpecHint =
    "(hint: faults are \"kind:key=value,...\" separated by ';', e.g. "
    "\"enospc:bytes=1000000,path=step_\", \"append:n=3\", \"rename:suffix=latest\", "
    "\"syncdir:suffix=.tmp\")";

std::string Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

std::vector<std::string> Split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t pos = s.find(sep, start);
    out.push_back(Trim(s.substr(start, pos == std::string_view::npos ? s.npos : pos - start)));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

// A non-negative decimal integer that fits int64, or -1.
int64_t ParseCount(const std::string& s) {
  if (s.empty() || s.size() > 18) return -1;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

bool Contains(const std::string& s, const std::string& part) {
  return part.empty() || s.find(part) != std::string::npos;
}

}  // namespace

// Forwards to the wrapped file, asking the FaultEnv before every Append.
class FaultEnv::File : public WritableFile {
 public:
  File(FaultEnv* env, std::string path, std::unique_ptr<WritableFile> f)
      : env_(env), path_(std::move(path)), f_(std::move(f)) {}
  Status Append(std::string_view data) override {
    size_t pass = 0;
    bool die = false;
    Status injected = env_->BeforeAppend(path_, data.size(), &pass, &die);
    Status s = pass > 0 ? f_->Append(data.substr(0, pass)) : Status::Ok();
    if (die) {
      std::fprintf(stderr, "[fault] crash while writing %s (injected fault)\n", path_.c_str());
      std::fflush(stderr);
      raise(SIGKILL);
    }
    if (!injected.ok()) return injected;
    return s;
  }
  Status Sync() override { return f_->Sync(); }
  Status Close() override { return f_->Close(); }

 private:
  FaultEnv* env_;
  std::string path_;
  std::unique_ptr<WritableFile> f_;
};

FaultEnv::FaultEnv(Env* base) : base_(base ? base : Env::Default()) {}

void FaultEnv::SetEnospcAfterBytes(int64_t bytes, std::string path_substring) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.enospc_bytes = bytes < 0 ? -1 : bytes;
  faults_.enospc_path = bytes < 0 ? std::string() : std::move(path_substring);
  enospc_used_ = 0;
}

void FaultEnv::SetCrashAfterBytes(int64_t bytes, std::string path_substring) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.crash_bytes = bytes < 0 ? -1 : bytes;
  faults_.crash_path = bytes < 0 ? std::string() : std::move(path_substring);
  crash_used_ = 0;
}

void FaultEnv::SetFailAppend(int64_t n, std::string path_substring) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.append_n = n <= 0 ? 0 : n;
  faults_.append_path = n <= 0 ? std::string() : std::move(path_substring);
  append_seen_ = 0;
}

void FaultEnv::SetFailRename(std::string target_suffix) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.rename_suffix = std::move(target_suffix);
}

void FaultEnv::SetFailSyncDir(std::string dir_suffix) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.syncdir_suffix = std::move(dir_suffix);
}

Status FaultEnv::Arm(const std::string& spec) {
  auto bad = [&](const std::string& what) {
    return Status::Error("fault spec \"" + spec + "\": " + what + " " + kSpecHint);
  };
  if (Trim(spec).empty()) return bad("is empty");

  // Parsed first, applied only if the whole spec is valid.
  struct Parsed {
    std::string kind;
    std::map<std::string, std::string> kv;
  };
  std::vector<Parsed> parsed;
  for (const std::string& fault : Split(spec, ';')) {
    if (fault.empty()) return bad("has an empty fault (a stray ';')");
    const size_t colon = fault.find(':');
    Parsed p;
    p.kind = Trim(fault.substr(0, colon));
    static const std::map<std::string, std::vector<std::string>> kKeys = {
        {"enospc", {"bytes", "path"}},
        {"append", {"n", "path"}},
        {"rename", {"suffix"}},
        {"syncdir", {"suffix"}},
        {"crash", {"bytes", "path"}},
    };
    auto keys = kKeys.find(p.kind);
    if (keys == kKeys.end()) {
      return bad("unknown fault kind \"" + p.kind +
                 "\" (expected enospc, append, rename, syncdir or crash)");
    }
    for (const Parsed& q : parsed) {
      if (q.kind == p.kind) return bad(p.kind + " is given twice");
    }
    const std::string expected = [&] {
      std::string e;
      for (const std::string& k : keys->second) e += (e.empty() ? "" : ", ") + k;
      return e;
    }();
    if (colon != std::string::npos) {
      for (const std::string& item : Split(std::string_view(fault).substr(colon + 1), ',')) {
        const size_t eq = item.find('=');
        if (item.empty() || eq == std::string::npos) {
          return bad("\"" + item + "\" in " + p.kind + " is not key=value (expected keys: " +
                     expected + ")");
        }
        const std::string key = Trim(item.substr(0, eq));
        const std::string value = Trim(item.substr(eq + 1));
        bool known = false;
        for (const std::string& k : keys->second) known = known || k == key;
        if (!known) {
          return bad("unknown key \"" + key + "\" for " + p.kind + " (expected " + expected + ")");
        }
        if (p.kv.count(key)) return bad("key \"" + key + "\" is given twice for " + p.kind);
        p.kv[key] = value;
      }
    }
    const std::string& required = keys->second.front();
    if (!p.kv.count(required)) {
      return bad(p.kind + " needs " + required + "=" + (p.kind == "enospc" || p.kind == "crash" ? "BYTES" : p.kind == "append" ? "N" : "SUFFIX"));
    }
    if (p.kind == "enospc" && ParseCount(p.kv["bytes"]) < 0) {
      return bad("enospc bytes=\"" + p.kv["bytes"] + "\" is not a non-negative integer");
    }
    if (p.kind == "crash" && ParseCount(p.kv["bytes"]) < 0) {
      return bad("crash bytes=\"" + p.kv["bytes"] + "\" is not a non-negative integer");
    }
    if (p.kind == "append" && ParseCount(p.kv["n"]) < 1) {
      return bad("append n=\"" + p.kv["n"] + "\" is not a positive integer (the first Append is n=1)");
    }
    if ((p.kind == "rename" || p.kind == "syncdir") && p.kv["suffix"].empty()) {
      return bad(p.kind + " suffix is empty (it would match every path)");
    }
    parsed.push_back(std::move(p));
  }
  for (Parsed& p : parsed) {
    if (p.kind == "enospc") SetEnospcAfterBytes(ParseCount(p.kv["bytes"]), p.kv["path"]);
    if (p.kind == "append") SetFailAppend(ParseCount(p.kv["n"]), p.kv["path"]);
    if (p.kind == "rename") SetFailRename(p.kv["suffix"]);
    if (p.kind == "syncdir") SetFailSyncDir(p.kv["suffix"]);
    if (p.kind == "crash") SetCrashAfterBytes(ParseCount(p.kv["bytes"]), p.kv["path"]);
  }
  return Status::Ok();
}

void FaultEnv::Disarm() {
  std::lock_guard<std::mutex> lock(mu_);
  faults_ = Faults{};
  enospc_used_ = 0;
  crash_used_ = 0;
  append_seen_ = 0;
}

std::string FaultEnv::Armed() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> parts;
  auto with_path = [](std::string s, const std::string& path) {
    return path.empty() ? s : s + ",path=" + path;
  };
  if (faults_.enospc_bytes >= 0) {
    parts.push_back(with_path("enospc:bytes=" + std::to_string(faults_.enospc_bytes), faults_.enospc_path));
  }
  if (faults_.append_n > 0) {
    parts.push_back(with_path("append:n=" + std::to_string(faults_.append_n), faults_.append_path));
  }
  if (!faults_.rename_suffix.empty()) parts.push_back("rename:suffix=" + faults_.rename_suffix);
  if (!faults_.syncdir_suffix.empty()) parts.push_back("syncdir:suffix=" + faults_.syncdir_suffix);
  if (faults_.crash_bytes >= 0)
    parts.push_back(with_path("crash:bytes=" + std::to_string(faults_.crash_bytes), faults_.crash_path));
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : ";") + p;
  return out;
}

int64_t FaultEnv::faults_fired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fired_;
}

int64_t FaultEnv::appends() const {
  std::lock_guard<std::mutex> lock(mu_);
  return appends_;
}

int64_t FaultEnv::bytes_written() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

Status FaultEnv::BeforeAppend(const std::string& path, size_t size, size_t* pass, bool* die) {
  std::lock_guard<std::mutex> lock(mu_);
  ++appends_;
  *pass = size;
  *die = false;
  if (faults_.crash_bytes >= 0) {
    const int64_t n = static_cast<int64_t>(size);
    if (Contains(path, faults_.crash_path) && crash_used_ + n > faults_.crash_bytes) {
      ++fired_;
      *pass = static_cast<size_t>(std::max<int64_t>(0, faults_.crash_bytes - crash_used_));
      *die = true;
      return Status::Ok();
    }
    crash_used_ += n;
  }
  if (faults_.append_n > 0 && Contains(path, faults_.append_path) &&
      ++append_seen_ == faults_.append_n) {
    ++fired_;
    *pass = 0;
    return Status::Error(path + ": write failed: Input/output error (injected fault: append #" +
                         std::to_string(faults_.append_n) + ")");
  }
  const int64_t n = static_cast<int64_t>(size);
  if (faults_.enospc_bytes >= 0 && Contains(path, faults_.enospc_path) &&
      enospc_used_ + n > faults_.enospc_bytes) {
    const int64_t fits = std::max<int64_t>(0, faults_.enospc_bytes - enospc_used_);
    ++fired_;
    *pass = static_cast<size_t>(fits);
    enospc_used_ += fits;
    bytes_ += fits;
    return Status::Error(path + ": write failed: No space left on device (injected fault)");
  }
  if (faults_.enospc_bytes >= 0) enospc_used_ += n;
  bytes_ += n;
  return Status::Ok();
}

Result<std::unique_ptr<WritableFile>> FaultEnv::NewWritableFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, base_->NewWritableFile(path));
  return std::unique_ptr<WritableFile>(new File(this, path, std::move(f)));
}

Result<std::string> FaultEnv::ReadFile(const std::string& path) { return base_->ReadFile(path); }

Status FaultEnv::RenameFile(const std::string& from, const std::string& to) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!faults_.rename_suffix.empty() && to.ends_with(faults_.rename_suffix)) {
      ++fired_;
      return Status::Error(from + ": rename to " + to +
                           " failed: Input/output error (injected fault)");
    }
  }
  return base_->RenameFile(from, to);
}

Status FaultEnv::RemoveAll(const std::string& path) { return base_->RemoveAll(path); }

Status FaultEnv::CreateDirs(const std::string& path) { return base_->CreateDirs(path); }

Status FaultEnv::SyncDir(const std::string& path) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!faults_.syncdir_suffix.empty() && path.ends_with(faults_.syncdir_suffix)) {
      ++fired_;
      return Status::Error(path + ": fsync directory failed: Input/output error (injected fault)");
    }
  }
  return base_->SyncDir(path);
}

bool FaultEnv::FileExists(const std::string& path) { return base_->FileExists(path); }

Result<std::vector<std::string>> FaultEnv::ListDir(const std::string& path) {
  return base_->ListDir(path);
}

uint64_t FaultEnv::NowMicros() { return base_->NowMicros(); }

}  // namespace myriad

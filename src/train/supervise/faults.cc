#include "train/supervise/faults.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "core/log.h"
#include "train/supervise/heartbeat.h"

namespace myriad::supervise {
namespace {

bool ParseInt(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (*end != 0 || v < 0) return false;
  *out = v;
  return true;
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t i = s.find(sep, start);
    out.push_back(s.substr(start, i == std::string::npos ? std::string::npos : i - start));
    if (i == std::string::npos) return out;
    start = i + 1;
  }
}

[[noreturn]] void Die() {
  std::fflush(stderr);
  raise(SIGKILL);
  std::_Exit(137);
}

}  // namespace

const char* FaultKindName(FaultKind k) {
  switch (k) {
    case FaultKind::kKill: return "kill";
    case FaultKind::kHang: return "hang";
    case FaultKind::kNan: return "nan";
    case FaultKind::kTear: return "tear";
    case FaultKind::kCorrupt: return "corrupt";
    case FaultKind::kHealth: return "health";
    case FaultKind::kDiskFull: return "diskfull";
    case FaultKind::kSlow: return "slow";
    case FaultKind::kCrashSave: return "crashsave";
  }
  return "?";
}

std::string Fault::ToSpec() const {
  std::string s = std::string(FaultKindName(kind)) + ":id=" + std::to_string(id);
  if (kind == FaultKind::kHealth) return s + ",host=" + host + (once ? ",once=1" : "");
  if (kind == FaultKind::kSlow) return s + ",rank=" + std::to_string(rank) + ",ms=" + std::to_string(ms) + ",step=" + std::to_string(step);
  if (kind == FaultKind::kKill || kind == FaultKind::kHang || kind == FaultKind::kNan)
    s += ",rank=" + std::to_string(rank);
  return s + ",step=" + std::to_string(step);
}

std::string FaultsToSpec(const std::vector<Fault>& faults) {
  std::string s;
  for (const Fault& f : faults) s += (s.empty() ? "" : ";") + f.ToSpec();
  return s;
}

Result<std::vector<Fault>> ParseFaults(const std::string& spec) {
  std::vector<Fault> out;
  if (spec.empty()) return out;
  int index = 0;
  for (const std::string& item : Split(spec, ';')) {
    if (item.empty()) continue;
    const std::string where = "fault spec \"" + item + "\"";
    const size_t colon = item.find(':');
    const std::string kind = item.substr(0, colon);
    Fault f;
    f.id = index++;
    if (kind == "kill") f.kind = FaultKind::kKill;
    else if (kind == "hang") f.kind = FaultKind::kHang;
    else if (kind == "nan") f.kind = FaultKind::kNan;
    else if (kind == "tear") f.kind = FaultKind::kTear;
    else if (kind == "corrupt") f.kind = FaultKind::kCorrupt;
    else if (kind == "health") f.kind = FaultKind::kHealth;
    else if (kind == "diskfull") f.kind = FaultKind::kDiskFull;
    else if (kind == "slow") f.kind = FaultKind::kSlow;
    else if (kind == "crashsave") f.kind = FaultKind::kCrashSave;
    else
      return Status::Error(where + ": unknown kind \"" + kind +
                           "\" (hint: kill, hang, nan, tear, corrupt, health, diskfull, slow, crashsave)");
    bool has_step = false;
    if (colon != std::string::npos) {
      for (const std::string& kv : Split(item.substr(colon + 1), ',')) {
        const size_t eq = kv.find('=');
        if (eq == std::string::npos) return Status::Error(where + ": \"" + kv + "\" is not key=value");
        const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
        int64_t n = 0;
        if (k == "host") {
          if (v.empty()) return Status::Error(where + ": empty host");
          f.host = v;
        } else if (k == "once") {
          if (v != "0" && v != "1") return Status::Error(where + ": once=\"" + v + "\" must be 0 or 1");
          f.once = v == "1";
        } else if (k == "ms") {
          if (!ParseInt(v, &n) || n < 1) return Status::Error(where + ": ms=\"" + v + "\" must be a number >= 1");
          f.ms = n;
        } else if (k == "rank" || k == "step" || k == "id") {
          if (!ParseInt(v, &n)) return Status::Error(where + ": " + k + "=\"" + v + "\" is not a number >= 0");
          if (k == "rank") f.rank = static_cast<int>(n);
          else if (k == "step") { f.step = n; has_step = true; }
          else f.id = static_cast<int>(n);
        } else {
          return Status::Error(where + ": unknown key \"" + k + "\" (hint: rank, step, host, once, ms, id)");
        }
      }
    }
    if (f.kind == FaultKind::kHealth && f.host.empty())
      return Status::Error(where + ": health needs host=NAME");
    if (f.kind == FaultKind::kSlow) {
      if (f.ms < 1) return Status::Error(where + ": slow needs ms=N");
      if (!has_step) f.step = 1;
    } else if (f.kind != FaultKind::kHealth && (!has_step || f.step < 1))
      return Status::Error(where + ": needs step=S (S >= 1)");
    out.push_back(f);
  }
  return out;
}

Result<FaultInjector> FaultInjector::FromEnv(int rank, const std::string& host) {
  const char* spec = std::getenv("MYRIAD_FAULTS");
  if (spec == nullptr || *spec == 0) return FaultInjector({}, rank, host, "");
  ASSIGN_OR_RETURN(std::vector<Fault> faults, ParseFaults(spec));
  const char* dir = std::getenv("MYRIAD_FAULT_DIR");
  return FaultInjector(std::move(faults), rank, host, dir ? dir : "");
}

FaultInjector::FaultInjector(std::vector<Fault> faults, int rank, std::string host, std::string fired_dir)
    : faults_(std::move(faults)), rank_(rank), host_(std::move(host)), fired_dir_(std::move(fired_dir)) {}

void FaultInjector::MarkFired(const Fault& f) {
  LOG_WARN("fault injection: %s fires (rank %d, host %s)", f.ToSpec().c_str(), rank_, host_.c_str());
  Heartbeat::Global().Event("fault", {{"id", f.id}, {"fault", f.ToSpec()}});
  if (!fired_dir_.empty() && f.one_shot()) {
    std::error_code ec;
    std::filesystem::create_directories(fired_dir_, ec);
    const std::string p = fired_dir_ + "/fired_" + std::to_string(f.id);
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      (void)::fsync(fd);
      ::close(fd);
    }
  }
}

std::string FaultInjector::HealthFailure() {
  for (const Fault& f : faults_)
    if (f.kind == FaultKind::kHealth && f.host == host_) {
      MarkFired(f);
      return "injected fault (" + f.ToSpec() + ")";
    }
  return "";
}

void FaultInjector::SlowDown(int64_t step) {
  for (const Fault& f : faults_)
    if (f.kind == FaultKind::kSlow && f.rank == rank_ && step >= f.step) {
      if (step == f.step) MarkFired(f);
      std::this_thread::sleep_for(std::chrono::milliseconds(f.ms));
    }
}

bool FaultInjector::NanAt(int64_t step) {
  for (const Fault& f : faults_)
    if (f.kind == FaultKind::kNan && f.rank == rank_ && f.step == step) {
      MarkFired(f);
      return true;
    }
  return false;
}

void FaultInjector::AfterStep(int64_t step) {
  for (const Fault& f : faults_) {
    if (f.rank != rank_ || f.step != step) continue;
    if (f.kind == FaultKind::kKill) {
      MarkFired(f);
      Die();
    }
    if (f.kind == FaultKind::kHang) {
      MarkFired(f);
      Heartbeat::Global().SetPhase("hung (injected)");
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }
}

bool FaultInjector::FireAtCheckpoint(FaultKind kind, int64_t step) {
  if (rank_ != 0) return false;
  for (const Fault& f : faults_)
    if (f.kind == kind && f.step == step) {
      MarkFired(f);
      return true;
    }
  return false;
}

bool FaultInjector::DiskFullAt(int64_t step) { return FireAtCheckpoint(FaultKind::kDiskFull, step); }

bool FaultInjector::CrashInSaveAt(int64_t step) { return FireAtCheckpoint(FaultKind::kCrashSave, step); }

bool FaultInjector::DamageAt(int64_t step) const {
  if (rank_ != 0) return false;
  for (const Fault& f : faults_)
    if (f.step == step && (f.kind == FaultKind::kTear || f.kind == FaultKind::kCorrupt)) return true;
  return false;
}

void FaultInjector::AfterCheckpoint(int64_t step, const std::string& dir) {
  if (rank_ != 0) return;
  for (const Fault& f : faults_) {
    if (f.step != step || (f.kind != FaultKind::kTear && f.kind != FaultKind::kCorrupt)) continue;
    MarkFired(f);
    const std::string file = dir + "/model.safetensors";
    std::error_code ec;
    const auto size = std::filesystem::file_size(file, ec);
    if (!ec) {
      if (f.kind == FaultKind::kTear) {
        std::filesystem::resize_file(file, size / 2, ec);
      } else {
        const int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC);
        if (fd >= 0) {
          unsigned char b = 0;
          const off_t at = static_cast<off_t>(size / 2);
          if (::pread(fd, &b, 1, at) == 1) {
            b ^= 0x5a;
            (void)!::pwrite(fd, &b, 1, at);
          }
          (void)::fsync(fd);
          ::close(fd);
        }
      }
    }
    if (ec) LOG_WARN("fault injection: cannot damage %s: %s", file.c_str(), ec.message().c_str());
    Die();
  }
}

std::vector<int> FiredFaults(const std::string& dir, const std::vector<Fault>& faults, Env* env) {
  std::vector<int> out;
  for (const Fault& f : faults)
    if (f.one_shot() && env->FileExists(dir + "/fired_" + std::to_string(f.id))) out.push_back(f.id);
  return out;
}

}  // namespace myriad::supervise

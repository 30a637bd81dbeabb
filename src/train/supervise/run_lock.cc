#include "train/supervise/run_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "train/supervise/heartbeat.h"
#include "train/supervise/lifeline.h"

namespace myriad::supervise {
namespace {

struct Holder {
  int64_t pid = 0;
  std::string host, role;
  int64_t supervisor = 0;
  bool known() const { return pid > 0; }
  std::string Describe() const {
    if (!known()) return "a process that has not written its pid yet";
    return "myriad " + (role.empty() ? std::string("train") : role) + " pid " + std::to_string(pid) + " on host " +
           (host.empty() ? std::string("?") : host);
  }
};

Holder ReadHolder(int fd) {
  Holder h;
  char buf[1024];
  const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return h;
  const auto j = nlohmann::json::parse(std::string(buf, static_cast<size_t>(n)), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return h;
  // A damaged lock file reads as an unknown holder, never as an exception.
  const auto num = [&](const char* k) {
    const auto it = j.find(k);
    return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : int64_t{0};
  };
  const auto str = [&](const char* k) {
    const auto it = j.find(k);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  h.pid = num("pid");
  h.host = str("host");
  h.role = str("role");
  h.supervisor = num("supervisor");
  return h;
}

// A process of this machine that is gone.
bool GoneHere(int64_t pid, const std::string& host) {
  return pid > 0 && host == MachineName() && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

enum class Got { kLocked, kBusy };

// Opens and tries to lock `path` (creating it); *fd is open when locked.
Result<Got> TryLock(const std::string& path, int* fd, Holder* holder) {
  *fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (*fd < 0)
    return Status::Error(path + ": cannot open the run's lock file: " + std::strerror(errno) +
                         " (hint: permissions of the folder)");
  if (flock(*fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    *holder = ReadHolder(*fd);
    close(*fd);
    *fd = -1;
    if (err == EWOULDBLOCK) return Got::kBusy;
    return Status::Error(path + ": cannot lock: " + std::strerror(err) +
                         " (hint: a file system without flock; set train.out_dir to a local folder)");
  }
  *holder = ReadHolder(*fd);
  return Got::kLocked;
}

void Release(int fd) {
  if (fd < 0) return;
  (void)ftruncate(fd, 0);
  close(fd);
}

// A lock taken from a holder that is gone: said once, with who it was.
void ReportStale(const std::string& path, const Holder& old, int64_t supervisor_pid) {
  if (!old.known() || old.pid == getpid()) return;
  if (supervisor_pid > 0 && old.supervisor == supervisor_pid) {
    // The previous attempt of this launch (it crashed, was killed or hung).
    LOG_INFO("%s: taking over from pid %lld, an earlier attempt of this launch", path.c_str(),
             static_cast<long long>(old.pid));
    return;
  }
  LOG_WARN("%s: taking over a stale lock: %s is no longer running", path.c_str(), old.Describe().c_str());
}

Status Write(int fd, const std::string& path, const std::string& role, int64_t supervisor_pid) {
  const std::string text = nlohmann::json{{"pid", static_cast<int64_t>(getpid())},
                                          {"host", MachineName()},
                                          {"role", role},
                                          {"supervisor", supervisor_pid}}
                               .dump() +
                           "\n";
  if (ftruncate(fd, 0) != 0 || pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
    return Status::Error(path + ": cannot write the lock's holder: " + std::strerror(errno) +
                         " (hint: free space and permissions of the folder)");
  return Status::Ok();
}

std::string InUse(const std::string& dir, const std::string& path, const Holder& h) {
  std::string s = dir + " is in use: " + h.Describe() + " holds " + path;
  if (h.role == "train" && h.supervisor > 0)
    s += GoneHere(h.supervisor, h.host)
             ? " (left running by myriad launch pid " + std::to_string(h.supervisor) + ", which is gone)"
             : " (under myriad launch pid " + std::to_string(h.supervisor) + ")";
  return s + " (hint: stop it first, or set train.out_dir to another folder)";
}

// Takes `mine` in dir, then checks that `other` is not held by a live process
// (other than `allowed_pid`, whose lock is no obstacle).
Result<std::unique_ptr<RunLock>> Acquire(const std::string& dir, const char* mine, const char* other,
                                         const std::string& role, int64_t supervisor_pid, int64_t allowed_pid) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::Error(dir + ": cannot create the run directory: " + ec.message());
  const std::string path = dir + "/" + mine, other_path = dir + "/" + other;
  int fd = -1;
  Holder held;
  ASSIGN_OR_RETURN(Got got, TryLock(path, &fd, &held));
  if (got == Got::kBusy) return Status::Error(InUse(dir, path, held));
  std::unique_ptr<RunLock> lock(new RunLock(fd, path));
  // The other lock: held by someone else alive -> in use. Probing takes it
  // for a moment; a stale holder found there is reported and cleared.
  int ofd = -1;
  Holder oh;
  ASSIGN_OR_RETURN(Got ogot, TryLock(other_path, &ofd, &oh));
  if (ogot == Got::kBusy) {
    if (!(allowed_pid > 0 && oh.pid == allowed_pid)) return Status::Error(InUse(dir, other_path, oh));
  } else {
    ReportStale(other_path, oh, supervisor_pid);
    Release(ofd);
  }
  ReportStale(path, held, supervisor_pid);
  RETURN_IF_ERROR(Write(fd, path, role, supervisor_pid));
  return lock;
}

}  // namespace

Result<std::unique_ptr<RunLock>> RunLock::ForLaunch(const std::string& dir) {
  return Acquire(dir, kLaunchLockFile, kTrainLockFile, "launch", 0, 0);
}

Result<std::unique_ptr<RunLock>> RunLock::ForTrain(const std::string& dir, int64_t supervisor_pid) {
  return Acquire(dir, kTrainLockFile, kLaunchLockFile, "train", supervisor_pid, supervisor_pid);
}

RunLock::~RunLock() { Release(fd_); }

Result<std::unique_ptr<RunLock>> LockRunDirForTraining(comm::Comm* world, const std::string& dir) {
  std::unique_ptr<RunLock> lock;
  Status st = Status::Ok();
  if (world->rank() == 0) {
    auto r = RunLock::ForTrain(dir, SupervisorPid());
    if (r.ok()) lock = std::move(r).value();
    else st = r.status();
  }
  if (world->size() > 1) {
    int32_t ok = st.ok();
    world->Broadcast(&ok, 1, comm::DType::kI32, 0);
    if (!ok && world->rank() != 0) return Status::Error("rank 0 could not lock " + dir + " (its error says why)");
  }
  if (!st.ok()) return st;
  return lock;
}

}  // namespace myriad::supervise

#include "core/env.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace myriad {
namespace {

Status ErrnoStatus(const std::string& what, const std::string& path, int err) {
  return Status::Error(path + ": " + what + " failed: " + std::strerror(err));
}

class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override { (void)Close(); }
  Status Append(std::string_view data) override {
    const char* p = data.data();
    size_t left = data.size();
    while (left > 0) {
      ssize_t n = ::write(fd_, p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus("write", path_, errno);
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
    return Status::Ok();
  }
  Status Sync() override {
    if (::fsync(fd_) != 0) return ErrnoStatus("fsync", path_, errno);
    return Status::Ok();
  }
  Status Close() override {
    if (fd_ < 0) return Status::Ok();
    int r = ::close(fd_);
    fd_ = -1;
    if (r != 0) return ErrnoStatus("close", path_, errno);
    return Status::Ok();
  }

 private:
  std::string path_;
  int fd_;
};

class PosixEnv : public Env {
 public:
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoStatus("open for writing", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }
  Result<std::string> ReadFile(const std::string& path) override {
    std::ifstream in(path, std::ios::binary);
    if (!in) return ErrnoStatus("open", path, errno ? errno : ENOENT);
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) return ErrnoStatus("read", path, errno);
    return ss.str();
  }
  Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoStatus("rename to " + to, from, errno);
    return Status::Ok();
  }
  Status RemoveAll(const std::string& path) override {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec) return Status::Error(path + ": remove failed: " + ec.message());
    return Status::Ok();
  }
  Status CreateDirs(const std::string& path) override {
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec) return Status::Error(path + ": cannot create directory: " + ec.message());
    return Status::Ok();
  }
  Status SyncDir(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus("open directory", path, errno);
    int r = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (r != 0) return ErrnoStatus("fsync directory", path, err);
    return Status::Ok();
  }
  bool FileExists(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
  }
  Result<std::vector<std::string>> ListDir(const std::string& path) override {
    std::error_code ec;
    std::vector<std::string> out;
    for (auto it = std::filesystem::directory_iterator(path, ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
      out.push_back(it->path().filename().string());
    }
    if (ec) return Status::Error(path + ": cannot list directory: " + ec.message());
    return out;
  }
  uint64_t NowMicros() override {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace

Env* Env::Default() {
  static PosixEnv env;
  return &env;
}

Status WriteFileAtomic(Env* env, const std::string& path, std::string_view data, bool sync) {
  const std::string tmp = path + ".tmp";
  {
    auto f = env->NewWritableFile(tmp);
    if (!f.ok()) return f.status();
    Status s = (*f)->Append(data);
    if (s.ok() && sync) s = (*f)->Sync();
    Status c = (*f)->Close();
    if (s.ok()) s = c;
    if (!s.ok()) {
      (void)env->RemoveAll(tmp);
      return s;
    }
  }
  RETURN_IF_ERROR(env->RenameFile(tmp, path));
  if (!sync) return Status::Ok();
  std::string dir = std::filesystem::path(path).parent_path().string();
  return env->SyncDir(dir.empty() ? "." : dir);
}

}  // namespace myriad

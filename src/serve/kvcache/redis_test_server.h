// For tests only: a real redis-server on 127.0.0.1 at a free port, in a temp
// directory, without persistence; started, waited for (PING), stopped or
// killed. Header-only so that no library carries test code.
#pragma once

#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace myriad::serve::testing {

inline std::string FindRedisServer() {
  for (const char* p : {"/usr/bin/redis-server", "/usr/local/bin/redis-server", "/usr/sbin/redis-server"})
    if (::access(p, X_OK) == 0) return p;
  return "";
}

// A port the kernel just handed out (bind to 0), free unless raced.
inline int FreeLocalPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  int port = -1;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

class RedisTestServer {
 public:
  ~RedisTestServer() { Stop(); }

  // Empty string on success, else why it could not start. `port` 0: a free one.
  std::string Start(int port = 0) {
    const std::string bin = FindRedisServer();
    if (bin.empty()) return "redis-server is not installed";
    if (dir_.empty())
      dir_ = std::filesystem::temp_directory_path() /
             ("myriad_redis_" + std::to_string(::getpid()) + "_" + std::to_string(++Counter()));
    std::filesystem::create_directories(dir_);
    for (int attempt = 0; attempt < 3; ++attempt) {
      port_ = port > 0 ? port : FreeLocalPort();
      std::vector<std::string> args = {bin, "--port", std::to_string(port_), "--bind", "127.0.0.1",
                                       "--save", "", "--appendonly", "no", "--dir", dir_.string(),
                                       "--daemonize", "no", "--loglevel", "warning",
                                       "--logfile", (dir_ / "redis.log").string()};
      std::vector<char*> argv;
      for (auto& s : args) argv.push_back(s.data());
      argv.push_back(nullptr);
      if (::posix_spawn(&pid_, bin.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
        pid_ = -1;
        return "posix_spawn " + bin + " failed";
      }
      if (WaitForPing(std::chrono::seconds(10))) return "";
      Kill();
    }
    return "redis-server did not answer PING (see " + (dir_ / "redis.log").string() + ")";
  }

  int port() const { return port_; }

  void Kill() { Signal(SIGKILL); }
  // SIGSTOP / SIGCONT: a hung server (connections accepted, never answered).
  void Freeze() {
    if (pid_ > 0) ::kill(pid_, SIGSTOP);
  }
  void Thaw() {
    if (pid_ > 0) ::kill(pid_, SIGCONT);
  }
  void Stop() {
    Signal(SIGTERM);
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
      dir_.clear();
    }
  }

 private:
  static int& Counter() {
    static int n = 0;
    return n;
  }
  void Signal(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    int status;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  bool WaitForPing(std::chrono::seconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {  // exited (port taken?)
        pid_ = -1;
        return false;
      }
      timeval tv{0, 200000};
      if (redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv)) {
        bool ok = false;
        if (!c->err) {
          if (auto* r = static_cast<redisReply*>(redisCommand(c, "PING"))) {
            ok = r->type == REDIS_REPLY_STATUS;
            freeReplyObject(r);
          }
        }
        redisFree(c);
        if (ok) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  std::filesystem::path dir_;
  pid_t pid_ = -1;
  int port_ = -1;
};

}  // namespace myriad::serve::testing

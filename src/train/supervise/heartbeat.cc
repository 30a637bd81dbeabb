#include "train/supervise/heartbeat.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "core/log.h"
#include "train/comm/trace.h"

namespace myriad::supervise {
namespace {

double NowEpoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool ResolveIpv4(const std::string& host, sockaddr_in* out) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return false;
  *out = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  freeaddrinfo(res);
  return true;
}

}  // namespace

std::string ReportedHost(int rank) {
  if (const char* h = std::getenv("MYRIAD_HOST"); h && *h) return h;
  if (const char* list = std::getenv("MYRIAD_EMULATED_HOSTS"); list && *list) {
    std::string s(list);
    int i = 0;
    size_t start = 0;
    for (;;) {
      const size_t comma = s.find(',', start);
      if (i == rank) return s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (comma == std::string::npos) break;
      start = comma + 1;
      ++i;
    }
  }
  return MachineName();
}

std::string MachineName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) == 0 && buf[0]) return buf;
  return "localhost";
}

Heartbeat& Heartbeat::Global() {
  static Heartbeat* h = new Heartbeat();  // never destroyed: atexit ordering
  return *h;
}

Heartbeat::~Heartbeat() { Stop(); }

void Heartbeat::Start(int rank, int world, double interval_s) {
  std::lock_guard<std::mutex> lock(mu_);
  rank_ = rank;
  world_ = world;
  host_ = ReportedHost(rank);
  if (const char* a = std::getenv("MYRIAD_ATTEMPT")) attempt_ = std::atoi(a);
  if (fd_ >= 0) return;
  const char* addr = std::getenv("MYRIAD_SUPERVISOR");
  if (addr == nullptr || *addr == 0) return;
  const std::string s(addr);
  const size_t colon = s.rfind(':');
  sockaddr_in sa{};
  if (colon == std::string::npos || !ResolveIpv4(s.substr(0, colon), &sa)) {
    LOG_WARN("MYRIAD_SUPERVISOR=%s is not HOST:PORT; no heartbeats", addr);
    return;
  }
  sa.sin_port = htons(static_cast<uint16_t>(std::atoi(s.c_str() + colon + 1)));
  addr_.assign(reinterpret_cast<uint8_t*>(&sa), reinterpret_cast<uint8_t*>(&sa) + sizeof sa);
  fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return;
  if (interval_s <= 0) {
    const char* e = std::getenv("MYRIAD_HEARTBEAT_S");
    interval_s = e ? std::atof(e) : 0.5;
  }
  interval_s_ = interval_s > 0 ? interval_s : 0.5;
  stop_ = false;
  thread_ = std::thread([this] { Loop(); });
}

void Heartbeat::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Heartbeat::SetPhase(const char* phase) { phase_.store(phase, std::memory_order_relaxed); }

nlohmann::json Heartbeat::Base(const char* kind) const {
  return {{"v", 1}, {"kind", kind}, {"rank", rank_}, {"world", world_}, {"host", host_},
          {"attempt", attempt_}, {"pid", static_cast<int64_t>(getpid())}, {"t", NowEpoch()},
          {"step", step_.load(std::memory_order_relaxed)}, {"phase", phase_.load(std::memory_order_relaxed)}};
}

void Heartbeat::Send(const nlohmann::json& j) {
  if (fd_ < 0) return;
  const std::string s = j.dump();
  (void)sendto(fd_, s.data(), s.size(), MSG_DONTWAIT, reinterpret_cast<const sockaddr*>(addr_.data()),
               static_cast<socklen_t>(addr_.size()));
}

void Heartbeat::StepDone(int64_t step, double step_s, double compute_s) {
  step_.store(step, std::memory_order_relaxed);
  if (fd_ < 0) return;
  nlohmann::json j = Base("step");
  j["step_s"] = step_s;
  if (compute_s >= 0) j["compute_s"] = compute_s;
  Send(j);
}

void Heartbeat::Event(const std::string& name, nlohmann::json fields) {
  if (fd_ < 0) return;
  nlohmann::json j = Base("event");
  j["event"] = name;
  for (auto it = fields.begin(); it != fields.end(); ++it) j[it.key()] = it.value();
  Send(j);
}

void Heartbeat::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    nlohmann::json j = Base("beat");
    const comm::OpTrace t = comm::CurrentTrace();
    j["op"] = t.op;
    j["comm"] = t.comm;
    j["op_seq"] = t.seq;
    j["in_op"] = t.in_progress;
    j["op_s"] = t.seconds_in;
    Send(j);
    lock.lock();
    cv_.wait_for(lock, std::chrono::duration<double>(interval_s_), [&] { return stop_; });
  }
}

// ---- listener

Result<std::unique_ptr<HeartbeatListener>> HeartbeatListener::Open(const std::string& bind_host, int port) {
  sockaddr_in sa{};
  if (!ResolveIpv4(bind_host, &sa)) return Status::Error("heartbeat listener: cannot resolve " + bind_host);
  sa.sin_port = htons(static_cast<uint16_t>(port));
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Error(std::string("heartbeat listener: socket: ") + std::strerror(errno));
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    const std::string e = std::strerror(errno);
    close(fd);
    return Status::Error("heartbeat listener: bind " + bind_host + ":" + std::to_string(port) + ": " + e);
  }
  socklen_t len = sizeof sa;
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  int rcv = 4 << 20;  // bursts of step messages from many ranks
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
  std::unique_ptr<HeartbeatListener> l(new HeartbeatListener());
  l->fd_ = fd;
  l->port_ = ntohs(sa.sin_port);
  l->host_ = bind_host;
  return l;
}

HeartbeatListener::~HeartbeatListener() {
  if (fd_ >= 0) close(fd_);
}

bool HeartbeatListener::Receive(double timeout_s, nlohmann::json* out) {
  pollfd p{fd_, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(timeout_s * 1000)) <= 0) return false;
  char buf[65536];
  const ssize_t n = recv(fd_, buf, sizeof buf, 0);
  if (n <= 0) return false;
  auto j = nlohmann::json::parse(buf, buf + n, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("kind") || !j.contains("rank")) {
    ++malformed_;
    return false;
  }
  *out = std::move(j);
  return true;
}

}  // namespace myriad::supervise

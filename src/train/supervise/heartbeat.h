// Heartbeats: how every training rank tells the supervisor (`myriad launch`)
// what it is doing, and how the supervisor hears it.
//
// Transport: one UDP datagram per message, a JSON object, to the address in
// $MYRIAD_SUPERVISOR ("HOST:PORT", set by the supervisor for its children).
// Datagrams are fire-and-forget: a rank never blocks on, or fails because
// of, the supervisor; without $MYRIAD_SUPERVISOR every call is a no-op.
//
// Messages ("kind"):
//   "beat"   every interval from a background thread: step, phase, the comm
//            trace (last op, communicator, sequence, ops in progress, seconds
//            in the current op) -- a hung rank keeps beating, and what it
//            beats says where it hangs;
//   "step"   at the end of every step: step, step_s (straggler detection,
//            ETTR);
//   "event"  things the supervisor acts on or reports: "start" (with
//            resumed_step), "health" (ok, report), "fault" (an injected fault
//            firing), "checkpoint" (step, snapshot/blocked/persist seconds, ok),
//            "numerical" (NaN or loss spike), "exit" (ok, reason).
// Every message carries rank, world, host, attempt, pid and t (seconds since
// the epoch).
//
// The host of a rank is $MYRIAD_HOST, else the i-th name (i = rank) of the
// comma-separated $MYRIAD_EMULATED_HOSTS (the supervisor's emulated nodes on
// one machine), else gethostname().
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace myriad::supervise {

class Heartbeat {
 public:
  // The process's reporter (created on first use, disabled until Start).
  static Heartbeat& Global();

  // Reads the environment; starts the beat thread when $MYRIAD_SUPERVISOR is
  // set. Idempotent. interval_s <= 0: $MYRIAD_HEARTBEAT_S, else 0.5.
  void Start(int rank, int world, double interval_s = 0);
  void Stop();  // joins the beat thread (also at exit)
  bool enabled() const { return fd_ >= 0; }

  void SetPhase(const char* phase);  // a string literal: "init", "step", "checkpoint", "eval", ...
  // compute_s: the step's time less the time blocked in communication (< 0: unknown).
  void StepDone(int64_t step, double step_s, double compute_s = -1);
  // Sends an event now (from the calling thread).
  void Event(const std::string& name, nlohmann::json fields = nlohmann::json::object());

  const std::string& host() const { return host_; }
  int attempt() const { return attempt_; }
  int rank() const { return rank_; }

  ~Heartbeat();

 private:
  Heartbeat() = default;
  nlohmann::json Base(const char* kind) const;
  void Send(const nlohmann::json& j);
  void Loop();

  int fd_ = -1;
  std::vector<uint8_t> addr_;  // sockaddr_in
  int rank_ = 0, world_ = 1, attempt_ = 0;
  std::string host_;
  double interval_s_ = 0.5;
  std::atomic<int64_t> step_{0};
  std::atomic<const char*> phase_{"init"};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// The host this process reports (see the header comment).
std::string ReportedHost(int rank);
// This machine's own name (gethostname; "localhost" when it has none),
// whatever $MYRIAD_HOST or $MYRIAD_EMULATED_HOSTS say: what lock files and
// the supervisor's lifeline (lifeline.h) compare.
std::string MachineName();

// The supervisor's side: a UDP socket on 127.0.0.1 (or `bind_host`), port 0
// = any free port; Receive waits up to timeout_s for one message.
class HeartbeatListener {
 public:
  static Result<std::unique_ptr<HeartbeatListener>> Open(const std::string& bind_host = "127.0.0.1", int port = 0);
  ~HeartbeatListener();
  int port() const { return port_; }
  std::string address() const { return host_ + ":" + std::to_string(port_); }
  // Next message, or nullopt after timeout_s; malformed datagrams are
  // skipped (counted in malformed()).
  bool Receive(double timeout_s, nlohmann::json* out);
  int64_t malformed() const { return malformed_; }

 private:
  HeartbeatListener() = default;
  int fd_ = -1;
  int port_ = 0;
  std::string host_;
  int64_t malformed_ = 0;
};

}  // namespace myriad::supervise

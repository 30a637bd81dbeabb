// The parts of the Comm seam shared by every transport: DType sizes, the
// bytes-sent model, requests, the progress queue, and QueuedComm (stats,
// queue discipline, timing) on top of a transport's Do* ops.
#include "train/comm/comm.h"

#include <chrono>

#include "core/check.h"
#include "core/transport_access.h"
#include "train/comm/trace.h"

namespace myriad::comm {

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF64: return 8;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
  }
  CHECK_MSG(false, "[comm] unknown DType %d", static_cast<int>(t));
  return 0;
}

namespace sent_bytes {
int64_t AllReduce(int64_t bytes, int n) { return n <= 1 ? 0 : 2 * (n - 1) * bytes / n; }
int64_t ReduceScatter(int64_t block_bytes, int n) { return n <= 1 ? 0 : (n - 1) * block_bytes; }
int64_t AllGather(int64_t block_bytes, int n) { return n <= 1 ? 0 : (n - 1) * block_bytes; }
int64_t Broadcast(int64_t bytes, int n, int rank, int root) {
  const int distance = (rank - root + n) % n;
  return distance < n - 1 ? bytes : 0;
}
}  // namespace sent_bytes

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Adds the wall time of its scope to stats->seconds.
class ScopedTimer {
 public:
  explicit ScopedTimer(CommStats* stats) : stats_(stats), t0_(Clock::now()) {}
  ~ScopedTimer() {
    if (stats_ != nullptr) stats_->seconds += SecondsSince(t0_);
  }

 private:
  CommStats* stats_;
  Clock::time_point t0_;
};

// One transport call: its wall time into the stats, a trace span, and
// device memory open to the transport (core/transport_access.h).
struct OpScope {
  OpScope(CommStats* stats, const char* op, const std::string& comm) : timer(stats), trace(op, comm) {}
  ScopedTimer timer;
  TraceScope trace;
  ScopedTransportAccess access;
};

}  // namespace

// ---- Request

void RequestState::WaitDone() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!done_) {
    if (cv_.wait_for(lock, std::chrono::milliseconds(20), [&] { return done_; })) break;
    if (poll_while_waiting) {
      lock.unlock();
      poll_while_waiting();
      lock.lock();
    }
  }
  if (error_) std::rethrow_exception(error_);
}

bool RequestState::TestDone() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void RequestState::MarkDone(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

void Request::Wait() {
  if (!s_) return;
  ScopedTimer timer(s_->stats);
  TraceScope trace("Wait", "");
  ScopedTransportAccess access;
  s_->WaitDone();
}

bool Request::Test() {
  ScopedTransportAccess access;
  return !s_ || s_->TestDone();
}

// ---- ProgressQueue

void ProgressQueue::Enqueue(std::function<void()> work, std::shared_ptr<RequestState> state) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    CHECK_MSG(!stopping_, "[comm] op issued on a communicator being destroyed");
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
    items_.push_back(Item{std::move(work), std::move(state)});
    ++queued_;
  }
  cv_.notify_all();
}

void ProgressQueue::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t target = queued_;
  cv_.wait(lock, [&] { return finished_ >= target; });
}

void ProgressQueue::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ProgressQueue::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return !items_.empty() || stopping_; });
    if (items_.empty()) return;  // stopping and drained
    Item item = std::move(items_.front());
    items_.pop_front();
    lock.unlock();
    std::exception_ptr error;
    try {
      ScopedTransportAccess access;
      item.work();
    } catch (...) {
      error = std::current_exception();
    }
    item.state->MarkDone(error);
    item = Item{};  // drop captured buffers' owners before signalling Drain
    lock.lock();
    ++finished_;
    cv_.notify_all();
  }
}

// ---- QueuedComm

Request QueuedComm::Async(int64_t bytes, std::function<void()> op) {
  Count(bytes);
  std::shared_ptr<RequestState> state = NewState();
  state->stats = &stats_;
  if (async_inline_) {
    ScopedTimer timer(&stats_);
    ScopedTransportAccess access;
    std::exception_ptr error;
    try {
      op();
    } catch (...) {
      error = std::current_exception();
    }
    state->MarkDone(error);
  } else {
    queue_.Enqueue(std::move(op), state);
  }
  return Request(std::move(state));
}

void QueuedComm::AllReduce(void* buf, int64_t count, DType t, ReduceOp op) {
  Count(sent_bytes::AllReduce(count * static_cast<int64_t>(DTypeSize(t)), size()));
  DrainQueue();
  OpScope scope(&stats_, "AllReduce", name());
  DoAllReduce(buf, count, t, op);
}

void QueuedComm::ReduceScatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op) {
  Count(sent_bytes::ReduceScatter(count * static_cast<int64_t>(DTypeSize(t)), size()));
  DrainQueue();
  OpScope scope(&stats_, "ReduceScatter", name());
  DoReduceScatter(send, recv, count, t, op);
}

void QueuedComm::AllGather(const void* send, void* recv, int64_t count, DType t) {
  Count(sent_bytes::AllGather(count * static_cast<int64_t>(DTypeSize(t)), size()));
  DrainQueue();
  OpScope scope(&stats_, "AllGather", name());
  DoAllGather(send, recv, count, t);
}

void QueuedComm::AllToAllV(const void* send, const int64_t* send_counts, const int64_t* send_displs,
                           void* recv, const int64_t* recv_counts, const int64_t* recv_displs,
                           DType t) {
  int64_t elements = 0;
  for (int r = 0; r < size(); ++r) {
    if (r != rank()) elements += send_counts[r];
  }
  Count(elements * static_cast<int64_t>(DTypeSize(t)));
  DrainQueue();
  OpScope scope(&stats_, "AllToAllV", name());
  DoAllToAllV(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
}

void QueuedComm::Broadcast(void* buf, int64_t count, DType t, int root) {
  CHECK_MSG(root >= 0 && root < size(), "[comm] Broadcast root %d outside [0, %d)", root, size());
  Count(sent_bytes::Broadcast(count * static_cast<int64_t>(DTypeSize(t)), size(), rank(), root));
  DrainQueue();
  OpScope scope(&stats_, "Broadcast", name());
  DoBroadcast(buf, count, t, root);
}

void QueuedComm::Barrier() {
  Count(0);
  DrainQueue();
  OpScope scope(&stats_, "Barrier", name());
  DoBarrier();
}

std::unique_ptr<Comm> QueuedComm::Split(int color, int key) {
  CHECK_MSG(color >= 0, "[comm] Split color must be >= 0, got %d", color);
  DrainQueue();
  return DoSplit(color, key);
}

void QueuedComm::Send(const void* buf, int64_t count, DType t, int dst, int tag) {
  CHECK_MSG(dst >= 0 && dst < size(), "[comm] Send to rank %d outside [0, %d)", dst, size());
  Count(count * static_cast<int64_t>(DTypeSize(t)));
  OpScope scope(&stats_, "Send", name());
  DoISend(buf, count, t, dst, tag)->WaitDone();
}

void QueuedComm::Recv(void* buf, int64_t count, DType t, int src, int tag) {
  CHECK_MSG(src >= 0 && src < size(), "[comm] Recv from rank %d outside [0, %d)", src, size());
  Count(0);
  OpScope scope(&stats_, "Recv", name());
  DoIRecv(buf, count, t, src, tag)->WaitDone();
}

Request QueuedComm::ISend(const void* buf, int64_t count, DType t, int dst, int tag) {
  CHECK_MSG(dst >= 0 && dst < size(), "[comm] ISend to rank %d outside [0, %d)", dst, size());
  Count(count * static_cast<int64_t>(DTypeSize(t)));
  ScopedTransportAccess access;
  std::shared_ptr<RequestState> state = DoISend(buf, count, t, dst, tag);
  state->stats = &stats_;
  return Request(std::move(state));
}

Request QueuedComm::IRecv(void* buf, int64_t count, DType t, int src, int tag) {
  CHECK_MSG(src >= 0 && src < size(), "[comm] IRecv from rank %d outside [0, %d)", src, size());
  Count(0);
  ScopedTransportAccess access;
  std::shared_ptr<RequestState> state = DoIRecv(buf, count, t, src, tag);
  state->stats = &stats_;
  return Request(std::move(state));
}

Request QueuedComm::IAllReduce(void* buf, int64_t count, DType t, ReduceOp op) {
  return Async(sent_bytes::AllReduce(count * static_cast<int64_t>(DTypeSize(t)), size()),
               [=, this] { TraceScope trace("IAllReduce", name()); DoAllReduce(buf, count, t, op); });
}

Request QueuedComm::IReduceScatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op) {
  return Async(sent_bytes::ReduceScatter(count * static_cast<int64_t>(DTypeSize(t)), size()),
               [=, this] { TraceScope trace("IReduceScatter", name()); DoReduceScatter(send, recv, count, t, op); });
}

Request QueuedComm::IAllGather(const void* send, void* recv, int64_t count, DType t) {
  return Async(sent_bytes::AllGather(count * static_cast<int64_t>(DTypeSize(t)), size()),
               [=, this] { TraceScope trace("IAllGather", name()); DoAllGather(send, recv, count, t); });
}

}  // namespace myriad::comm

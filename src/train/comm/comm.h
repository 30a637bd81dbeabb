// Comm: the one seam for collective and point-to-point communication
// (ARCHITECTURE.md, "Seams"). Implementations: MpiComm (real ranks started by
// mpirun; spans machines) and LocalComm (ranks as threads of one process, for
// fast unit tests). Hierarchy and compression are decorators (hierarchical.h,
// compressed.h), never code inside the model.
//
// Rules every implementation keeps:
// - Collectives on one communicator are issued in the same order by every
//   rank of it (as in MPI). Async collectives run on a per-communicator
//   progress thread in issue order; a sync collective on a communicator first
//   waits for that communicator's queued async work.
// - Point-to-point ops (Send/Recv/ISend/IRecv) do not wait for the queue and
//   are matched by (source, tag). ISend never blocks the caller.
// - Buffers passed to an async op must stay valid until Wait() returns.
// - Every op counts the bytes this rank sends (stats()).
// - Errors in the transport are fatal (MPI_ERRORS_ARE_FATAL): a rank that
//   cannot communicate aborts with a message; issue 5's supervisor restarts.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace myriad::comm {

enum class DType { kF32, kF64, kI32, kI64, kU8 };
size_t DTypeSize(DType t);

enum class ReduceOp { kSum, kMax, kMin };

// Bytes this rank sent, by kind of op, since the last Reset.
//
// "Bytes sent" follows one model per op, the same in every implementation so
// figures compare across LocalComm and MpiComm (B = count * DTypeSize, n =
// size(); n == 1 sends nothing):
//   AllReduce      2*(n-1)*B/n   (ring: reduce-scatter then all-gather)
//   ReduceScatter  (n-1)*count*es  ((n-1)/n of the input, B = n*count*es)
//   AllGather      (n-1)*B        ((n-1)/n of the output)
//   AllToAllV      sum of send_counts[j]*es over j != rank() (off-rank only)
//   Broadcast      B on every rank but the last of the chain root, root+1, ...
//                  (a pipelined chain: each rank forwards what it got)
//   Send/ISend     B;  Recv/IRecv, Barrier: 0
// `ops` counts every call above (sync and async, Recv and Barrier included;
// Split is setup, not counted). Stats belong to one communicator and are
// updated by the thread that issues (and waits on) its ops, without locking.
struct CommStats {
  int64_t bytes_sent = 0;
  int64_t ops = 0;
  double seconds = 0;  // wall time inside ops issued synchronously or waited on
  void Reset() { *this = CommStats{}; }
};

// Handle of an asynchronous op. Default-constructed handles are complete.
class Request {
 public:
  Request() = default;
  explicit Request(std::shared_ptr<struct RequestState> s) : s_(std::move(s)) {}
  void Wait();        // blocks until the op is complete (idempotent)
  bool Test();        // true when complete; never blocks
  bool valid() const { return s_ != nullptr; }

 private:
  std::shared_ptr<struct RequestState> s_;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // A short description, e.g. "mpi world 4" or "local tp 2".
  virtual std::string name() const = 0;

  // ---- Synchronous ops.
  // In place: buf[count] = op over ranks of buf.
  virtual void AllReduce(void* buf, int64_t count, DType t, ReduceOp op) = 0;
  // send[size()*count] -> recv[count]: block r of the reduction lands on rank r.
  virtual void ReduceScatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op) = 0;
  // send[count] -> recv[size()*count], rank r's block at r*count. send may
  // alias recv + rank()*count.
  virtual void AllGather(const void* send, void* recv, int64_t count, DType t) = 0;
  // Counts and displacements in elements, one per rank.
  virtual void AllToAllV(const void* send, const int64_t* send_counts, const int64_t* send_displs,
                         void* recv, const int64_t* recv_counts, const int64_t* recv_displs,
                         DType t) = 0;
  virtual void Broadcast(void* buf, int64_t count, DType t, int root) = 0;
  virtual void Send(const void* buf, int64_t count, DType t, int dst, int tag) = 0;
  virtual void Recv(void* buf, int64_t count, DType t, int src, int tag) = 0;
  virtual void Barrier() = 0;

  // ---- Asynchronous ops (see the rules above).
  virtual Request IAllReduce(void* buf, int64_t count, DType t, ReduceOp op) = 0;
  virtual Request IReduceScatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op) = 0;
  virtual Request IAllGather(const void* send, void* recv, int64_t count, DType t) = 0;
  virtual Request ISend(const void* buf, int64_t count, DType t, int dst, int tag) = 0;
  virtual Request IRecv(void* buf, int64_t count, DType t, int src, int tag) = 0;

  // New communicator of the ranks that pass the same color, ordered by key
  // (ties by rank). Collective over this communicator.
  virtual std::unique_ptr<Comm> Split(int color, int key) = 0;
  // The ranks that share this rank's machine (MPI_Comm_split_type SHARED for
  // MPI; everyone for in-process ranks). Collective.
  virtual std::unique_ptr<Comm> SplitShared() { return Split(0, rank()); }

  CommStats& stats() { return stats_; }
  const CommStats& stats() const { return stats_; }

 protected:
  CommStats stats_;
};

// ---- The common frame of the implementations (LocalComm, MpiComm). Callers
// need none of it; decorators may reuse SentBytes.

// The "bytes sent" model above, for one op on an n-rank communicator.
namespace sent_bytes {
int64_t AllReduce(int64_t bytes, int n);
int64_t ReduceScatter(int64_t block_bytes, int n);
int64_t AllGather(int64_t block_bytes, int n);
int64_t Broadcast(int64_t bytes, int n, int rank, int root);
}  // namespace sent_bytes

// State behind a Request. The base completes through MarkDone (from any
// thread); a transport whose completion lives elsewhere (an MPI_Request)
// overrides WaitDone/TestDone.
struct RequestState {
  virtual ~RequestState() = default;
  // Blocks until done; rethrows the error the op finished with, if any.
  virtual void WaitDone();
  virtual bool TestDone();
  void MarkDone(std::exception_ptr error = nullptr);

  // Where Request::Wait adds its wall time (the issuing communicator's
  // stats); null for none. Wait before destroying the communicator.
  CommStats* stats = nullptr;
  // Called about every 20 ms while WaitDone blocks; may throw to give up
  // (LocalComm: another rank failed).
  std::function<void()> poll_while_waiting;

 protected:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

// A per-communicator worker thread that runs queued closures one at a time in
// FIFO order. The thread starts on the first Enqueue.
class ProgressQueue {
 public:
  ProgressQueue() = default;
  ~ProgressQueue() { Stop(); }
  ProgressQueue(const ProgressQueue&) = delete;
  ProgressQueue& operator=(const ProgressQueue&) = delete;

  // Queues `work`; `state` is marked done when it has run, with the exception
  // it threw, if any.
  void Enqueue(std::function<void()> work, std::shared_ptr<RequestState> state);
  // Blocks until everything queued before the call has run.
  void Drain();
  // Runs what is queued, then joins the thread. Idempotent.
  void Stop();

 private:
  void Loop();
  struct Item {
    std::function<void()> work;
    std::shared_ptr<RequestState> state;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
  int64_t queued_ = 0, finished_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

// Implements the public ops of Comm once: stats, the progress queue (async
// collectives run on it; sync collectives, Barrier and Split drain it first)
// and timing. A transport implements the Do* ops, which run on whichever
// thread the frame chooses, and calls StopQueue() first in its destructor.
class QueuedComm : public Comm {
 public:
  void AllReduce(void* buf, int64_t count, DType t, ReduceOp op) final;
  void ReduceScatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op) final;
  void AllGather(const void* send, void* recv, int64_t count, DType t) final;
  void AllToAllV(const void* send, const int64_t* send_counts, const int64_t* send_displs,
                 void* recv, const int64_t* recv_counts, const int64_t* recv_displs,
                 DType t) final;
  void Broadcast(void* buf, int64_t count, DType t, int root) final;
  void Send(const void* buf, int64_t count, DType t, int dst, int tag) final;
  void Recv(void* buf, int64_t count, DType t, int src, int tag) final;
  void Barrier() final;
  Request IAllReduce(void* buf, int64_t count, DType t, ReduceOp op) final;
  Request IReduceScatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op) final;
  Request IAllGather(const void* send, void* recv, int64_t count, DType t) final;
  Request ISend(const void* buf, int64_t count, DType t, int dst, int tag) final;
  Request IRecv(void* buf, int64_t count, DType t, int src, int tag) final;
  std::unique_ptr<Comm> Split(int color, int key) final;

 protected:
  virtual void DoAllReduce(void* buf, int64_t count, DType t, ReduceOp op) = 0;
  virtual void DoReduceScatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op) = 0;
  virtual void DoAllGather(const void* send, void* recv, int64_t count, DType t) = 0;
  virtual void DoAllToAllV(const void* send, const int64_t* send_counts, const int64_t* send_displs,
                           void* recv, const int64_t* recv_counts, const int64_t* recv_displs,
                           DType t) = 0;
  virtual void DoBroadcast(void* buf, int64_t count, DType t, int root) = 0;
  virtual void DoBarrier() = 0;
  virtual std::unique_ptr<Comm> DoSplit(int color, int key) = 0;
  // Point-to-point: the returned state completes when the op has. A blocking
  // Send/Recv is the async one waited on.
  virtual std::shared_ptr<RequestState> DoISend(const void* buf, int64_t count, DType t, int dst, int tag) = 0;
  virtual std::shared_ptr<RequestState> DoIRecv(void* buf, int64_t count, DType t, int src, int tag) = 0;
  // A fresh state for an async collective (LocalComm sets its abort poll).
  virtual std::shared_ptr<RequestState> NewState() { return std::make_shared<RequestState>(); }

  // When true, async collectives run at issue on the calling thread and
  // return complete requests (MPI without MPI_THREAD_MULTIPLE).
  void set_async_inline(bool v) { async_inline_ = v; }
  // Drains the queue (only collectives queued by earlier calls) and joins.
  void StopQueue() { queue_.Stop(); }
  // Drains the queue before a sync collective.
  void DrainQueue() { queue_.Drain(); }

 private:
  Request Async(int64_t bytes, std::function<void()> op);
  void Count(int64_t bytes) { stats_.bytes_sent += bytes; stats_.ops += 1; }
  ProgressQueue queue_;
  bool async_inline_ = false;
};

// Convenience for the common float case.
inline void AllReduceSum(Comm& c, float* buf, int64_t n) { c.AllReduce(buf, n, DType::kF32, ReduceOp::kSum); }
inline void AllReduceSum(Comm& c, double* buf, int64_t n) { c.AllReduce(buf, n, DType::kF64, ReduceOp::kSum); }

}  // namespace myriad::comm

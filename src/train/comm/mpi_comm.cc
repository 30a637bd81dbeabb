#include "train/comm/mpi_comm.h"

// The C API only: the deprecated C++ bindings would need libmpi_cxx, which
// MPI::MPI_C does not link.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <climits>
#include <mutex>
#include <set>
#include <vector>

#include "core/check.h"
#include "core/log.h"

namespace myriad::comm {
namespace {

bool g_thread_multiple = false;

MPI_Datatype MpiType(DType t) {
  switch (t) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kF64: return MPI_DOUBLE;
    case DType::kI32: return MPI_INT32_T;
    case DType::kI64: return MPI_INT64_T;
    case DType::kU8: return MPI_UINT8_T;
  }
  CHECK_MSG(false, "[comm] unknown DType %d", static_cast<int>(t));
  return MPI_DATATYPE_NULL;
}

// OpenMPI 4.1's AVX reduction component saturates 8-bit integer sums
// (open-mpi/ompi#8045); this op wraps modulo 256 as LocalComm does.
MPI_Op g_wrapping_sum_u8 = MPI_OP_NULL;

void WrappingSumU8(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint8_t* a = static_cast<const uint8_t*>(in);
  uint8_t* b = static_cast<uint8_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = static_cast<uint8_t>(a[i] + b[i]);
}

MPI_Op MpiOp(ReduceOp op, DType t) {
  if (op == ReduceOp::kSum && t == DType::kU8) return g_wrapping_sum_u8;
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

// MPI counts are ints; larger messages need chunking this layer does not do.
int FitInt(int64_t v, const char* op, const char* what) {
  CHECK_MSG(v >= 0 && v <= INT_MAX,
            "[comm] %s: %s %lld does not fit MPI's int count; split the message", op, what,
            static_cast<long long>(v));
  return static_cast<int>(v);
}

bool MpiFinalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

// Completion of an MPI_Isend/MPI_Irecv.
class MpiRequestState final : public RequestState {
 public:
  MpiRequestState() = default;
  ~MpiRequestState() override {
    // Not waited on: let MPI complete it in the background.
    if (request != MPI_REQUEST_NULL && !MpiFinalized()) MPI_Request_free(&request);
  }
  void WaitDone() override { MPI_Wait(&request, MPI_STATUS_IGNORE); }
  bool TestDone() override {
    int done = 0;
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    return done != 0;
  }
  MPI_Request request = MPI_REQUEST_NULL;
};

class MpiComm;

// Every live MpiComm, so FinalizeMpi can free their communicators first.
std::mutex g_registry_mu;
std::set<MpiComm*> g_registry;

class MpiComm final : public QueuedComm {
 public:
  // Takes ownership of `comm`.
  MpiComm(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_ARE_FATAL);
    set_async_inline(!g_thread_multiple);
    std::lock_guard<std::mutex> lock(g_registry_mu);
    g_registry.insert(this);
  }

  ~MpiComm() override {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    g_registry.erase(this);
    Release();
  }

  // Runs queued work and frees the MPI communicator (before MPI_Finalize).
  void Release() {
    StopQueue();
    if (comm_ != MPI_COMM_NULL && !MpiFinalized()) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_ + " " + std::to_string(size_); }

  std::unique_ptr<Comm> SplitShared() override {
    DrainQueue();
    MPI_Comm out = MPI_COMM_NULL;
    MPI_Comm_split_type(Handle(), MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &out);
    return std::make_unique<MpiComm>(out, "mpi shared");
  }

 protected:
  void DoAllReduce(void* buf, int64_t count, DType t, ReduceOp op) override {
    MPI_Allreduce(MPI_IN_PLACE, buf, FitInt(count, "AllReduce", "count"), MpiType(t), MpiOp(op, t),
                  Handle());
  }

  void DoReduceScatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op) override {
    FitInt(count * size_, "ReduceScatter", "input count");
    MPI_Reduce_scatter_block(send, recv, FitInt(count, "ReduceScatter", "count"), MpiType(t),
                             MpiOp(op, t), Handle());
  }

  void DoAllGather(const void* send, void* recv, int64_t count, DType t) override {
    const int n = FitInt(count, "AllGather", "count");
    FitInt(count * size_, "AllGather", "output count");
    const void* own_block = static_cast<const char*>(recv) + rank_ * count * DTypeSize(t);
    MPI_Allgather(send == own_block ? MPI_IN_PLACE : send, n, MpiType(t), recv, n, MpiType(t),
                  Handle());
  }

  void DoAllToAllV(const void* send, const int64_t* send_counts, const int64_t* send_displs,
                   void* recv, const int64_t* recv_counts, const int64_t* recv_displs,
                   DType t) override {
    std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
    for (int r = 0; r < size_; ++r) {
      sc[r] = FitInt(send_counts[r], "AllToAllV", "send count");
      sd[r] = FitInt(send_displs[r], "AllToAllV", "send displacement");
      rc[r] = FitInt(recv_counts[r], "AllToAllV", "receive count");
      rd[r] = FitInt(recv_displs[r], "AllToAllV", "receive displacement");
    }
    MPI_Alltoallv(send, sc.data(), sd.data(), MpiType(t), recv, rc.data(), rd.data(), MpiType(t),
                  Handle());
  }

  void DoBroadcast(void* buf, int64_t count, DType t, int root) override {
    MPI_Bcast(buf, FitInt(count, "Broadcast", "count"), MpiType(t), root, Handle());
  }

  void DoBarrier() override { MPI_Barrier(Handle()); }

  std::unique_ptr<Comm> DoSplit(int color, int key) override {
    MPI_Comm out = MPI_COMM_NULL;
    MPI_Comm_split(Handle(), color, key, &out);
    return std::make_unique<MpiComm>(out, "mpi split");
  }

  std::shared_ptr<RequestState> DoISend(const void* buf, int64_t count, DType t, int dst, int tag) override {
    auto state = std::make_shared<MpiRequestState>();
    MPI_Isend(buf, FitInt(count, "Send", "count"), MpiType(t), dst, tag, Handle(), &state->request);
    return state;
  }

  std::shared_ptr<RequestState> DoIRecv(void* buf, int64_t count, DType t, int src, int tag) override {
    auto state = std::make_shared<MpiRequestState>();
    MPI_Irecv(buf, FitInt(count, "Recv", "count"), MpiType(t), src, tag, Handle(), &state->request);
    return state;
  }

 private:
  MPI_Comm Handle() const {
    CHECK_MSG(comm_ != MPI_COMM_NULL, "[comm] op on '%s' after FinalizeWorld", name().c_str());
    return comm_;
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 0;
  std::string name_;
};

}  // namespace

void InitMpi(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    MPI_Query_thread(&provided);
  } else {
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  }
  g_thread_multiple = provided >= MPI_THREAD_MULTIPLE;
  if (g_wrapping_sum_u8 == MPI_OP_NULL) MPI_Op_create(WrappingSumU8, /*commute=*/1, &g_wrapping_sum_u8);
  static std::once_flag logged;
  if (!g_thread_multiple) {
    std::call_once(logged, [] {
      LOG_INFO("[comm] MPI grants less than MPI_THREAD_MULTIPLE: async collectives run at issue");
    });
  }
}

bool MpiThreadMultiple() { return g_thread_multiple; }

std::unique_ptr<Comm> MakeMpiWorld() {
  MPI_Comm world = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &world);
  return std::make_unique<MpiComm>(world, "mpi world");
}

void FinalizeMpi() {
  static std::mutex finalize_mu;
  std::lock_guard<std::mutex> once(finalize_mu);
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized || MpiFinalized()) return;
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    for (MpiComm* c : g_registry) c->Release();
  }
  if (g_wrapping_sum_u8 != MPI_OP_NULL) MPI_Op_free(&g_wrapping_sum_u8);
  MPI_Finalize();
}

}  // namespace myriad::comm

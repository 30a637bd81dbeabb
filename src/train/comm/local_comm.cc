// LocalComm: ranks are threads; a collective publishes each rank's pointers
// in the group's slots, meets at a rendezvous, reads the other ranks' memory
// directly, and meets again before returning so no rank reuses a buffer
// another is still reading. Slots are only read between those two meetings,
// so the next op may overwrite them after the second one.
#include "train/comm/local_comm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "core/check.h"

namespace myriad::comm {
namespace {

// One job: the communicators made together and every split of them.
struct LocalJob {
  std::atomic<bool> aborted{false};
  void ThrowIfAborted() const {
    if (aborted.load(std::memory_order_acquire)) throw LocalAborted();
  }
};

// A reusable barrier whose last arriver runs a completion before releasing
// the others; waiters give up with LocalAborted when the job aborts.
class Rendezvous {
 public:
  Rendezvous(int n, std::shared_ptr<LocalJob> job) : n_(n), job_(std::move(job)) {}

  void Arrive(const std::function<void()>& on_last = nullptr) {
    std::unique_lock<std::mutex> lock(mu_);
    job_->ThrowIfAborted();
    const uint64_t generation = generation_;
    if (++arrived_ == n_) {
      if (on_last) on_last();
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    while (generation_ == generation) {
      cv_.wait_for(lock, std::chrono::milliseconds(20));
      if (generation_ == generation) job_->ThrowIfAborted();
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::shared_ptr<LocalJob> job_;
};

struct Message {
  int src, tag;
  std::vector<uint8_t> data;
};

struct PostedRecv {
  int src, tag;
  void* buf;
  size_t bytes;
  std::shared_ptr<RequestState> state;
};

// Messages waiting for a receive, and receives waiting for a message, of one
// destination rank. At most one of the two holds entries for a (src, tag).
struct Mailbox {
  std::mutex mu;
  std::deque<Message> queued;
  std::deque<PostedRecv> posted;
};

// What rank r published for the current collective.
struct Slot {
  const void* in = nullptr;
  const int64_t* send_counts = nullptr;
  const int64_t* send_displs = nullptr;
  int64_t count = 0;
  int64_t arg = 0;  // root, or Split's color
  int64_t key = 0;  // Split's key
};

struct LocalGroup {
  LocalGroup(int n, std::shared_ptr<LocalJob> j)
      : size(n), job(std::move(j)), meet(n, job), slots(n), mail(n), split_result(n) {}
  const int size;
  std::shared_ptr<LocalJob> job;
  Rendezvous meet;
  std::vector<Slot> slots;
  std::vector<uint8_t> scratch;  // AllReduce's result, one chunk per rank
  std::vector<Mailbox> mail;     // by destination rank
  std::vector<std::pair<std::shared_ptr<LocalGroup>, int>> split_result;  // by rank
};

template <typename T>
T Combine(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return static_cast<T>(a + b);
    case ReduceOp::kMax: return b > a ? b : a;
    case ReduceOp::kMin: return b < a ? b : a;
  }
  return a;
}

template <typename T>
void ReduceTyped(T* out, const void* const* srcs, int n, int64_t count, ReduceOp op) {
  const T* first = static_cast<const T*>(srcs[0]);
  std::copy(first, first + count, out);
  for (int j = 1; j < n; ++j) {
    const T* src = static_cast<const T*>(srcs[j]);
    for (int64_t i = 0; i < count; ++i) out[i] = Combine(out[i], src[i], op);
  }
}

// out[i] = srcs[0][i] op srcs[1][i] op ... in rank order.
void ReduceInRankOrder(void* out, const void* const* srcs, int n, int64_t count, DType t, ReduceOp op) {
  switch (t) {
    case DType::kF32: return ReduceTyped(static_cast<float*>(out), srcs, n, count, op);
    case DType::kF64: return ReduceTyped(static_cast<double*>(out), srcs, n, count, op);
    case DType::kI32: return ReduceTyped(static_cast<int32_t*>(out), srcs, n, count, op);
    case DType::kI64: return ReduceTyped(static_cast<int64_t*>(out), srcs, n, count, op);
    case DType::kU8: return ReduceTyped(static_cast<uint8_t*>(out), srcs, n, count, op);
  }
}

const uint8_t* Bytes(const void* p) { return static_cast<const uint8_t*>(p); }
uint8_t* Bytes(void* p) { return static_cast<uint8_t*>(p); }

std::shared_ptr<RequestState> CompletedState() {
  auto state = std::make_shared<RequestState>();
  state->MarkDone();
  return state;
}

class LocalComm final : public QueuedComm {
 public:
  LocalComm(std::shared_ptr<LocalGroup> group, int rank, std::string name)
      : group_(std::move(group)), rank_(rank), name_(std::move(name)) {}

  ~LocalComm() override {
    // Destroyed while unwinding from an error: the other ranks will never
    // reach the ops still queued here, so fail them instead of hanging.
    if (std::uncaught_exceptions() > 0) AbortJob();
    StopQueue();
  }

  void AbortJob() { group_->job->aborted.store(true, std::memory_order_release); }

  int rank() const override { return rank_; }
  int size() const override { return group_->size; }
  std::string name() const override { return name_ + " " + std::to_string(group_->size); }

  std::unique_ptr<Comm> SplitShared() override {
    std::unique_ptr<Comm> shared = Split(0, rank_);
    static_cast<LocalComm&>(*shared).name_ = "local shared";
    return shared;
  }

 protected:
  std::shared_ptr<RequestState> NewState() override {
    auto state = std::make_shared<RequestState>();
    std::shared_ptr<LocalJob> job = group_->job;
    state->poll_while_waiting = [job] { job->ThrowIfAborted(); };
    return state;
  }

  void DoAllReduce(void* buf, int64_t count, DType t, ReduceOp op) override {
    LocalGroup& g = *group_;
    const size_t es = DTypeSize(t);
    g.slots[rank_] = Slot{.in = buf, .count = count};
    g.meet.Arrive([&] {
      CheckSameCount("AllReduce");
      if (g.scratch.size() < count * es) g.scratch.resize(count * es);
    });
    const int64_t lo = count * rank_ / g.size, hi = count * (rank_ + 1) / g.size;
    std::vector<const void*> srcs(g.size);
    for (int j = 0; j < g.size; ++j) srcs[j] = Bytes(g.slots[j].in) + lo * es;
    ReduceInRankOrder(g.scratch.data() + lo * es, srcs.data(), g.size, hi - lo, t, op);
    g.meet.Arrive();
    // Every rank's input has been read; the scratch stays until the next
    // collective's first meeting, which needs this rank.
    if (count > 0) std::memcpy(buf, g.scratch.data(), count * es);
  }

  void DoReduceScatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op) override {
    LocalGroup& g = *group_;
    const size_t es = DTypeSize(t);
    g.slots[rank_] = Slot{.in = send, .count = count};
    g.meet.Arrive([&] { CheckSameCount("ReduceScatter"); });
    std::vector<const void*> srcs(g.size);
    for (int j = 0; j < g.size; ++j) srcs[j] = Bytes(g.slots[j].in) + rank_ * count * es;
    ReduceInRankOrder(recv, srcs.data(), g.size, count, t, op);
    g.meet.Arrive();
  }

  void DoAllGather(const void* send, void* recv, int64_t count, DType t) override {
    LocalGroup& g = *group_;
    const size_t es = DTypeSize(t);
    g.slots[rank_] = Slot{.in = send, .count = count};
    g.meet.Arrive([&] { CheckSameCount("AllGather"); });
    for (int j = 0; j < g.size; ++j) {
      uint8_t* dst = Bytes(recv) + j * count * es;
      if (dst != g.slots[j].in && count > 0) std::memcpy(dst, g.slots[j].in, count * es);
    }
    g.meet.Arrive();
  }

  void DoAllToAllV(const void* send, const int64_t* send_counts, const int64_t* send_displs,
                   void* recv, const int64_t* recv_counts, const int64_t* recv_displs,
                   DType t) override {
    LocalGroup& g = *group_;
    const size_t es = DTypeSize(t);
    g.slots[rank_] = Slot{.in = send, .send_counts = send_counts, .send_displs = send_displs};
    g.meet.Arrive();
    for (int j = 0; j < g.size; ++j) {
      const Slot& from = g.slots[j];
      const int64_t n = from.send_counts[rank_];
      CHECK_MSG(n == recv_counts[j],
                "[comm] AllToAllV: rank %d sends %lld elements to rank %d, which expects %lld",
                j, static_cast<long long>(n), rank_, static_cast<long long>(recv_counts[j]));
      if (n > 0) {
        std::memcpy(Bytes(recv) + recv_displs[j] * es, Bytes(from.in) + from.send_displs[rank_] * es,
                    n * es);
      }
    }
    g.meet.Arrive();
  }

  void DoBroadcast(void* buf, int64_t count, DType t, int root) override {
    LocalGroup& g = *group_;
    g.slots[rank_] = Slot{.in = buf, .count = count, .arg = root};
    g.meet.Arrive([&] {
      CheckSameCount("Broadcast");
      for (int j = 0; j < g.size; ++j) {
        CHECK_MSG(g.slots[j].arg == root, "[comm] Broadcast: rank %d names root %lld, rank %d names %d",
                  j, static_cast<long long>(g.slots[j].arg), rank_, root);
      }
    });
    if (rank_ != root && count > 0) std::memcpy(buf, g.slots[root].in, count * DTypeSize(t));
    g.meet.Arrive();
  }

  void DoBarrier() override { group_->meet.Arrive(); }

  std::unique_ptr<Comm> DoSplit(int color, int key) override {
    LocalGroup& g = *group_;
    g.slots[rank_] = Slot{.arg = color, .key = key};
    // The last arriver forms the groups; results are read before the next
    // Split's meeting, the only place they are written.
    g.meet.Arrive([&] {
      std::map<int64_t, std::vector<int>> members;  // color -> ranks
      for (int j = 0; j < g.size; ++j) members[g.slots[j].arg].push_back(j);
      for (auto& [c, ranks] : members) {
        std::stable_sort(ranks.begin(), ranks.end(),
                         [&](int a, int b) { return g.slots[a].key < g.slots[b].key; });
        auto sub = std::make_shared<LocalGroup>(static_cast<int>(ranks.size()), g.job);
        for (size_t i = 0; i < ranks.size(); ++i) g.split_result[ranks[i]] = {sub, static_cast<int>(i)};
      }
    });
    auto [sub, sub_rank] = g.split_result[rank_];
    return std::make_unique<LocalComm>(std::move(sub), sub_rank, "local split");
  }

  std::shared_ptr<RequestState> DoISend(const void* buf, int64_t count, DType t, int dst, int tag) override {
    group_->job->ThrowIfAborted();
    const size_t bytes = count * DTypeSize(t);
    Mailbox& box = group_->mail[dst];
    std::shared_ptr<RequestState> matched;
    {
      std::lock_guard<std::mutex> lock(box.mu);
      auto it = std::find_if(box.posted.begin(), box.posted.end(),
                             [&](const PostedRecv& p) { return p.src == rank_ && p.tag == tag; });
      if (it != box.posted.end()) {
        CheckSize(bytes, it->bytes, dst, tag);
        if (bytes > 0) std::memcpy(it->buf, buf, bytes);
        matched = std::move(it->state);
        box.posted.erase(it);
      } else {
        box.queued.push_back(Message{rank_, tag, std::vector<uint8_t>(Bytes(buf), Bytes(buf) + bytes)});
      }
    }
    if (matched) matched->MarkDone();
    return CompletedState();
  }

  std::shared_ptr<RequestState> DoIRecv(void* buf, int64_t count, DType t, int src, int tag) override {
    group_->job->ThrowIfAborted();
    const size_t bytes = count * DTypeSize(t);
    Mailbox& box = group_->mail[rank_];
    std::lock_guard<std::mutex> lock(box.mu);
    auto it = std::find_if(box.queued.begin(), box.queued.end(),
                           [&](const Message& m) { return m.src == src && m.tag == tag; });
    if (it != box.queued.end()) {
      CheckSize(it->data.size(), bytes, rank_, tag);
      if (bytes > 0) std::memcpy(buf, it->data.data(), bytes);
      box.queued.erase(it);
      return CompletedState();
    }
    std::shared_ptr<RequestState> state = NewState();
    box.posted.push_back(PostedRecv{src, tag, buf, bytes, state});
    return state;
  }

 private:
  // Runs in a completion, when every rank's slot is published.
  void CheckSameCount(const char* op) const {
    const LocalGroup& g = *group_;
    for (int j = 1; j < g.size; ++j) {
      CHECK_MSG(g.slots[j].count == g.slots[0].count,
                "[comm] %s on '%s': rank 0 passes count %lld, rank %d passes %lld", op,
                name().c_str(), static_cast<long long>(g.slots[0].count), j,
                static_cast<long long>(g.slots[j].count));
    }
  }

  static void CheckSize(size_t sent, size_t expected, int dst, int tag) {
    CHECK_MSG(sent == expected, "[comm] message of %zu bytes to rank %d (tag %d), receive expects %zu",
              sent, dst, tag, expected);
  }

  std::shared_ptr<LocalGroup> group_;
  const int rank_;
  std::string name_;
};

}  // namespace

std::vector<std::unique_ptr<Comm>> MakeLocalComms(int n, const std::string& name) {
  CHECK_MSG(n >= 1, "[comm] a local job needs at least one rank, got %d", n);
  auto group = std::make_shared<LocalGroup>(n, std::make_shared<LocalJob>());
  std::vector<std::unique_ptr<Comm>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(std::make_unique<LocalComm>(group, r, name));
  return comms;
}

std::unique_ptr<Comm> MakeSelfComm() { return std::move(MakeLocalComms(1, "local self")[0]); }

void RunLocalRanks(int n, const std::function<void(Comm&)>& fn) {
  std::vector<std::unique_ptr<Comm>> comms = MakeLocalComms(n);
  std::mutex mu;
  std::exception_ptr first_error, first_abort;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Comm> comm = std::move(comms[r]);
      try {
        fn(*comm);
      } catch (const LocalAborted&) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first_abort) first_abort = std::current_exception();
      } catch (...) {
        static_cast<LocalComm&>(*comm).AbortJob();
        std::lock_guard<std::mutex> lock(mu);
        if (!first_error) first_error = std::current_exception();
      }
      // Destroyed on its own thread: queued async ops finish (or fail fast
      // after an abort) alongside the other ranks'.
      comm.reset();
    });
  }
  for (std::thread& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
  if (first_abort) std::rethrow_exception(first_abort);
}

}  // namespace myriad::comm

// Compressed all-reduce: a Comm decorator whose fp32 sum all-reduce sends
// bf16 or block-scaled int8 payloads instead of fp32 (docs/comm.md,
// "Hierarchical and compressed collectives"). Meant for the slow link: the
// inter-node stage of HierarchicalComm, or a flat data-parallel comm.
//
// Algorithm of CompressedComm::AllReduce (n ranks, f32, sum):
//   1. the buffer is cut into n chunks on int8-block boundaries; each rank
//      compresses its whole buffer (plus its error-feedback residual),
//   2. all-to-all-v of the compressed chunks: rank r receives everyone's
//      chunk r (a reduce-scatter of compressed data),
//   3. rank r decompresses them and sums in fp32 in rank order 0..n-1
//      (deterministic), then compresses the summed chunk (with a second
//      residual of its own),
//   4. all-to-all-v again sends that compressed chunk to every rank (an
//      all-gather of exact, unpadded sizes); every rank decompresses all
//      chunks, so every rank ends with bitwise the same result.
// Other ops, other dtypes and other reductions go to the wrapped comm
// unchanged.
//
// Error feedback. What quantisation drops from a buffer is kept (the
// residual x - dequant(quant(x))) and added to that buffer before its next
// compression, so nothing is lost for good: over many steps the transmitted
// sum trails the true sum by at most one quantisation step instead of
// drifting. AllReduce(void*, count) carries no name for "this buffer", so its
// state is keyed by (buffer address, count): right for gradient buckets
// that live at fixed addresses across steps. A caller that reuses one
// scratch buffer for different tensors must name them with AllReduceKeyed
// (keys live in their own space; they never collide with addresses).
// Residuals cost 4 bytes per element of every buffer seen (plus 4 per
// element of this rank's chunk); ForgetResiduals() drops them.
//
// Threads: like every Comm, one caller thread. Async collectives run in
// issue order on this object's progress thread (which then drives the inner
// comm's sync ops); a sync collective first waits for them. Under an MPI
// that grants less than MPI_THREAD_MULTIPLE they run at issue on the caller's
// thread instead, as MpiComm's own do (DecoratorAsyncInline). Point-to-point
// ops go straight to the inner comm. stats() counts the bytes the inner comm
// counted for each op (for the compressed path: the compressed payload);
// read it when no async op is in flight.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/half.h"  // FloatToBf16, Bf16ToFloat
#include "train/comm/comm.h"

namespace myriad::comm {

enum class Compression { kNone, kBf16, kInt8 };
const char* CompressionName(Compression c);
// "none" | "bf16" | "int8"; false on anything else.
bool ParseCompression(const std::string& s, Compression* out);

struct CompressionOptions {
  Compression mode = Compression::kNone;
  bool error_feedback = true;  // keep and re-add residuals (bf16 and int8)
  int64_t block = 256;         // int8: floats per fp32 scale (scale = max|x| / 127)
};

// ---- The codec (pure functions; a chunk is compressed on its own).
// int8 layout of n floats: ceil(n/block) fp32 scales, then n int8 values.
// bf16 layout: n uint16 values, round to nearest even (NaN kept quiet).
int64_t CompressedBytes(Compression c, int64_t n, int64_t block);
// out[CompressedBytes] = compress(x + residual); residual (may be null: no
// error feedback) becomes (x + residual) - decompress(out).
void CompressChunk(Compression c, const float* x, int64_t n, int64_t block, float* residual,
                   uint8_t* out);
// y[n] = decompress(in) (accumulate=false) or y += decompress(in).
void DecompressChunk(Compression c, const uint8_t* in, int64_t n, int64_t block, float* y,
                     bool accumulate);
// (bf16 conversions: core/half.h)

// Which chunk [begin, end) of a count-element buffer rank r of n owns in the
// compressed all-reduce: chunks of ceil(ceil(count/block)/n) blocks, the last
// ones shorter or empty.
void CompressedChunkRange(int64_t count, int64_t block, int n, int r, int64_t* begin,
                          int64_t* end);

// True when decorators (this one, HierarchicalComm) must run async ops at
// issue on the calling thread: MPI is initialised without
// MPI_THREAD_MULTIPLE, so only one thread may call it.
bool DecoratorAsyncInline();

class CompressedComm : public Comm {
 public:
  // Not collective; `inner` must outlive this object and not be used by
  // anyone else while this object has async work queued.
  CompressedComm(Comm& inner, const CompressionOptions& opt);
  ~CompressedComm() override;

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override;

  // f32 + kSum with a mode other than kNone: the compressed algorithm keyed
  // by (buf, count); everything else: inner.AllReduce.
  void AllReduce(void* buf, int64_t count, DType t, ReduceOp op) override;
  // The compressed sum all-reduce with error-feedback state named by `key`
  // (and count) instead of the address.
  void AllReduceKeyed(uint64_t key, float* buf, int64_t count);
  Request IAllReduceKeyed(uint64_t key, float* buf, int64_t count);

  // Identity of one buffer's error-feedback state: an address or a caller's
  // key (separate spaces), and the count of the buffer it names.
  struct ResidualKey {
    uint64_t id = 0;
    int64_t count = 0;
    bool named = false;
    static ResidualKey Address(const void* buf, int64_t count) {
      return {reinterpret_cast<uintptr_t>(buf), count, false};
    }
    static ResidualKey Named(uint64_t key, int64_t count) { return {key, count, true}; }
    auto operator<=>(const ResidualKey&) const = default;
  };
  // The compressed sum of buf[n] with the state of `key`, which may name
  // another buffer (HierarchicalComm compresses its shard of the caller's
  // buffer under the caller's key). Sync; n must be the same on every call
  // with one key.
  void AllReduceWithState(const ResidualKey& key, float* buf, int64_t n);

  void ReduceScatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op) override;
  void AllGather(const void* send, void* recv, int64_t count, DType t) override;
  void AllToAllV(const void* send, const int64_t* send_counts, const int64_t* send_displs,
                 void* recv, const int64_t* recv_counts, const int64_t* recv_displs,
                 DType t) override;
  void Broadcast(void* buf, int64_t count, DType t, int root) override;
  void Send(const void* buf, int64_t count, DType t, int dst, int tag) override;
  void Recv(void* buf, int64_t count, DType t, int src, int tag) override;
  void Barrier() override;

  Request IAllReduce(void* buf, int64_t count, DType t, ReduceOp op) override;
  Request IReduceScatter(const void* send, void* recv, int64_t count, DType t,
                         ReduceOp op) override;
  Request IAllGather(const void* send, void* recv, int64_t count, DType t) override;
  Request ISend(const void* buf, int64_t count, DType t, int dst, int tag) override;
  Request IRecv(void* buf, int64_t count, DType t, int src, int tag) override;

  std::unique_ptr<Comm> Split(int color, int key) override { return inner_.Split(color, key); }
  std::unique_ptr<Comm> SplitShared() override { return inner_.SplitShared(); }

  const CompressionOptions& options() const { return opt_; }
  // Drops every error-feedback residual (e.g. when gradients are reset for
  // a reason other than a step, or buffers are reallocated). Waits for
  // queued async work first.
  void ForgetResiduals();
  // Number of buffers with error-feedback state.
  size_t residual_count() const { return residuals_.size(); }

 private:
  struct Residuals {
    std::vector<float> send;   // [count]: what this rank's own compression dropped
    std::vector<float> chunk;  // [chunk]: what compressing the summed chunk dropped
  };
  // Runs fn (ops on inner_) on this thread and adds the bytes inner_
  // counted to stats_. Sync waits for queued work first; Async queues it.
  void Run(const std::function<void()>& fn);
  void Sync(const std::function<void()>& fn);
  Request Async(std::function<void()> fn);
  std::function<void()> AllReduceOp(void* buf, int64_t count, DType t, ReduceOp op);
  std::function<void()> AllReduceKeyedOp(uint64_t key, float* buf, int64_t count);
  void CompressedSum(const ResidualKey& key, float* buf, int64_t count);

  Comm& inner_;
  CompressionOptions opt_;
  std::map<ResidualKey, Residuals> residuals_;
  std::vector<uint8_t> send_bytes_, recv_bytes_, chunk_bytes_;
  std::vector<float> chunk_sum_;
  ProgressQueue queue_;  // last member: destroyed (drained) first
};

}  // namespace myriad::comm

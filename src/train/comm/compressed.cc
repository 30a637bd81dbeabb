#include "train/comm/compressed.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// The C API only (OpenMPI's C++ bindings would need their own library).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include "core/check.h"
#include "train/comm/mpi_comm.h"

namespace myriad::comm {

const char* CompressionName(Compression c) {
  switch (c) {
    case Compression::kNone: return "none";
    case Compression::kBf16: return "bf16";
    case Compression::kInt8: return "int8";
  }
  return "?";
}

bool ParseCompression(const std::string& s, Compression* out) {
  for (Compression c : {Compression::kNone, Compression::kBf16, Compression::kInt8}) {
    if (s == CompressionName(c)) {
      *out = c;
      return true;
    }
  }
  return false;
}

// ---- Codec.


static int64_t NumBlocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

int64_t CompressedBytes(Compression c, int64_t n, int64_t block) {
  switch (c) {
    case Compression::kNone: return 4 * n;
    case Compression::kBf16: return 2 * n;
    case Compression::kInt8: return n + 4 * NumBlocks(n, block);
  }
  return 0;
}

void CompressChunk(Compression c, const float* x, int64_t n, int64_t block, float* residual,
                   uint8_t* out) {
  CHECK(c != Compression::kNone);
  if (c == Compression::kBf16) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = residual ? x[i] + residual[i] : x[i];
      const uint16_t h = FloatToBf16(v);
      std::memcpy(out + 2 * i, &h, 2);
      if (residual) residual[i] = v - Bf16ToFloat(h);
    }
    return;
  }
  // int8: per block, scale = max|v| / 127 and q = round(v / scale), so
  // |v - q * scale| <= scale / 2 elementwise.
  const int64_t nb = NumBlocks(n, block);
  int8_t* q = reinterpret_cast<int8_t*>(out + 4 * nb);
  std::vector<float> v(static_cast<size_t>(std::min(n, block)));
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t i0 = b * block, m = std::min(block, n - i0);
    float amax = 0;
    for (int64_t i = 0; i < m; ++i) {
      v[i] = residual ? x[i0 + i] + residual[i0 + i] : x[i0 + i];
      amax = std::max(amax, std::fabs(v[i]));
    }
    const float scale = amax / 127.0f;
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    std::memcpy(out + 4 * b, &scale, 4);
    for (int64_t i = 0; i < m; ++i) {
      // Round to nearest even: |v * inv| <= 127 < 2^22, where adding and
      // subtracting 1.5 * 2^23 leaves exactly the rounded integer.
      const float r = (v[i] * inv + 12582912.0f) - 12582912.0f;
      const int8_t qi = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
      q[i0 + i] = qi;
      if (residual) residual[i0 + i] = v[i] - static_cast<float>(qi) * scale;
    }
  }
}

void DecompressChunk(Compression c, const uint8_t* in, int64_t n, int64_t block, float* y,
                     bool accumulate) {
  CHECK(c != Compression::kNone);
  if (c == Compression::kBf16) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, in + 2 * i, 2);
      y[i] = accumulate ? y[i] + Bf16ToFloat(h) : Bf16ToFloat(h);
    }
    return;
  }
  const int64_t nb = NumBlocks(n, block);
  const int8_t* q = reinterpret_cast<const int8_t*>(in + 4 * nb);
  for (int64_t b = 0; b < nb; ++b) {
    float scale;
    std::memcpy(&scale, in + 4 * b, 4);
    const int64_t i0 = b * block, m = std::min(block, n - i0);
    for (int64_t i = 0; i < m; ++i) {
      const float v = static_cast<float>(q[i0 + i]) * scale;
      y[i0 + i] = accumulate ? y[i0 + i] + v : v;
    }
  }
}

void CompressedChunkRange(int64_t count, int64_t block, int n, int r, int64_t* begin,
                          int64_t* end) {
  const int64_t per = NumBlocks(NumBlocks(count, block), n) * block;
  *begin = std::min(count, per * r);
  *end = std::min(count, per * (r + 1));
}

bool DecoratorAsyncInline() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  return initialized && !MpiThreadMultiple();
}

// ---- CompressedComm.

CompressedComm::CompressedComm(Comm& inner, const CompressionOptions& opt)
    : inner_(inner), opt_(opt) {
  if (opt_.block <= 0) {
    std::fprintf(stderr, "[comm] compression block must be positive (got %lld)\n",
                 static_cast<long long>(opt_.block));
    std::abort();
  }
}

CompressedComm::~CompressedComm() { queue_.Stop(); }

std::string CompressedComm::name() const {
  return std::string("compressed(") + CompressionName(opt_.mode) + ") " + inner_.name();
}

void CompressedComm::Run(const std::function<void()>& fn) {
  const int64_t before = inner_.stats().bytes_sent;
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  stats_.bytes_sent += inner_.stats().bytes_sent - before;
  stats_.ops += 1;
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void CompressedComm::Sync(const std::function<void()>& fn) {
  queue_.Drain();
  Run(fn);
}

Request CompressedComm::Async(std::function<void()> fn) {
  if (DecoratorAsyncInline()) {
    Sync(fn);
    return Request();
  }
  auto state = std::make_shared<RequestState>();
  queue_.Enqueue([this, fn = std::move(fn)] { Run(fn); }, state);
  return Request(std::move(state));
}

void CompressedComm::CompressedSum(const ResidualKey& key, float* buf, int64_t count) {
  const int n = size(), me = rank();
  const int64_t block = opt_.block;
  const Compression mode = opt_.mode;
  Residuals* res = nullptr;
  if (opt_.error_feedback) {
    res = &residuals_[key];
    if (res->send.size() != static_cast<size_t>(count)) res->send.assign(static_cast<size_t>(count), 0.0f);
  }
  // Byte layout of everyone's compressed chunks (the same on every rank).
  std::vector<int64_t> begin(n), end(n), bytes(n), displ(n + 1, 0);
  for (int r = 0; r < n; ++r) {
    CompressedChunkRange(count, block, n, r, &begin[r], &end[r]);
    bytes[r] = CompressedBytes(mode, end[r] - begin[r], block);
    displ[r + 1] = displ[r] + bytes[r];
  }
  const int64_t mine = end[me] - begin[me];

  // 1-2. Compress every chunk of the buffer; chunk r goes to rank r.
  send_bytes_.resize(static_cast<size_t>(displ[n]));
  for (int r = 0; r < n; ++r) {
    CompressChunk(mode, buf + begin[r], end[r] - begin[r], block,
                  res ? res->send.data() + begin[r] : nullptr, send_bytes_.data() + displ[r]);
  }
  std::vector<int64_t> scount(n), sdispl(n), rcount(n), rdispl(n);
  for (int r = 0; r < n; ++r) {
    scount[r] = r == me ? 0 : bytes[r];
    sdispl[r] = displ[r];
    rcount[r] = r == me ? 0 : bytes[me];
    rdispl[r] = bytes[me] * r;
  }
  recv_bytes_.resize(static_cast<size_t>(bytes[me] * n));
  inner_.AllToAllV(send_bytes_.data(), scount.data(), sdispl.data(), recv_bytes_.data(),
                   rcount.data(), rdispl.data(), DType::kU8);

  // 3. Sum my chunk in rank order, then compress the sum.
  chunk_sum_.assign(static_cast<size_t>(mine), 0.0f);
  for (int r = 0; r < n; ++r) {
    const uint8_t* src = r == me ? send_bytes_.data() + displ[me] : recv_bytes_.data() + rdispl[r];
    DecompressChunk(mode, src, mine, block, chunk_sum_.data(), /*accumulate=*/r > 0);
  }
  float* chunk_res = nullptr;
  if (res) {
    if (res->chunk.size() != static_cast<size_t>(mine)) res->chunk.assign(static_cast<size_t>(mine), 0.0f);
    chunk_res = res->chunk.data();
  }
  chunk_bytes_.resize(static_cast<size_t>(bytes[me]));
  CompressChunk(mode, chunk_sum_.data(), mine, block, chunk_res, chunk_bytes_.data());

  // 4. Everyone gets every compressed sum (exact sizes), and decompresses.
  for (int r = 0; r < n; ++r) {
    scount[r] = r == me ? 0 : bytes[me];
    sdispl[r] = 0;
    rcount[r] = r == me ? 0 : bytes[r];
    rdispl[r] = displ[r];
  }
  inner_.AllToAllV(chunk_bytes_.data(), scount.data(), sdispl.data(), send_bytes_.data(),
                   rcount.data(), rdispl.data(), DType::kU8);
  for (int r = 0; r < n; ++r) {
    const uint8_t* src = r == me ? chunk_bytes_.data() : send_bytes_.data() + displ[r];
    DecompressChunk(mode, src, end[r] - begin[r], block, buf + begin[r], /*accumulate=*/false);
  }
}

std::function<void()> CompressedComm::AllReduceOp(void* buf, int64_t count, DType t, ReduceOp op) {
  if (opt_.mode == Compression::kNone || t != DType::kF32 || op != ReduceOp::kSum || size() == 1) {
    return [=, this] { inner_.AllReduce(buf, count, t, op); };
  }
  const ResidualKey key = ResidualKey::Address(buf, count);
  return [=, this] { CompressedSum(key, static_cast<float*>(buf), count); };
}

std::function<void()> CompressedComm::AllReduceKeyedOp(uint64_t key, float* buf, int64_t count) {
  if (opt_.mode == Compression::kNone || size() == 1) {
    return [=, this] { inner_.AllReduce(buf, count, DType::kF32, ReduceOp::kSum); };
  }
  return [=, this] { CompressedSum(ResidualKey::Named(key, count), buf, count); };
}

void CompressedComm::AllReduceWithState(const ResidualKey& key, float* buf, int64_t n) {
  if (opt_.mode == Compression::kNone || size() == 1) {
    Sync([&] { inner_.AllReduce(buf, n, DType::kF32, ReduceOp::kSum); });
  } else {
    Sync([&] { CompressedSum(key, buf, n); });
  }
}

void CompressedComm::AllReduce(void* buf, int64_t count, DType t, ReduceOp op) {
  Sync(AllReduceOp(buf, count, t, op));
}
Request CompressedComm::IAllReduce(void* buf, int64_t count, DType t, ReduceOp op) {
  return Async(AllReduceOp(buf, count, t, op));
}
void CompressedComm::AllReduceKeyed(uint64_t key, float* buf, int64_t count) {
  Sync(AllReduceKeyedOp(key, buf, count));
}
Request CompressedComm::IAllReduceKeyed(uint64_t key, float* buf, int64_t count) {
  return Async(AllReduceKeyedOp(key, buf, count));
}

void CompressedComm::ForgetResiduals() {
  queue_.Drain();
  residuals_.clear();
}

void CompressedComm::ReduceScatter(const void* send, void* recv, int64_t count, DType t,
                                   ReduceOp op) {
  Sync([&] { inner_.ReduceScatter(send, recv, count, t, op); });
}
void CompressedComm::AllGather(const void* send, void* recv, int64_t count, DType t) {
  Sync([&] { inner_.AllGather(send, recv, count, t); });
}
void CompressedComm::AllToAllV(const void* send, const int64_t* send_counts,
                               const int64_t* send_displs, void* recv, const int64_t* recv_counts,
                               const int64_t* recv_displs, DType t) {
  Sync([&] { inner_.AllToAllV(send, send_counts, send_displs, recv, recv_counts, recv_displs, t); });
}
void CompressedComm::Broadcast(void* buf, int64_t count, DType t, int root) {
  Sync([&] { inner_.Broadcast(buf, count, t, root); });
}
// Point-to-point ops bypass the queue (comm.h): the inner comm's own.
void CompressedComm::Send(const void* buf, int64_t count, DType t, int dst, int tag) {
  Run([&] { inner_.Send(buf, count, t, dst, tag); });
}
void CompressedComm::Recv(void* buf, int64_t count, DType t, int src, int tag) {
  Run([&] { inner_.Recv(buf, count, t, src, tag); });
}
void CompressedComm::Barrier() {
  Sync([&] { inner_.Barrier(); });
}

Request CompressedComm::IReduceScatter(const void* send, void* recv, int64_t count, DType t,
                                       ReduceOp op) {
  return Async([=, this] { inner_.ReduceScatter(send, recv, count, t, op); });
}
Request CompressedComm::IAllGather(const void* send, void* recv, int64_t count, DType t) {
  return Async([=, this] { inner_.AllGather(send, recv, count, t); });
}
Request CompressedComm::ISend(const void* buf, int64_t count, DType t, int dst, int tag) {
  stats_.bytes_sent += count * static_cast<int64_t>(DTypeSize(t));
  stats_.ops += 1;
  return inner_.ISend(buf, count, t, dst, tag);
}
Request CompressedComm::IRecv(void* buf, int64_t count, DType t, int src, int tag) {
  stats_.ops += 1;
  return inner_.IRecv(buf, count, t, src, tag);
}

}  // namespace myriad::comm

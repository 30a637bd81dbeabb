#include "train/parallel/cp/ring_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "model/buffer.h"
#include "ops/ops.h"

namespace myriad {
namespace {

// Message tags on the cp communicator: K|V blocks and dK|dV accumulators.
constexpr int kTagKv = 7301;
constexpr int kTagDkv = 7302;

void CheckLayout(int T, int cp, int rank) {
  CHECK_MSG(cp >= 1 && rank >= 0 && rank < cp, "[context_parallel] rank %d of cp=%d", rank, cp);
  CHECK_MSG(cp == 1 || (T > 0 && T % (2 * cp) == 0),
            "[context_parallel] T=%d is not divisible by 2*cp=%d (hint: each sequence is cut "
            "into 2*cp equal chunks; choose train.seq_len a multiple of %d)",
            T, 2 * cp, 2 * cp);
}

// Calls fn(local_row0, global_row0, rows) for each contiguous run of `rank`'s
// rows: its two chunks (the whole sequence when cp == 1).
template <typename Fn>
void ForEachChunk(int T, int cp, int rank, Fn fn) {
  CheckLayout(T, cp, rank);
  if (cp == 1) {
    fn(0, 0, T);
    return;
  }
  const int C = T / (2 * cp);
  fn(0, rank * C, C);
  fn(C, (2 * cp - 1 - rank) * C, C);
}

// Copies `rank`'s rows between full [B, T, row] and local [B, Tl, row]
// (to_local: full -> local, else local -> full).
void CopyChunkRows(const char* src, char* dst, int B, int T, int64_t row_bytes, int cp, int rank,
                   bool to_local) {
  const int Tl = T / cp;
  ForEachChunk(T, cp, rank, [&](int l0, int g0, int n) {
    for (int b = 0; b < B; ++b) {
      const int64_t local_off = ((int64_t)b * Tl + l0) * row_bytes;
      const int64_t full_off = ((int64_t)b * T + g0) * row_bytes;
      ops::CopyBytes(src + (to_local ? full_off : local_off), n * row_bytes,
                     dst + (to_local ? local_off : full_off));
    }
  });
}

// Copies [B, rows, X] blocks between strided buffers: for each b, `n`
// contiguous floats from src + b*src_stride to dst + b*dst_stride.
void CopyBatched(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int B,
                 int64_t n) {
  ops::CopyRows(src, src_stride, dst, dst_stride, B, n);
}

// dst += src over the same batched region.
void AddBatched(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int B, int64_t n) {
  for (int b = 0; b < B; ++b) ops::AddScaled(dst + b * dst_stride, src + b * src_stride, 1.f, n, dst + b * dst_stride);
}

struct RingGeom {
  int B, Tl, H, Hkv, D;
  int64_t qrow, kvrow;  // floats per token: H*D and Hkv*D
  int64_t kv_block;     // floats of one contiguous [B, Tl, Hkv, D] tensor
  explicit RingGeom(const AttentionParams& p)
      : B(p.B), Tl(p.Tq), H(p.H), Hkv(p.Hkv), D(p.D), qrow((int64_t)p.H * p.D),
        kvrow((int64_t)p.Hkv * p.D), kv_block((int64_t)p.B * p.Tq * p.Hkv * p.D) {}
};

void CheckLocal(comm::Comm& cp, const AttentionParams& p) {
  CHECK_MSG(p.causal && p.Tq == p.Tk && p.lse && p.out,
            "[ring_attention] local params must be causal with Tq == Tk and out, lse set");
  CheckLayout(p.Tq * cp.size(), cp.size(), cp.rank());
}

// The block's attention params: queries/out from the local tensors at row
// q_row0, keys/values from the contiguous visiting block kv (k then v) at
// row k_row0.
AttentionParams BlockParams(const AttentionParams& local, const RingGeom& g, const RingBlock& blk,
                            const float* kv) {
  AttentionParams p = local;
  p.Tq = blk.q_rows;
  p.Tk = blk.k_rows;
  p.causal = blk.causal;
  p.q = local.q + blk.q_row0 * g.qrow;
  p.out = local.out + blk.q_row0 * g.qrow;
  p.kv_batch_stride = (int64_t)g.Tl * g.kvrow;
  p.k = kv + blk.k_row0 * g.kvrow;
  p.v = kv + g.kv_block + blk.k_row0 * g.kvrow;
  return p;
}

// Merges a block's (out_b, lse_b) into the running (out, lse) of the same
// rows by the log-sum-exp rule:
//   lse' = max + log1p(exp(min - max)),  out' = e^(lse-lse') out + e^(lse_b-lse') out_b.
// out_b is [B, rows, H, D] contiguous, lse_b [B, H, rows]; out uses
// out_batch_stride starting at row q_row0, lse is [B, H, Tl].
void MergeBlock(const AttentionParams& local, const RingGeom& g, const RingBlock& blk,
                const float* out_b, const float* lse_b) {
  ops::AttentionMerge(local.out + (int64_t)blk.q_row0 * g.qrow, local.out_batch_stride, local.lse + blk.q_row0,
                      g.Tl, out_b, lse_b, g.B, blk.q_rows, g.H, g.D);
}

// Packs k and v ([B, Tl, Hkv, D], strided) into one contiguous message.
void PackKv(const AttentionParams& p, const RingGeom& g, float* kv) {
  const int64_t n = (int64_t)g.Tl * g.kvrow;
  CopyBatched(p.k, p.kv_batch_stride, kv, n, g.B, n);
  CopyBatched(p.v, p.kv_batch_stride, kv + g.kv_block, n, g.B, n);
}

}  // namespace

void CpPositions(int T, int cp, int rank, int32_t* pos) {
  ForEachChunk(T, cp, rank, [&](int l0, int g0, int n) {
    for (int i = 0; i < n; ++i) pos[l0 + i] = g0 + i;
  });
}

void CpScatterBytes(const void* full, void* local, int B, int T, int64_t row_bytes, int cp, int rank) {
  CopyChunkRows(static_cast<const char*>(full), static_cast<char*>(local), B, T, row_bytes, cp, rank,
                /*to_local=*/true);
}

void CpGatherBytes(const void* local, void* full, int B, int T, int64_t row_bytes, int cp, int rank) {
  CopyChunkRows(static_cast<const char*>(local), static_cast<char*>(full), B, T, row_bytes, cp, rank,
                /*to_local=*/false);
}

void CpAllGather(comm::Comm& cp, const float* local, int B, int T, int64_t X, float* full) {
  const int n = cp.size();
  CheckLayout(T, n, cp.rank());
  const int64_t count = (int64_t)B * (T / n) * X;
  Buf<float> all;
  all.resize(count * n);
  cp.AllGather(local, all.data(), count, comm::DType::kF32);
  for (int r = 0; r < n; ++r) CpGather(all.data() + r * count, full, B, T, X, n, r);
}

int64_t RingBlock::pairs() const {
  return causal ? (int64_t)q_rows * (q_rows + 1) / 2 : (int64_t)q_rows * k_rows;
}

std::vector<RingBlock> RingStepBlocks(int T, int cp, int rank, int src) {
  CheckLayout(T, cp, rank);
  CHECK_MSG(src >= 0 && src < cp, "[ring_attention] src %d of cp=%d", src, cp);
  if (cp == 1) return {RingBlock{0, T, 0, T, true}};
  const int C = T / (2 * cp);
  // Query chunks r (rows [0,C)) and 2cp-1-r (rows [C,2C)); key chunks src
  // and 2cp-1-src likewise.
  if (src == rank) return {RingBlock{0, 2 * C, 0, 2 * C, true}};
  if (src < rank)  // src < r < 2cp-1-r < 2cp-1-src: only key chunk src is visible, to both.
    return {RingBlock{0, C, 0, C, false}, RingBlock{C, C, 0, C, false}};
  // r < src <= cp-1 < cp <= 2cp-1-src < 2cp-1-r: chunk r sees neither, 2cp-1-r sees both.
  return {RingBlock{C, C, 0, 2 * C, false}};
}

void RingAttentionForward(comm::Comm& cp, const AttentionParams& local) {
  if (cp.size() == 1) {
    ops::Attention(local);
    return;
  }
  CheckLocal(cp, local);
  const RingGeom g(local);
  const int n = cp.size(), r = cp.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  const int T = g.Tl * n;

  // Step 0 (own K/V) is plain causal attention over the local rows and
  // initialises out and lse; later steps merge into them.
  Buf<float> kv[2], out_b, lse_b;  // device
  kv[0].resize(2 * g.kv_block);
  kv[1].resize(2 * g.kv_block);
  out_b.resize((int64_t)g.B * g.Tl * g.qrow);
  lse_b.resize((int64_t)g.B * g.H * g.Tl);
  PackKv(local, g, kv[0].data());
  for (int s = 0; s < n; ++s) {
    const int src = (r - s + n) % n;
    comm::Request send, recv;
    if (s + 1 < n) {
      recv = cp.IRecv(kv[(s + 1) % 2].data(), 2 * g.kv_block, comm::DType::kF32, prev, kTagKv);
      send = cp.ISend(kv[s % 2].data(), 2 * g.kv_block, comm::DType::kF32, next, kTagKv);
    }
    const std::vector<RingBlock> blocks = RingStepBlocks(T, n, r, src);
    if (s == 0) {
      CHECK(blocks.size() == 1 && blocks[0].q_rows == g.Tl && blocks[0].causal);
      ops::Attention(local);
    } else {
      for (const RingBlock& blk : blocks) {
        AttentionParams p = BlockParams(local, g, blk, kv[s % 2].data());
        p.out = out_b.data();
        p.out_batch_stride = (int64_t)blk.q_rows * g.qrow;
        p.lse = lse_b.data();
        ops::Attention(p);
        MergeBlock(local, g, blk, out_b.data(), lse_b.data());
      }
    }
    send.Wait();
    recv.Wait();
  }
}

void RingAttentionBackward(comm::Comm& cp, const AttentionBackwardParams& local) {
  if (cp.size() == 1) {
    ops::AttentionBackward(local);
    return;
  }
  const AttentionParams& f = local.fwd;
  CheckLocal(cp, f);
  const RingGeom g(f);
  const int n = cp.size(), r = cp.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  const int T = g.Tl * n;
  const int64_t kv_msg = 2 * g.kv_block;  // k|v, and dk|dv, each [B, Tl, Hkv, D] contiguous

  // Device buffers. dkv[s % 2] holds, during step s, the dK|dV accumulator
  // of the K/V owner src: received from prev (step 0: started here),
  // completed with this rank's contribution, then sent to next. After cp
  // hops it is home.
  Buf<float> kv[2], dkv[2], dkv_tmp, dq_tmp, lse_rows;
  for (int i = 0; i < 2; ++i) kv[i].resize(kv_msg), dkv[i].zero(kv_msg);
  dkv_tmp.resize(kv_msg);
  dq_tmp.resize((size_t)g.B * f.q_batch_stride + (size_t)g.Tl * g.qrow);
  lse_rows.resize((int64_t)g.B * g.H * g.Tl);
  comm::Request dkv_send[2];
  PackKv(f, g, kv[0].data());

  for (int s = 0; s <= n; ++s) {
    const int src = (r - s + n) % n;
    comm::Request kv_send, kv_recv, dkv_recv;
    if (s > 0) {
      dkv_send[s % 2].Wait();  // the step s-2 send from this buffer
      dkv_recv = cp.IRecv(dkv[s % 2].data(), kv_msg, comm::DType::kF32, prev, kTagDkv);
    }
    if (s == n) {  // our own accumulator, complete
      dkv_recv.Wait();
      const int64_t rows = (int64_t)g.Tl * g.kvrow;
      CopyBatched(dkv[s % 2].data(), rows, local.dk, f.kv_batch_stride, g.B, rows);
      CopyBatched(dkv[s % 2].data() + g.kv_block, rows, local.dv, f.kv_batch_stride, g.B, rows);
      break;
    }
    if (s + 1 < n) {
      kv_recv = cp.IRecv(kv[(s + 1) % 2].data(), kv_msg, comm::DType::kF32, prev, kTagKv);
      kv_send = cp.ISend(kv[s % 2].data(), kv_msg, comm::DType::kF32, next, kTagKv);
    }
    const std::vector<RingBlock> blocks = RingStepBlocks(T, n, r, src);
    float* acc = dkv[s % 2].data();
    if (s == 0) {
      // Own keys: writes dq and starts the own dK/dV accumulator.
      CHECK(blocks.size() == 1 && blocks[0].q_rows == g.Tl && blocks[0].causal);
      AttentionBackwardParams bp = local;
      bp.fwd = BlockParams(f, g, blocks[0], kv[0].data());
      bp.dk = acc;
      bp.dv = acc + g.kv_block;
      ops::AttentionBackward(bp);
    } else {
      for (size_t i = 0; i < blocks.size(); ++i) {
        const RingBlock& blk = blocks[i];
        AttentionBackwardParams bp = local;
        bp.fwd = BlockParams(f, g, blk, kv[s % 2].data());
        if (blk.q_rows != g.Tl) {  // lse is [B, H, rows] contiguous: gather the block's rows
          ops::CopyRows(f.lse + blk.q_row0, g.Tl, lse_rows.data(), blk.q_rows, (int64_t)g.B * g.H, blk.q_rows);
          bp.fwd.lse = lse_rows.data();
        }
        const int64_t q_off = blk.q_row0 * g.qrow, k_off = blk.k_row0 * g.kvrow;
        bp.dout = local.dout + q_off;
        bp.dq = dq_tmp.data() + q_off;
        bp.dk = dkv_tmp.data() + k_off;
        bp.dv = dkv_tmp.data() + g.kv_block + k_off;
        ops::AttentionBackward(bp);  // writes: accumulate by hand
        AddBatched(bp.dq, f.q_batch_stride, local.dq + q_off, f.q_batch_stride, g.B,
                   blk.q_rows * g.qrow);
        if (i == 0) dkv_recv.Wait();  // arrived while the first block computed
        const int64_t kv_stride = (int64_t)g.Tl * g.kvrow;
        AddBatched(bp.dk, kv_stride, acc + k_off, kv_stride, g.B, blk.k_rows * g.kvrow);
        AddBatched(bp.dv, kv_stride, acc + g.kv_block + k_off, kv_stride, g.B, blk.k_rows * g.kvrow);
      }
    }
    dkv_recv.Wait();
    dkv_send[s % 2] = cp.ISend(acc, kv_msg, comm::DType::kF32, next, kTagDkv);
    kv_send.Wait();
    kv_recv.Wait();
  }
  dkv_send[0].Wait();
  dkv_send[1].Wait();
}

}  // namespace myriad

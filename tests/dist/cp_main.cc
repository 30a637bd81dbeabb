// Ring attention on real MPI ranks (run by tests/dist/cp.sh under mpirun):
// every rank builds the same random full-sequence problem, computes
// single-rank causal attention over it (the oracle), then runs
// RingAttentionForward/Backward on its own rows over the world and compares
// its rows of out, lse, dq, dk, dv. Exits 1 on a mismatch (any rank).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/ops.h"
#include "train/comm/world.h"
#include "train/parallel/cp/ring_attention.h"

namespace myriad {
namespace {

std::vector<float> RandomVec(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = rng.Normal();
  return v;
}

AttentionParams Params(int B, int rows, int H, int Hkv, int D) {
  AttentionParams p;
  p.B = B; p.Tq = rows; p.Tk = rows; p.H = H; p.Hkv = Hkv; p.D = D;
  p.scale = 1.f / std::sqrt((float)D);
  p.causal = true;
  p.q_batch_stride = p.out_batch_stride = (int64_t)rows * H * D;
  p.kv_batch_stride = (int64_t)rows * Hkv * D;
  return p;
}

// Max over the local rows of |got - ref| and of |ref|, ref being the
// oracle's full tensor sliced to this rank's rows.
struct Err {
  double diff = 0, scale = 0;
};
Err Compare(const std::vector<float>& got, const std::vector<float>& full_ref, int B, int T, int64_t X,
            int cp, int rank) {
  std::vector<float> ref(got.size());
  CpScatter(full_ref.data(), ref.data(), B, T, X, cp, rank);
  Err e;
  for (size_t i = 0; i < got.size(); ++i) {
    e.diff = std::max(e.diff, (double)std::fabs(got[i] - ref[i]));
    e.scale = std::max(e.scale, (double)std::fabs(ref[i]));
  }
  return e;
}

// Returns the number of mismatching tensors (the same on every rank).
int RunCase(comm::Comm& world, int B, int T, int H, int Hkv, int D) {
  const int cp = world.size(), r = world.rank(), Tl = T / cp;
  const int64_t qw = (int64_t)H * D, kvw = (int64_t)Hkv * D;
  const int64_t nq = (int64_t)B * T * qw, nkv = (int64_t)B * T * kvw;

  // Oracle: single-rank attention over the full sequence.
  std::vector<float> q = RandomVec(nq, 11), k = RandomVec(nkv, 12), v = RandomVec(nkv, 13),
                     dout = RandomVec(nq, 14);
  std::vector<float> out(nq), lse((int64_t)B * H * T), dq(nq), dk(nkv), dv(nkv);
  AttentionBackwardParams full;
  full.fwd = Params(B, T, H, Hkv, D);
  full.fwd.q = q.data(); full.fwd.k = k.data(); full.fwd.v = v.data();
  full.fwd.out = out.data(); full.fwd.lse = lse.data();
  ops::Attention(full.fwd);
  full.dout = dout.data(); full.dq = dq.data(); full.dk = dk.data(); full.dv = dv.data();
  ops::AttentionBackward(full);

  // This rank's rows through the ring.
  std::vector<float> lq(B * Tl * qw), lk(B * Tl * kvw), lv(lk.size()), ldout(lq.size()), lout(lq.size()),
      llse((int64_t)B * H * Tl), ldq(lq.size()), ldk(lk.size()), ldv(lk.size());
  CpScatter(q.data(), lq.data(), B, T, qw, cp, r);
  CpScatter(k.data(), lk.data(), B, T, kvw, cp, r);
  CpScatter(v.data(), lv.data(), B, T, kvw, cp, r);
  CpScatter(dout.data(), ldout.data(), B, T, qw, cp, r);
  AttentionBackwardParams local;
  local.fwd = Params(B, Tl, H, Hkv, D);
  local.fwd.q = lq.data(); local.fwd.k = lk.data(); local.fwd.v = lv.data();
  local.fwd.out = lout.data(); local.fwd.lse = llse.data();
  RingAttentionForward(world, local.fwd);
  local.dout = ldout.data(); local.dq = ldq.data(); local.dk = ldk.data(); local.dv = ldv.data();
  RingAttentionBackward(world, local);

  // Errors per tensor: [diff, scale] pairs, maxed over ranks.
  const Err errs[5] = {Compare(lout, out, B, T, qw, cp, r), Compare(llse, lse, B * H, T, 1, cp, r),
                       Compare(ldq, dq, B, T, qw, cp, r), Compare(ldk, dk, B, T, kvw, cp, r),
                       Compare(ldv, dv, B, T, kvw, cp, r)};
  double buf[10];
  for (int i = 0; i < 5; ++i) buf[2 * i] = errs[i].diff, buf[2 * i + 1] = errs[i].scale;
  world.AllReduce(buf, 10, comm::DType::kF64, comm::ReduceOp::kMax);

  // The collective gather reassembles the full output on every rank.
  std::vector<float> gathered(nq);
  CpAllGather(world, lout.data(), B, T, qw, gathered.data());
  double gather_diff = 0;
  for (int64_t i = 0; i < nq; ++i)
    gather_diff = std::max(gather_diff, (double)std::fabs(gathered[i] - out[i]));
  world.AllReduce(&gather_diff, 1, comm::DType::kF64, comm::ReduceOp::kMax);

  const char* names[5] = {"out", "lse", "dq", "dk", "dv"};
  const double tol = 1e-5;
  int bad = 0;
  std::string line;
  for (int i = 0; i < 5; ++i) {
    const double rel = buf[2 * i] / std::max(buf[2 * i + 1], 1e-30);
    bad += !(rel <= tol);
    char part[64];
    std::snprintf(part, sizeof part, " %s %.2e", names[i], rel);
    line += part;
  }
  bad += !(gather_diff <= tol * buf[1]);
  if (r == 0)
    std::printf("[dist_cp] cp=%d B=%d T=%d H=%d Hkv=%d D=%d rel err:%s allgather %.2e -> %s\n", cp, B, T, H,
                Hkv, D, line.c_str(), gather_diff, bad ? "MISMATCH" : "ok");
  return bad;
}

}  // namespace
}  // namespace myriad

int main(int argc, char** argv) {
  auto world = myriad::comm::InitWorld(&argc, &argv);
  int bad = 0;
  bad += myriad::RunCase(*world, 2, 32, 4, 2, 8);
  bad += myriad::RunCase(*world, 2, 64, 4, 2, 16);
  world.reset();
  myriad::comm::FinalizeWorld();
  return bad ? 1 : 0;
}

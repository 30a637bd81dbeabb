// One parity test for the CPU backend (the MoE and data-movement slots in
// parity_moe_test.cc): every op of every ISA backend
// available on this machine against the scalar oracles of cpu/ref
// (RefOps()), on ragged shapes, with a tolerance per op. Also checks the
// oracles themselves against central finite differences (attention,
// RMSNorm, SwiGLU and softmax-xent backward) and a closed form (q8 GEMV).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/parity_test_util.h"
#include "core/rng.h"

namespace myriad::parity {

TEST_P(Parity, EverySlotIsImplemented) {
  EXPECT_EQ(be_->name(), "cpu-" + GetParam());
  EXPECT_GE(be_->num_threads(), 1);
  // Every slot, optional ones included: the CPU backends implement them all
  // on every ISA except gemm_bf16 (AVX512-BF16 only).
  for (int i = 0; i < kNumBackendSlots; ++i) {
    const BackendSlot& s = BackendSlots()[i];
    if (std::string(s.name) == "gemm_bf16") continue;
    EXPECT_TRUE(be_->supports(s.name)) << s.name;
  }
  EXPECT_EQ(MissingRequiredSlots(*ops_), "");
  EXPECT_FALSE(be_->supports("no_such_op"));
  EXPECT_EQ(CpuBackend("no_such_isa"), nullptr);
  ASSERT_NE(CpuBackend(""), nullptr);
}

// Device memory: alignment, a host -> device -> device -> host round trip,
// mem_set, and a zero-byte allocation.
TEST_P(Parity, DeviceMemory) {
  for (size_t bytes : {size_t{1}, size_t{63}, size_t{4096 + 5}, (size_t{9} << 20) + 12345}) {  // the last: a threaded copy
    std::vector<unsigned char> host(bytes), back(bytes, 0);
    for (size_t i = 0; i < bytes; ++i) host[i] = (unsigned char)(i * 37 + 11);
    void* a = ops_->mem_alloc(bytes);
    void* b = ops_->mem_alloc(bytes);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ((uintptr_t)a % 64, 0u) << bytes;
    ops_->mem_copy(a, host.data(), bytes, CopyKind::kHostToDevice);
    ops_->mem_copy(b, a, bytes, CopyKind::kDeviceToDevice);
    ops_->synchronize();
    ops_->mem_copy(back.data(), b, bytes, CopyKind::kDeviceToHost);
    EXPECT_EQ(host, back) << bytes;
    ops_->mem_set(b, 0xA5, bytes);
    ops_->mem_copy(back.data(), b, bytes, CopyKind::kDeviceToHost);
    EXPECT_EQ(back, std::vector<unsigned char>(bytes, 0xA5)) << bytes;
    ops_->mem_free(a);
    ops_->mem_free(b);
  }
  // mem_discard (optional): the range is unspecified after, writable again,
  // and nothing outside it changes (here: a range covering whole pages,
  // starting and ending inside pages).
  if (ops_->mem_discard) {
    const size_t bytes = 5 * 4096 + 100, lo = 1000, hi = 3 * 4096 + 7;
    std::vector<unsigned char> host(bytes), back(bytes);
    for (size_t i = 0; i < bytes; ++i) host[i] = (unsigned char)(i * 13 + 5);
    void* a = ops_->mem_alloc(bytes);
    ops_->mem_copy(a, host.data(), bytes, CopyKind::kHostToDevice);
    ops_->mem_discard(static_cast<char*>(a) + lo, hi - lo);
    ops_->mem_copy(back.data(), a, bytes, CopyKind::kDeviceToHost);
    for (size_t i = 0; i < bytes; ++i)
      if (i < lo || i >= hi) ASSERT_EQ(back[i], host[i]) << "byte " << i << " outside the discarded range";
    ops_->mem_set(static_cast<char*>(a) + lo, 0x3C, hi - lo);
    ops_->mem_copy(back.data(), a, bytes, CopyKind::kDeviceToHost);
    for (size_t i = lo; i < hi; ++i) ASSERT_EQ(back[i], 0x3C) << "byte " << i;
    ops_->mem_free(a);
  }
  EXPECT_EQ(ops_->mem_alloc(0), nullptr);
  ops_->mem_free(nullptr);
}

TEST_P(Parity, Gemm) {
  Rng rng(1);
  struct S { int64_t M, N, K; };
  for (S s : {S{1, 1, 1}, S{5, 37, 33}, S{67, 24, 64}, S{33, 67, 5}, S{130, 17, 129}})
    for (Trans ta : {Trans::kNo, Trans::kYes})
      for (Trans tb : {Trans::kNo, Trans::kYes})
        for (float beta : {0.f, 0.5f}) {
          int64_t lda = (ta == Trans::kNo ? s.K : s.M) + 3, ldb = (tb == Trans::kNo ? s.N : s.K) + 1;
          int64_t arows = ta == Trans::kNo ? s.M : s.K, brows = tb == Trans::kNo ? s.K : s.N;
          int64_t ldc = s.N + 2;
          Vec A = Randn(arows * lda, rng), B = Randn(brows * ldb, rng), C = Randn(s.M * ldc, rng);
          Vec Cr = C;
          ops_->gemm(ta, tb, s.M, s.N, s.K, 0.75f, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
          ref_.gemm(ta, tb, s.M, s.N, s.K, 0.75f, A.data(), lda, B.data(), ldb, beta, Cr.data(), ldc);
          ExpectClose(C, Cr, 1e-4, 1e-4 * std::sqrt((double)s.K),
                      "gemm M" + std::to_string(s.M) + " N" + std::to_string(s.N) + " K" +
                          std::to_string(s.K) + " ta" + std::to_string((int)ta) + " tb" +
                          std::to_string((int)tb));
        }
}

TEST_P(Parity, Rmsnorm) {
  Rng rng(2);
  for (int64_t N : {1, 5, 33})
    for (int64_t C : {8, 37, 64, 200}) {
      Vec x = Randn(N * C, rng), w = Randn(C, rng), out(N * C), rstd(N), out_r(N * C), rstd_r(N);
      ops_->rmsnorm_fwd(x.data(), w.data(), 1e-5f, N, C, out.data(), rstd.data());
      ref_.rmsnorm_fwd(x.data(), w.data(), 1e-5f, N, C, out_r.data(), rstd_r.data());
      std::string tag = " N" + std::to_string(N) + " C" + std::to_string(C);
      ExpectClose(out, out_r, 1e-5, 1e-6, "rmsnorm_fwd out" + tag);
      ExpectClose(rstd, rstd_r, 1e-5, 0, "rmsnorm_fwd rstd" + tag);
      Vec g = Randn(N * C, rng), dx = Randn(N * C, rng), dw = Randn(C, rng);
      Vec dx_r = dx, dw_r = dw;
      ops_->rmsnorm_bwd(g.data(), x.data(), w.data(), rstd_r.data(), N, C, dx.data(), dw.data());
      ref_.rmsnorm_bwd(g.data(), x.data(), w.data(), rstd_r.data(), N, C, dx_r.data(), dw_r.data());
      ExpectClose(dx, dx_r, 1e-5, 1e-5, "rmsnorm_bwd dx" + tag);
      ExpectClose(dw, dw_r, 1e-5, 1e-5 * std::sqrt((double)N), "rmsnorm_bwd dw" + tag);
    }
}

TEST_P(Parity, Rope) {
  Rng rng(3);
  const int max_pos = 80;
  for (auto [D, stride] : std::vector<std::pair<int, int>>{{8, 8}, {16, 16}, {24, 24}, {64, 64}, {8, 20}, {16, 32}}) {
    Vec cos_t(max_pos * D / 2), sin_t(max_pos * D / 2);
    for (int p = 0; p < max_pos; ++p)
      for (int i = 0; i < D / 2; ++i) {
        double a = p * std::pow(10000.0, -2.0 * i / D);
        cos_t[p * D / 2 + i] = (float)std::cos(a);
        sin_t[p * D / 2 + i] = (float)std::sin(a);
      }
    for (int64_t N : {1, 5, 33})
      for (bool inverse : {false, true}) {
        const int H = 3;
        std::vector<int32_t> pos(N);
        for (auto& p : pos) p = (int32_t)rng.Below(max_pos);
        Vec x = Randn(N * H * stride, rng), xr = x;  // dims past D must stay as they are
        ops_->rope(x.data(), N, H, D, stride, pos.data(), cos_t.data(), sin_t.data(), inverse);
        ref_.rope(xr.data(), N, H, D, stride, pos.data(), cos_t.data(), sin_t.data(), inverse);
        ExpectClose(x, xr, 1e-5, 1e-6, "rope D" + std::to_string(D) + " stride" + std::to_string(stride) + " N" + std::to_string(N));
      }
  }
}

TEST_P(Parity, Swiglu) {
  Rng rng(4);
  std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1}, {1, 37}, {1, 130}, {1, 3072}, {5, 37}, {3, 4099}, {33, 24}, {2, 1}, {7, 130}};
  for (int r = 0; r < 6; ++r) {  // random N (1 included) with ragged F
    const int64_t Fs[] = {1, 37, 130, 515};
    shapes.push_back({1 + (int64_t)rng.Below(r == 0 ? 1 : 9), Fs[rng.Below(4)]});
  }
  for (auto [N, F] : shapes) {
    Vec gu = Randn(N * 2 * F, rng, 4.f), dout = Randn(N * F, rng);
    for (int64_t n = 0; n < N; ++n)  // up half at unit scale, as before
      for (int64_t f = 0; f < F; ++f) gu[n * 2 * F + F + f] *= 0.25f;
    gu[0] = 30.f;
    if (F > 1) gu[1] = -30.f;
    Vec out(N * F, -7.f), out_r(N * F), dgu(N * 2 * F, -7.f), dgu_r(N * 2 * F);
    ops_->swiglu_fwd(gu.data(), N, F, out.data());
    ref_.swiglu_fwd(gu.data(), N, F, out_r.data());
    ops_->swiglu_bwd(dout.data(), gu.data(), N, F, dgu.data());
    ref_.swiglu_bwd(dout.data(), gu.data(), N, F, dgu_r.data());
    std::string tag = " N" + std::to_string(N) + " F" + std::to_string(F);
    ExpectClose(out, out_r, 1e-5, 1e-6, "swiglu_fwd" + tag);
    ExpectClose(dgu, dgu_r, 1e-5, 1e-6, "swiglu_bwd dgu" + tag);
  }
}

TEST_P(Parity, SoftmaxXent) {
  Rng rng(5);
  for (int64_t V : {1, 37, 1000, 50257}) {
    const int64_t N = V > 1000 ? 2 : 5;
    Vec logits = Randn(N * V, rng, 3.f);
    std::vector<int32_t> tgt(N);
    for (auto& t : tgt) t = (int32_t)rng.Below(V);
    tgt[N - 1] = -1;  // ignored row
    Vec loss(N), loss_r(N), d(N * V), d_r(N * V);
    ops_->softmax_xent(logits.data(), tgt.data(), N, V, 0.5f, loss.data(), d.data());
    ref_.softmax_xent(logits.data(), tgt.data(), N, V, 0.5f, loss_r.data(), d_r.data());
    std::string tag = " V" + std::to_string(V);
    ExpectClose(loss, loss_r, 1e-5, 1e-5, "softmax_xent loss" + tag);
    ExpectClose(d, d_r, 1e-4, 1e-7, "softmax_xent dlogits" + tag);
    EXPECT_EQ(loss[N - 1], 0.f);
    // In place (dlogits aliases logits) and without a gradient.
    Vec inplace = logits, loss2(N), loss3(N);
    ops_->softmax_xent(inplace.data(), tgt.data(), N, V, 0.5f, loss2.data(), inplace.data());
    ExpectClose(inplace, d_r, 1e-4, 1e-7, "softmax_xent in place" + tag);
    ExpectClose(loss2, loss_r, 1e-5, 1e-5, "softmax_xent in place loss" + tag);
    ops_->softmax_xent(logits.data(), tgt.data(), N, V, 0.5f, loss3.data(), nullptr);
    ExpectClose(loss3, loss_r, 1e-5, 1e-5, "softmax_xent no grad" + tag);
  }
}

struct AttnCase {
  int B, Tq, Tk, H, Hkv, D;
  bool causal;
};
const AttnCase kAttnCases[] = {
    {2, 33, 33, 4, 4, 16, true}, {1, 67, 67, 4, 2, 24, true}, {2, 5, 37, 6, 1, 8, true},
    {1, 1, 67, 4, 2, 64, true},  {2, 33, 33, 4, 2, 64, false}, {1, 130, 130, 2, 1, 32, true},
    {1, 1, 1, 4, 4, 16, true},   {1, 7, 70, 4, 4, 24, false},
    // Few query rows per kv head (the SIMD backends' decode path): causal
    // with Tq > 1, several key tiles, GQA.
    {1, 3, 40, 4, 2, 32, true},  {2, 2, 130, 6, 2, 16, true},
    // Head dims that are not multiples of 8 (transpose and padding edges).
    {1, 9, 21, 2, 1, 12, true},  {2, 1, 50, 4, 2, 20, true},  {1, 70, 70, 2, 2, 36, false},
};

struct AttnData {
  AttentionParams p;
  Vec q, k, v, out, lse;
  AttnData(const AttnCase& c, Rng& rng) {
    p.B = c.B, p.Tq = c.Tq, p.Tk = c.Tk, p.H = c.H, p.Hkv = c.Hkv, p.D = c.D;
    p.scale = 1.f / std::sqrt((float)c.D);
    p.causal = c.causal;
    p.q_batch_stride = (int64_t)c.Tq * c.H * c.D + 3;  // padded batch strides
    p.kv_batch_stride = (int64_t)c.Tk * c.Hkv * c.D + 5;
    p.out_batch_stride = (int64_t)c.Tq * c.H * c.D + 7;
    q = Randn(c.B * p.q_batch_stride, rng, 1.5f);
    k = Randn(c.B * p.kv_batch_stride, rng, 1.5f);
    v = Randn(c.B * p.kv_batch_stride, rng);
    out.assign(c.B * p.out_batch_stride, 0.f);
    lse.assign((size_t)c.B * c.H * c.Tq, 0.f);
    p.q = q.data(), p.k = k.data(), p.v = v.data(), p.out = out.data(), p.lse = lse.data();
  }
  std::string Tag(const AttnCase& c) const {
    char buf[128];
    std::snprintf(buf, sizeof buf, " B%d Tq%d Tk%d H%d Hkv%d D%d causal%d", c.B, c.Tq, c.Tk, c.H,
                  c.Hkv, c.D, c.causal);
    return buf;
  }
};

// Only the elements that belong to the tensor (not the batch padding).
Vec Unpad(const Vec& x, int B, int64_t stride, int64_t used) {
  Vec r;
  for (int b = 0; b < B; ++b) r.insert(r.end(), x.begin() + b * stride, x.begin() + b * stride + used);
  return r;
}

TEST_P(Parity, AttentionForward) {
  Rng rng(6);
  for (const AttnCase& c : kAttnCases) {
    AttnData a(c, rng);
    Vec out_r(a.out.size()), lse_r(a.lse.size());
    AttentionParams pr = a.p;
    pr.out = out_r.data(), pr.lse = lse_r.data();
    ref_.attention_fwd(pr);
    ops_->attention_fwd(a.p);
    int64_t used = (int64_t)c.Tq * c.H * c.D;
    ExpectClose(Unpad(a.out, c.B, a.p.out_batch_stride, used), Unpad(out_r, c.B, a.p.out_batch_stride, used),
                1e-4, 1e-5, "attention_fwd out" + a.Tag(c));
    ExpectClose(a.lse, lse_r, 1e-5, 1e-5, "attention_fwd lse" + a.Tag(c));
    // lse may be null in the forward.
    AttentionParams pn = a.p;
    Vec out2(a.out.size());
    pn.out = out2.data(), pn.lse = nullptr;
    ops_->attention_fwd(pn);
    ExpectClose(Unpad(out2, c.B, a.p.out_batch_stride, used), Unpad(out_r, c.B, a.p.out_batch_stride, used),
                1e-4, 1e-5, "attention_fwd (lse null)" + a.Tag(c));
  }
}

// The ring-attention merge: two attention results over disjoint key
// blocks merge into the attention over their union (checked against the
// oracle's merge and, end to end, against attention over all the keys).
TEST_P(Parity, AttentionMerge) {
  Rng rng(41);
  for (auto [B, rows, H, D, Tl] : std::vector<std::array<int, 5>>{{1, 1, 1, 4, 1}, {2, 5, 3, 16, 9}, {3, 33, 4, 64, 40}}) {
    const int64_t obs = (int64_t)Tl * H * D + 5;  // out batch stride (padded)
    Vec out = Randn(B * obs, rng), lse = Randn(B * H * Tl, rng), ob = Randn((int64_t)B * rows * H * D, rng);
    Vec lb = Randn((int64_t)B * H * rows, rng);
    lb[0] = -INFINITY;  // a row with no visible key stays as it is
    Vec out_r = out, lse_r = lse;
    const int row0 = Tl - rows;
    ops_->attention_merge(out.data() + row0 * H * D, obs, lse.data() + row0, Tl, ob.data(), lb.data(), B, rows, H, D);
    ref_.attention_merge(out_r.data() + row0 * H * D, obs, lse_r.data() + row0, Tl, ob.data(), lb.data(), B, rows, H,
                         D);
    const std::string what = "attention_merge B" + std::to_string(B) + " rows" + std::to_string(rows);
    ExpectClose(out, out_r, 1e-5, 1e-6, what + " out");
    ExpectClose(lse, lse_r, 1e-6, 1e-6, what + " lse");
  }
  // Attention over keys [0, Tk) = the merge of [0, Tk/2) and [Tk/2, Tk).
  const int Tq = 6, Tk = 14, H = 2, D = 8;
  Vec q = Randn(Tq * H * D, rng), k = Randn(Tk * H * D, rng), v = Randn(Tk * H * D, rng);
  auto attend = [&](int k0, int nk, Vec* o, Vec* l) {
    o->assign(Tq * H * D, 0.f);
    l->assign(H * Tq, 0.f);
    AttentionParams p;
    p.B = 1, p.Tq = Tq, p.Tk = nk, p.H = H, p.Hkv = H, p.D = D, p.scale = 0.3f, p.causal = false;
    p.q_batch_stride = Tq * H * D, p.kv_batch_stride = nk * H * D, p.out_batch_stride = Tq * H * D;
    p.q = q.data(), p.k = k.data() + k0 * H * D, p.v = v.data() + k0 * H * D, p.out = o->data(), p.lse = l->data();
    ref_.attention_fwd(p);
  };
  Vec o_all, l_all, o1, l1, o2, l2;
  attend(0, Tk, &o_all, &l_all);
  attend(0, Tk / 2, &o1, &l1);
  attend(Tk / 2, Tk - Tk / 2, &o2, &l2);
  ops_->attention_merge(o1.data(), 0, l1.data(), Tq, o2.data(), l2.data(), 1, Tq, H, D);
  ExpectClose(o1, o_all, 1e-5, 1e-6, "merged halves = attention over all keys (out)");
  ExpectClose(l1, l_all, 1e-6, 1e-6, "merged halves = attention over all keys (lse)");
}

TEST_P(Parity, AttentionBackward) {
  Rng rng(7);
  for (const AttnCase& c : kAttnCases) {
    AttnData a(c, rng);
    RefOps().attention_fwd(a.p);  // out and lse from the oracle feed both backwards
    Vec dout = Randn(a.out.size(), rng);
    AttentionBackwardParams bp;
    bp.fwd = a.p;
    bp.dout = dout.data();
    Vec dq(a.q.size()), dk(a.k.size()), dv(a.v.size());
    Vec dq_r(a.q.size()), dk_r(a.k.size()), dv_r(a.v.size());
    bp.dq = dq.data(), bp.dk = dk.data(), bp.dv = dv.data();
    ops_->attention_bwd(bp);
    AttentionBackwardParams br = bp;
    br.dq = dq_r.data(), br.dk = dk_r.data(), br.dv = dv_r.data();
    ref_.attention_bwd(br);
    int64_t uq = (int64_t)c.Tq * c.H * c.D, ukv = (int64_t)c.Tk * c.Hkv * c.D;
    double atol = 2e-5 * std::sqrt((double)c.Tq * (c.H / c.Hkv));
    ExpectClose(Unpad(dq, c.B, a.p.q_batch_stride, uq), Unpad(dq_r, c.B, a.p.q_batch_stride, uq), 1e-4,
                atol, "attention_bwd dq" + a.Tag(c));
    ExpectClose(Unpad(dk, c.B, a.p.kv_batch_stride, ukv), Unpad(dk_r, c.B, a.p.kv_batch_stride, ukv),
                1e-4, atol, "attention_bwd dk" + a.Tag(c));
    ExpectClose(Unpad(dv, c.B, a.p.kv_batch_stride, ukv), Unpad(dv_r, c.B, a.p.kv_batch_stride, ukv),
                1e-4, atol, "attention_bwd dv" + a.Tag(c));
  }
}

// Same inputs give the same bits, for any thread count (the kernels use a
// fixed decomposition; BLAS is not involved here).
TEST_P(Parity, AttentionIsDeterministicAcrossThreadCounts) {
  Rng rng(8);
  AttnCase c{2, 67, 67, 4, 2, 32, true};
  AttnData a(c, rng);
  Vec dout = Randn(a.out.size(), rng);
  auto run = [&](int threads, Vec& out, Vec& dq, Vec& dk, Vec& dv) {
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    AttentionParams p = a.p;
    out.assign(a.out.size(), 0.f);
    p.out = out.data();
    ops_->attention_fwd(p);
    AttentionBackwardParams bp;
    bp.fwd = p;
    bp.dout = dout.data();
    dq.assign(a.q.size(), 0.f), dk.assign(a.k.size(), 0.f), dv.assign(a.v.size(), 0.f);
    bp.dq = dq.data(), bp.dk = dk.data(), bp.dv = dv.data();
    ops_->attention_bwd(bp);
    omp_set_num_threads(saved);
  };
  Vec o1, q1, k1, v1, o2, q2, k2, v2;
  run(1, o1, q1, k1, v1);
  run(3, o2, q2, k2, v2);
  EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), o1.size() * 4));
  EXPECT_EQ(0, std::memcmp(q1.data(), q2.data(), q1.size() * 4));
  EXPECT_EQ(0, std::memcmp(k1.data(), k2.data(), k1.size() * 4));
  EXPECT_EQ(0, std::memcmp(v1.data(), v2.data(), v1.size() * 4));
}

// Paged attention: sequences of (new rows n, keys kv_len) over a pool of
// padded blocks (block and token strides larger than the data), block tables
// shuffled over the pool, last blocks partly filled, unused table entries -1.
struct PagedCase {
  int H, Hkv, D, block_tokens;
  std::vector<std::pair<int, int>> seqs;  // (n, kv_len)
};
std::vector<PagedCase> PagedCases() {
  std::vector<PagedCase> c = {
      {4, 2, 16, 16, {{1, 1}, {1, 17}, {1, 40}, {0, 5}, {3, 33}}},  // decode mix, an empty sequence
      {8, 8, 32, 16, {{17, 17}, {9, 50}, {1, 130}}},                 // prefill chunks, no GQA
      {6, 2, 24, 5, {{20, 70}, {2, 2}, {1, 64}}},                    // odd block size, group 3
      {8, 1, 12, 7, {{1, 3}, {2, 100}, {70, 70}}},                   // group 8, D not a multiple of 8
      {12, 2, 8, 16, {{1, 65}, {33, 129}}},                          // group 6
      {2, 1, 20, 3, {{5, 9}, {1, 1}}},
      {4, 4, 64, 16, {}},                                            // batch-16 decode, ragged lengths
  };
  for (int i = 0; i < 16; ++i) c.back().seqs.push_back({1, 90 + 13 * i});
  return c;
}

struct PagedData {
  PagedAttentionParams p;
  std::vector<int32_t> q_start, kv_len, blocks;
  Vec q, k, v, out;
  PagedData(const PagedCase& c, Rng& rng) {
    const int n_seq = (int)c.seqs.size(), bt = c.block_tokens;
    int max_blocks = 0, need = 0;
    q_start.push_back(0);
    for (auto [n, kv] : c.seqs) {
      q_start.push_back(q_start.back() + n);
      kv_len.push_back(kv);
      max_blocks = std::max(max_blocks, (kv + bt - 1) / bt + 2);
      need += (kv + bt - 1) / bt;
    }
    const int num_blocks = need + 3;
    std::vector<int32_t> ids(num_blocks);
    for (int i = 0; i < num_blocks; ++i) ids[i] = i;
    for (int i = num_blocks - 1; i > 0; --i) std::swap(ids[i], ids[rng.Below(i + 1)]);
    blocks.assign((size_t)n_seq * max_blocks, -1);
    for (int s = 0, next = 0; s < n_seq; ++s)
      for (int i = 0; i < (kv_len[s] + bt - 1) / bt; ++i) blocks[(size_t)s * max_blocks + i] = ids[next++];
    p.n_seq = n_seq, p.H = c.H, p.Hkv = c.Hkv, p.D = c.D;
    p.scale = 1.f / std::sqrt((float)c.D);
    p.max_blocks = max_blocks, p.block_tokens = bt, p.num_blocks = num_blocks;
    p.token_stride = (int64_t)c.Hkv * c.D + 3;
    p.block_stride = bt * p.token_stride + 11;
    q = Randn((size_t)q_start.back() * c.H * c.D, rng, 1.5f);
    k = Randn(num_blocks * p.block_stride, rng, 1.5f);
    v = Randn(num_blocks * p.block_stride, rng);
    out.assign(q.size(), NAN);
    p.q_start = q_start.data(), p.kv_len = kv_len.data(), p.blocks = blocks.data();
    p.q = q.data(), p.k = k.data(), p.v = v.data(), p.out = out.data();
  }
  std::string Tag(const PagedCase& c) const {
    std::string t = " H" + std::to_string(c.H) + " Hkv" + std::to_string(c.Hkv) + " D" + std::to_string(c.D) +
                    " bt" + std::to_string(c.block_tokens) + " seqs";
    for (auto [n, kv] : c.seqs) t += " " + std::to_string(n) + "/" + std::to_string(kv);
    return t;
  }
};

// The backend's paged_attention on a's case against the oracle's.
void ExpectPagedMatchesRef(const BackendOps& ops, const BackendOps& ref, PagedData& a, const std::string& what) {
  Vec out_r(a.out.size(), NAN);
  PagedAttentionParams pr = a.p;
  pr.out = out_r.data();
  ref.paged_attention(pr);
  ops.paged_attention(a.p);
  ExpectClose(a.out, out_r, 1e-4, 1e-5, what);
}

TEST_P(Parity, PagedAttention) {
  Rng rng(14);
  for (const PagedCase& c : PagedCases()) {
    PagedData a(c, rng);
    ExpectPagedMatchesRef(*ops_, ref_, a, "paged_attention" + a.Tag(c));
  }
}

// Sparse mode (DSA): each row attends to its own ascending selection of
// earlier keys, -1 padded (some rows empty, some with every key); against
// the oracle, and a selection of all keys against the dense mode.
TEST_P(Parity, PagedAttentionSparse) {
  Rng rng(16);
  for (const PagedCase& c : PagedCases()) {
    PagedData a(c, rng);
    const int K = 7;
    std::vector<int32_t> sel((size_t)a.q_start.back() * K, -1);
    for (size_t s = 0; s + 1 < a.q_start.size(); ++s) {
      const int n = a.q_start[s + 1] - a.q_start[s];
      for (int i = 0; i < n; ++i) {
        const int pos = a.kv_len[s] - n + i, r = a.q_start[s] + i;
        const int want = (r % 5 == 4) ? 0 : std::min(K, pos + 1);  // every fifth row selects nothing
        std::vector<int32_t> keys;
        for (int t = 0; t <= pos; ++t) keys.push_back(t);
        for (int j = (int)keys.size() - 1; j > 0; --j) std::swap(keys[j], keys[rng.Below(j + 1)]);
        keys.resize(want);
        std::sort(keys.begin(), keys.end());
        std::copy(keys.begin(), keys.end(), sel.begin() + (size_t)r * K);
      }
    }
    a.p.sel = sel.data(), a.p.sel_k = K;
    ExpectPagedMatchesRef(*ops_, ref_, a, "paged_attention sparse" + a.Tag(c));
  }
  // Every key selected = the dense mode.
  const std::vector<PagedCase> cases = PagedCases();
  const PagedCase& c = cases.back();
  PagedData a(c, rng);
  int max_kv = 0;
  for (int kv : a.kv_len) max_kv = std::max(max_kv, kv);
  std::vector<int32_t> sel((size_t)a.q_start.back() * max_kv, -1);
  for (size_t s = 0; s + 1 < a.q_start.size(); ++s) {
    const int n = a.q_start[s + 1] - a.q_start[s];
    for (int i = 0; i < n; ++i)
      for (int t = 0; t <= a.kv_len[s] - n + i; ++t) sel[(size_t)(a.q_start[s] + i) * max_kv + t] = t;
  }
  Vec dense(a.out.size(), NAN);
  PagedAttentionParams pd = a.p;
  pd.out = dense.data();
  ops_->paged_attention(pd);
  a.p.sel = sel.data(), a.p.sel_k = max_kv;
  ops_->paged_attention(a.p);
  ExpectClose(a.out, dense, 1e-5, 1e-6, "paged_attention: all keys selected = dense" + a.Tag(c));
}

TEST_P(Parity, PagedAttentionIsDeterministicAcrossThreadCounts) {
  Rng rng(15);
  for (const PagedCase& c : {PagedCases()[1], PagedCases().back()}) {
    PagedData a(c, rng);
    auto run = [&](int threads) {
      int saved = omp_get_max_threads();
      omp_set_num_threads(threads);
      Vec out(a.out.size(), 0.f);
      PagedAttentionParams p = a.p;
      p.out = out.data();
      ops_->paged_attention(p);
      omp_set_num_threads(saved);
      return out;
    };
    Vec o1 = run(1), o3 = run(3);
    EXPECT_EQ(0, std::memcmp(o1.data(), o3.data(), o1.size() * 4)) << a.Tag(c);
  }
}

TEST_P(Parity, AdamW) {
  Rng rng(10);
  for (int64_t n : {1, 37, 4099, 10000})
    for (int64_t step : {1, 7}) {
      Vec param = Randn(n, rng), grad = Randn(n, rng), m = Randn(n, rng, 0.1f), v(n);
      for (auto& x : v) x = rng.Uniform() * 0.01f;
      Vec param_r = param, m_r = m, v_r = v;
      AdamWParams p;
      p.n = n, p.lr = 1e-2f, p.weight_decay = 0.1f, p.step = step, p.grad_scale = 0.5f;
      p.grad = grad.data();
      AdamWParams pr = p;
      p.param = param.data(), p.m = m.data(), p.v = v.data();
      pr.param = param_r.data(), pr.m = m_r.data(), pr.v = v_r.data();
      ops_->adamw(p);
      ref_.adamw(pr);
      std::string tag = " n" + std::to_string(n) + " step" + std::to_string(step);
      ExpectClose(param, param_r, 1e-5, 1e-6, "adamw param" + tag);
      ExpectClose(m, m_r, 1e-5, 1e-7, "adamw m" + tag);
      ExpectClose(v, v_r, 1e-5, 1e-9, "adamw v" + tag);
    }
}

TEST_P(Parity, Sumsq) {
  Rng rng(11);
  for (int64_t n : {0, 1, 37, 100003}) {
    Vec x = Randn(n, rng);
    double got = ops_->sumsq(x.data(), n), want = ref_.sumsq(x.data(), n);
    EXPECT_NEAR(got, want, 1e-12 * (1 + want)) << "sumsq n" << n;
  }
}

// Random fp16 bits: normals in about [2^-6, 2^5], a few subnormals and zeros.
std::vector<uint16_t> RandomHalves(size_t n, Rng& rng) {
  std::vector<uint16_t> h(n);
  for (size_t i = 0; i < n; ++i) {
    uint16_t sign = (uint16_t)(rng.Below(2) << 15), mant = (uint16_t)rng.Below(1024);
    uint16_t exp = (uint16_t)(9 + rng.Below(11));
    if (i % 17 == 3) exp = 0;  // subnormal or zero
    h[i] = (uint16_t)(sign | (exp << 10) | mant);
  }
  return h;
}

// Rows of x from 1 (batch-1 decode) through kSkinnyRows (a batch's decode
// tokens: the tiled kernels and their row tails) to above it (prefill: the
// blocked GEMM, fp16 and int8 weights converted to fp32 by tiles).
TEST_P(Parity, Gemv) {
  Rng rng(12);
  for (int64_t rows : {1, 2, 3, 7, 16, 32, 33, 70})
    for (int64_t out : {1, 37, 67})
      for (int64_t in : {5, 37, 64, 771}) {
        std::string tag = " rows" + std::to_string(rows) + " out" + std::to_string(out) + " in" + std::to_string(in);
        Vec W = Randn(out * in, rng), x = Randn(rows * in, rng), y(rows * out), y_r(rows * out);
        double atol = 1e-5 * std::sqrt((double)in);
        ops_->gemv_f32(W.data(), x.data(), rows, out, in, y.data());
        ref_.gemv_f32(W.data(), x.data(), rows, out, in, y_r.data());
        ExpectClose(y, y_r, 1e-5, atol, "gemv_f32" + tag);
        auto Wh = RandomHalves(out * in, rng);
        ops_->gemv_f16(Wh.data(), x.data(), rows, out, in, y.data());
        ref_.gemv_f16(Wh.data(), x.data(), rows, out, in, y_r.data());
        ExpectClose(y, y_r, 1e-5, 8 * atol, "gemv_f16" + tag);
        std::vector<int8_t> Wq(out * in);
        for (auto& q : Wq) q = (int8_t)((int)rng.Below(255) - 127);
        Vec scale(out);
        for (auto& s : scale) s = 0.001f + rng.Uniform() * 0.01f;
        ops_->gemv_q8(Wq.data(), scale.data(), x.data(), rows, out, in, y.data());
        ref_.gemv_q8(Wq.data(), scale.data(), x.data(), rows, out, in, y_r.data());
        ExpectClose(y, y_r, 1e-5, rows > kSkinnyRows ? 0.1 * atol : 1e-6, "gemv_q8" + tag);
      }
  // All-zero x gives zeros, not NaN.
  std::vector<int8_t> Wq(3 * 40, 5);
  Vec scale(3, 1.f), x(40, 0.f), y(3, 7.f);
  ops_->gemv_q8(Wq.data(), scale.data(), x.data(), 1, 3, 40, y.data());
  for (float v : y) EXPECT_EQ(v, 0.f);
}

// Up to kSkinnyRows, each row's result is its own GEMV's, bit for bit,
// whatever the rows around it (greedy decode gives the same tokens batched).
TEST_P(Parity, GemvRowsAreBatchInvariant) {
  Rng rng(14);
  const int64_t out = 45, in = 203;
  Vec W = Randn(out * in, rng);
  auto Wh = RandomHalves(out * in, rng);
  std::vector<int8_t> Wq(out * in);
  for (auto& q : Wq) q = (int8_t)((int)rng.Below(255) - 127);
  Vec scale(out, 0.004f);
  for (int64_t rows : {2, 3, 5, 16, 31, 32}) {
    Vec x = Randn(rows * in, rng), y(rows * out), y1(out);
    for (int fmt = 0; fmt < 3; ++fmt) {
      auto run = [&](const float* xs, int64_t n, float* ys) {
        if (fmt == 0) ops_->gemv_f32(W.data(), xs, n, out, in, ys);
        if (fmt == 1) ops_->gemv_f16(Wh.data(), xs, n, out, in, ys);
        if (fmt == 2) ops_->gemv_q8(Wq.data(), scale.data(), xs, n, out, in, ys);
      };
      run(x.data(), rows, y.data());
      for (int64_t m = 0; m < rows; ++m) {
        run(x.data() + m * in, 1, y1.data());
        EXPECT_EQ(0, std::memcmp(y1.data(), y.data() + m * out, out * 4))
            << "format " << fmt << " rows " << rows << " row " << m;
      }
    }
  }
}

// The reductions of the other ops use fixed decompositions too.
TEST_P(Parity, ReductionsAreDeterministicAcrossThreadCounts) {
  Rng rng(13);
  const int64_t N = 37, C = 301, V = 1037, n = 200003;
  Vec x = Randn(N * C, rng), w = Randn(C, rng), g = Randn(N * C, rng), rstd(N), out(N * C);
  Vec logits = Randn(N * V, rng, 3.f), big = Randn(n, rng);
  std::vector<int32_t> tgt(N, 5);
  std::vector<int8_t> Wq(N * C, 3);
  Vec scale(N, 0.5f);
  ops_->rmsnorm_fwd(x.data(), w.data(), 1e-5f, N, C, out.data(), rstd.data());
  struct Result { Vec dx, dw, loss, dl, y; double ss; };
  auto run = [&](int threads) {
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    Result r{Vec(N * C, 0.f), Vec(C, 0.f), Vec(N), Vec(N * V), Vec(N), 0.0};
    ops_->rmsnorm_bwd(g.data(), x.data(), w.data(), rstd.data(), N, C, r.dx.data(), r.dw.data());
    ops_->softmax_xent(logits.data(), tgt.data(), N, V, 1.f, r.loss.data(), r.dl.data());
    ops_->gemv_q8(Wq.data(), scale.data(), x.data(), 1, N, C, r.y.data());
    r.ss = ops_->sumsq(big.data(), n);
    omp_set_num_threads(saved);
    return r;
  };
  Result a = run(1), b = run(3);
  EXPECT_EQ(0, std::memcmp(a.dx.data(), b.dx.data(), a.dx.size() * 4));
  EXPECT_EQ(0, std::memcmp(a.dw.data(), b.dw.data(), a.dw.size() * 4));
  EXPECT_EQ(0, std::memcmp(a.loss.data(), b.loss.data(), a.loss.size() * 4));
  EXPECT_EQ(0, std::memcmp(a.dl.data(), b.dl.data(), a.dl.size() * 4));
  EXPECT_EQ(0, std::memcmp(a.y.data(), b.y.data(), a.y.size() * 4));
  EXPECT_EQ(a.ss, b.ss);
}

INSTANTIATE_TEST_SUITE_P(Cpu, Parity, ::testing::Values("scalar", "avx2", "avx512"),
                         [](const auto& info) { return info.param; });

// ---------------------------------------------------------------------------
// The oracles against independent checks.

// dL/dx of L = sum(f(x) * R) by central differences, at a few coordinates.
template <typename Fn>
void CheckGradient(Vec& x, const Vec& analytic, Fn loss, Rng& rng, int samples, float h,
                   double rtol, double atol, const std::string& what) {
  for (int s = 0; s < samples; ++s) {
    size_t i = rng.Below(x.size());
    float saved = x[i];
    x[i] = saved + h;
    double lp = loss();
    x[i] = saved - h;
    double lm = loss();
    x[i] = saved;
    double fd = (lp - lm) / (2.0 * h);
    EXPECT_NEAR(analytic[i], fd, atol + rtol * std::fabs(fd)) << what << " at " << i;
  }
}

double Dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (double)a[i] * b[i];
  return s;
}

TEST(RefOracle, AttentionBackwardMatchesFiniteDifferences) {
  Rng rng(20);
  for (const AttnCase& c : {AttnCase{1, 5, 7, 4, 2, 8, true}, AttnCase{2, 1, 6, 2, 1, 8, true},
                            AttnCase{1, 4, 4, 2, 2, 8, false}}) {
    AttnData a(c, rng);
    Vec R = Randn(a.out.size(), rng);
    auto loss = [&] {
      RefOps().attention_fwd(a.p);
      return Dot(a.out, R);
    };
    loss();
    AttentionBackwardParams bp;
    bp.fwd = a.p;
    bp.dout = R.data();
    Vec dq(a.q.size()), dk(a.k.size()), dv(a.v.size());
    bp.dq = dq.data(), bp.dk = dk.data(), bp.dv = dv.data();
    RefOps().attention_bwd(bp);
    std::string tag = a.Tag(c);
    CheckGradient(a.q, dq, loss, rng, 20, 1e-2f, 1e-2, 2e-3, "ref attention dq" + tag);
    CheckGradient(a.k, dk, loss, rng, 20, 1e-2f, 1e-2, 2e-3, "ref attention dk" + tag);
    CheckGradient(a.v, dv, loss, rng, 20, 1e-2f, 1e-2, 2e-3, "ref attention dv" + tag);
  }
}

// The paged oracle against the dense one on each sequence's gathered cache.
TEST(RefOracle, PagedAttentionMatchesDenseOnTheGatheredCache) {
  Rng rng(25);
  for (const PagedCase& c : PagedCases()) {
    PagedData a(c, rng);
    RefOps().paged_attention(a.p);
    const int64_t kvd = (int64_t)c.Hkv * c.D, qd = (int64_t)c.H * c.D;
    for (int s = 0; s < a.p.n_seq; ++s) {
      const int n = a.q_start[s + 1] - a.q_start[s], Tk = a.kv_len[s];
      if (n == 0) continue;
      Vec kg(Tk * kvd), vg(Tk * kvd), out(n * qd);
      for (int t = 0; t < Tk; ++t) {
        const int64_t off = a.blocks[(size_t)s * a.p.max_blocks + t / c.block_tokens] * a.p.block_stride +
                            (t % c.block_tokens) * a.p.token_stride;
        std::memcpy(&kg[t * kvd], &a.k[off], kvd * 4);
        std::memcpy(&vg[t * kvd], &a.v[off], kvd * 4);
      }
      AttentionParams d;
      d.B = 1, d.Tq = n, d.Tk = Tk, d.H = c.H, d.Hkv = c.Hkv, d.D = c.D, d.scale = a.p.scale, d.causal = true;
      d.q_batch_stride = n * qd, d.kv_batch_stride = Tk * kvd, d.out_batch_stride = n * qd;
      d.q = a.q.data() + a.q_start[s] * qd, d.k = kg.data(), d.v = vg.data(), d.out = out.data();
      RefOps().attention_fwd(d);
      ExpectClose(a.out.data() + a.q_start[s] * qd, out.data(), out.size(), 1e-6, 1e-7,
                  "ref paged vs dense, seq " + std::to_string(s) + a.Tag(c));
    }
  }
}

TEST(RefOracle, RmsnormBackwardMatchesFiniteDifferences) {
  Rng rng(21);
  const int64_t N = 3, C = 37;
  Vec x = Randn(N * C, rng), w = Randn(C, rng), R = Randn(N * C, rng), out(N * C), rstd(N);
  auto loss = [&] {
    RefOps().rmsnorm_fwd(x.data(), w.data(), 1e-5f, N, C, out.data(), rstd.data());
    return Dot(out, R);
  };
  loss();
  Vec dx(N * C, 0.f), dw(C, 0.f);
  RefOps().rmsnorm_bwd(R.data(), x.data(), w.data(), rstd.data(), N, C, dx.data(), dw.data());
  CheckGradient(x, dx, loss, rng, 30, 1e-2f, 1e-2, 2e-3, "ref rmsnorm dx");
  CheckGradient(w, dw, loss, rng, 20, 1e-2f, 1e-2, 2e-3, "ref rmsnorm dw");
}

TEST(RefOracle, SwigluBackwardMatchesFiniteDifferences) {
  Rng rng(22);
  const int64_t N = 4, F = 9;
  Vec gu = Randn(N * 2 * F, rng, 2.f), R = Randn(N * F, rng), out(N * F);
  auto loss = [&] {
    RefOps().swiglu_fwd(gu.data(), N, F, out.data());
    return Dot(out, R);
  };
  Vec dgu(N * 2 * F);
  RefOps().swiglu_bwd(R.data(), gu.data(), N, F, dgu.data());
  CheckGradient(gu, dgu, loss, rng, 40, 1e-2f, 1e-2, 1e-3, "ref swiglu dgu");
}

TEST(RefOracle, SoftmaxXentGradientMatchesFiniteDifferences) {
  Rng rng(23);
  const int64_t N = 3, V = 11;
  const float gs = 0.5f;
  Vec logits = Randn(N * V, rng, 2.f), losses(N), d(N * V);
  std::vector<int32_t> tgt = {3, -1, 10};
  auto loss = [&] {
    RefOps().softmax_xent(logits.data(), tgt.data(), N, V, gs, losses.data(), nullptr);
    return gs * ((double)losses[0] + losses[1] + losses[2]);
  };
  RefOps().softmax_xent(logits.data(), tgt.data(), N, V, gs, losses.data(), d.data());
  // The closed form on one row too: loss = logsumexp - logit[target].
  double mx = -1e30, sum = 0;
  for (int j = 0; j < V; ++j) mx = std::max(mx, (double)logits[j]);
  for (int j = 0; j < V; ++j) sum += std::exp(logits[j] - mx);
  EXPECT_NEAR(losses[0], mx + std::log(sum) - logits[3], 1e-5);
  EXPECT_EQ(losses[1], 0.f);
  CheckGradient(logits, d, loss, rng, 30, 1e-2f, 1e-2, 1e-3, "ref softmax_xent dlogits");
}

// q8 against the dequantised float product: the only error is x's rounding,
// at most sx/2 per element.
TEST(RefOracle, GemvQ8IsCloseToDequantisedProduct) {
  Rng rng(24);
  const int64_t out = 9, in = 301;
  std::vector<int8_t> Wq(out * in);
  for (auto& q : Wq) q = (int8_t)((int)rng.Below(255) - 127);
  Vec scale(out), x = Randn(in, rng), y(out);
  for (auto& s : scale) s = 0.01f;
  RefOps().gemv_q8(Wq.data(), scale.data(), x.data(), 1, out, in, y.data());
  double amax = 0;
  for (float v : x) amax = std::max(amax, (double)std::fabs(v));
  for (int64_t o = 0; o < out; ++o) {
    double exact = 0, bound = 0;
    for (int64_t i = 0; i < in; ++i) {
      exact += (double)Wq[o * in + i] * scale[o] * x[i];
      bound += std::fabs((double)Wq[o * in + i] * scale[o]) * amax / 127 / 2;
    }
    EXPECT_NEAR(y[o], exact, bound + 1e-5) << "row " << o;
  }
}

}  // namespace myriad::parity

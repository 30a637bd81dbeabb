// Golden test of DSA (src/backend/cpu/dsa/dsa.h): an independent PyTorch reference
// (tests/golden/dsa_reference.py, float64, written from the header's math)
// dumps inputs and every output of a few ragged cases; cpu::dsa::IndexerTopK,
// SparseAttention, SparseAttentionBackward and IndexerLoss must match them:
// idx exactly, everything else within 1e-4 of the tensor's scale
// (max |a - ref| / max |ref|). With K >= Tk sparse attention must equal the
// reference's dense causal attention and Myriad's own ops::Attention.
//
// Every case runs twice: with contiguous batches and with batch strides
// padded by 5 floats (the pads must stay untouched). Outputs are pre-filled
// with NaN (idx with a sentinel) so that an element an op should write but
// does not shows up.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "backend/cpu/dsa/dsa.h"
#include "ops/ops.h"

namespace myriad {
namespace {

namespace dsa = cpu::dsa;

constexpr double kTol = 1e-4;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int32_t kIdxSentinel = -12345;

std::string SourceDir() {
  const char* s = std::getenv("MYRIAD_SOURCE_DIR");
  return s ? s : ".";
}

// max|a-b| / max|b|; a NaN in `a` makes it infinite.
double RelErr(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(a[i])) return std::numeric_limits<double>::infinity();
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return den > 0 ? num / den : num;
}

// The reference's dump, made once per process (cached by the script's
// contents under the test temp dir, so concurrent test processes and reruns
// share it; a changed script gets a new file).
struct Dump {
  std::unique_ptr<SafetensorsFile> file;
  std::string skip;   // non-empty: why the test cannot run here
  std::string error;  // non-empty: the reference failed
};

const Dump& GetDump() {
  static Dump d = [] {
    Dump r;
    const std::string script = SourceDir() + "/tests/golden/dsa_reference.py";
    std::ifstream in(script, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in) {
      r.error = "cannot read " + script;
      return r;
    }
    const std::string key = std::to_string(std::hash<std::string>{}(ss.str()));
    const std::string root = ::testing::TempDir() + "/dsa_golden";
    std::filesystem::create_directories(root);
    const std::string cached = root + "/dsa_golden_" + key + ".safetensors";
    if (!std::filesystem::exists(cached)) {
      if (access("/usr/bin/python3", X_OK) != 0) {
        r.skip = "/usr/bin/python3 is missing";
      } else if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
        r.skip = "/usr/bin/python3 cannot import torch (apt-get install python3-torch)";
      }
      if (!r.skip.empty()) {
        std::fprintf(stderr,
                     "\n*** WARNING: DSA golden test NOT RUN: %s. The DSA ops are then checked only "
                     "against their own scalar references. ***\n\n",
                     r.skip.c_str());
        return r;
      }
      const std::string dir = root + "/run_" + std::to_string(getpid());
      std::filesystem::create_directories(dir);
      const std::string cmd = "/usr/bin/python3 " + script + " --out " + dir + " > " + dir +
                              "/reference.log 2>&1";
      if (std::system(cmd.c_str()) != 0) {
        r.error = "reference failed: " + cmd + " (see " + dir + "/reference.log)";
        return r;
      }
      std::error_code ec;
      std::filesystem::rename(dir + "/dsa_golden.safetensors", cached, ec);  // atomic
      if (ec && !std::filesystem::exists(cached)) {
        r.error = "cannot move the dump to " + cached + ": " + ec.message();
        return r;
      }
      std::filesystem::remove_all(dir, ec);  // the dump is in the cache now
    }
    auto f = SafetensorsFile::Open(cached);
    if (!f.ok()) {
      r.error = f.status().message();
      return r;
    }
    r.file = std::make_unique<SafetensorsFile>(std::move(f).value());
    return r;
  }();
  return d;
}

template <typename T>
std::vector<T> Get(const SafetensorsFile& f, const std::string& name, const char* dtype,
                   int64_t numel) {
  const TensorView* t = f.Find(name);
  EXPECT_NE(t, nullptr) << "dump lacks " << name;
  if (!t) return {};
  EXPECT_EQ(t->dtype, dtype) << name;
  EXPECT_EQ(static_cast<int64_t>(t->nbytes / sizeof(T)), numel) << name;
  if (t->dtype != dtype || static_cast<int64_t>(t->nbytes / sizeof(T)) != numel) return {};
  std::vector<T> v(numel);
  std::memcpy(v.data(), t->data, t->nbytes);
  return v;
}

// A [B, per] tensor laid out with batch stride per + pad; pads hold `fill`.
template <typename T>
struct Strided {
  int B = 0;
  int64_t per = 0, stride = 0;
  std::vector<T> buf;
  Strided(int B_, int64_t per_, int pad, T fill) : B(B_), per(per_), stride(per_ + pad) {
    buf.assign(static_cast<size_t>(B) * stride, fill);
  }
  static Strided From(const std::vector<T>& src, int B, int64_t per, int pad, T fill) {
    Strided s(B, per, pad, fill);
    for (int b = 0; b < B; ++b)
      std::copy(src.begin() + b * per, src.begin() + (b + 1) * per, s.buf.begin() + b * s.stride);
    return s;
  }
  std::vector<T> Dense() const {
    std::vector<T> v(static_cast<size_t>(B) * per);
    for (int b = 0; b < B; ++b)
      std::copy(buf.begin() + b * stride, buf.begin() + b * stride + per, v.begin() + b * per);
    return v;
  }
  // True when every pad still holds `fill` (NaN compared as NaN).
  bool PadsIntact(T fill) const {
    for (int b = 0; b < B; ++b)
      for (int64_t i = b * stride + per; i < (b + 1) * stride; ++i) {
        const T x = buf[i];
        if constexpr (std::is_floating_point_v<T>) {
          if (std::isnan(fill) ? !std::isnan(x) : x != fill) return false;
        } else if (x != fill) {
          return false;
        }
      }
    return true;
  }
  T* data() { return buf.data(); }
};

struct Case {
  std::string name;
  int B, Tq, Tk, H, Hkv, D, Hi, Di, K;
  float scale;
};

Case ReadCase(const SafetensorsFile& f, const std::string& name) {
  Case c{};
  c.name = name;
  auto dims = Get<int32_t>(f, name + "/dims", "I32", 9);
  auto scale = Get<float>(f, name + "/scale", "F32", 1);
  if (dims.size() != 9 || scale.size() != 1) return c;
  c.B = dims[0], c.Tq = dims[1], c.Tk = dims[2], c.H = dims[3], c.Hkv = dims[4];
  c.D = dims[5], c.Hi = dims[6], c.Di = dims[7], c.K = dims[8];
  c.scale = scale[0];
  return c;
}

class DsaGolden : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(DsaGolden, MatchesPyTorchReference) {
  const Dump& dump = GetDump();
  if (!dump.skip.empty()) GTEST_SKIP() << "DSA golden test NOT RUN: " << dump.skip;
  ASSERT_TRUE(dump.error.empty()) << dump.error;
  const SafetensorsFile& f = *dump.file;
  const auto& [name, pad] = GetParam();
  const Case c = ReadCase(f, name);
  ASSERT_GT(c.B, 0) << name;
  const int B = c.B;
  const int64_t nq = int64_t{c.Tq} * c.H * c.D, nkv = int64_t{c.Tk} * c.Hkv * c.D;
  const int64_t nqi = int64_t{c.Tq} * c.Hi * c.Di, nki = int64_t{c.Tk} * c.Di;
  const int64_t nwi = int64_t{c.Tq} * c.Hi, nidx = int64_t{c.Tq} * c.K, nlse = int64_t{B} * c.H * c.Tq;
  auto F = [&](const char* n, int64_t per) { return Get<float>(f, name + "/" + n, "F32", B * per); };
  const auto q = F("q", nq), k = F("k", nkv), v = F("v", nkv), dout = F("dout", nq);
  const auto qi = F("qi", nqi), ki = F("ki", nki), wi = F("wi", nwi);
  const auto ref_idx = Get<int32_t>(f, name + "/idx", "I32", B * nidx);
  const auto ref_out = F("out", nq), ref_dq = F("dq", nq), ref_dk = F("dk", nkv), ref_dv = F("dv", nkv);
  const auto ref_lse = Get<float>(f, name + "/lse", "F32", nlse);
  const auto ref_dqi = F("dqi", nqi), ref_dki = F("dki", nki), ref_dwi = F("dwi", nwi);
  const auto ref_loss = Get<double>(f, name + "/loss", "F64", 1);
  ASSERT_FALSE(::testing::Test::HasFailure()) << "malformed dump for " << name;

  auto sq = Strided<float>::From(q, B, nq, pad, kNaN), sk = Strided<float>::From(k, B, nkv, pad, kNaN);
  auto sv = Strided<float>::From(v, B, nkv, pad, kNaN), sdout = Strided<float>::From(dout, B, nq, pad, kNaN);
  auto sqi = Strided<float>::From(qi, B, nqi, pad, kNaN), ski = Strided<float>::From(ki, B, nki, pad, kNaN);
  auto swi = Strided<float>::From(wi, B, nwi, pad, kNaN);

  // 1. Indexer + top-k: exactly the reference's selection.
  Strided<int32_t> sidx(B, nidx, pad, kIdxSentinel);
  dsa::IndexerParams ip;
  ip.B = B, ip.Tq = c.Tq, ip.Tk = c.Tk, ip.Hi = c.Hi, ip.Di = c.Di, ip.K = c.K;
  ip.qi_batch_stride = sqi.stride, ip.ki_batch_stride = ski.stride;
  ip.wi_batch_stride = swi.stride, ip.idx_batch_stride = sidx.stride;
  ip.qi = sqi.data(), ip.ki = ski.data(), ip.wi = swi.data(), ip.idx = sidx.data();
  dsa::IndexerTopK(ip);
  EXPECT_TRUE(sidx.PadsIntact(kIdxSentinel)) << name << ": IndexerTopK wrote into the batch padding";
  const auto idx = sidx.Dense();
  int mismatches = 0;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < c.Tq; ++t) {
      const int32_t* got = idx.data() + (int64_t{b} * c.Tq + t) * c.K;
      const int32_t* want = ref_idx.data() + (int64_t{b} * c.Tq + t) * c.K;
      if (!std::equal(got, got + c.K, want) && ++mismatches <= 3) {
        std::string g, w;
        for (int j = 0; j < c.K; ++j) g += std::to_string(got[j]) + " ", w += std::to_string(want[j]) + " ";
        ADD_FAILURE() << name << ": idx[" << b << ", " << t << "] = " << g << "\n  reference: " << w;
      }
    }
  EXPECT_EQ(mismatches, 0) << name << ": queries whose selection differs";

  // 2. Sparse attention forward over the reference's selection.
  auto sref_idx = Strided<int32_t>::From(ref_idx, B, nidx, pad, kIdxSentinel);
  Strided<float> sout(B, nq, pad, kNaN);
  std::vector<float> lse(nlse, kNaN);
  dsa::SparseAttentionParams ap;
  ap.B = B, ap.Tq = c.Tq, ap.Tk = c.Tk, ap.H = c.H, ap.Hkv = c.Hkv, ap.D = c.D, ap.K = c.K;
  ap.scale = c.scale;
  ap.q_batch_stride = sq.stride, ap.kv_batch_stride = sk.stride, ap.out_batch_stride = sout.stride;
  ap.idx_batch_stride = sref_idx.stride;
  ap.q = sq.data(), ap.k = sk.data(), ap.v = sv.data(), ap.idx = sref_idx.data();
  ap.out = sout.data(), ap.lse = lse.data();
  dsa::SparseAttention(ap);
  EXPECT_TRUE(sout.PadsIntact(kNaN)) << name << ": SparseAttention wrote into the batch padding";
  const auto out = sout.Dense();
  EXPECT_LE(RelErr(out.data(), ref_out.data(), B * nq), kTol) << name << ": out";
  EXPECT_LE(RelErr(lse.data(), ref_lse.data(), nlse), kTol) << name << ": lse";

  // Without lse (may be null): the same out.
  {
    Strided<float> sout2(B, nq, pad, kNaN);
    dsa::SparseAttentionParams ap2 = ap;
    ap2.out = sout2.data(), ap2.lse = nullptr;
    dsa::SparseAttention(ap2);
    const auto out2 = sout2.Dense();
    EXPECT_LE(RelErr(out2.data(), ref_out.data(), B * nq), kTol) << name << ": out with lse = null";
  }

  // 3. Backward, from the forward's own out and lse.
  Strided<float> sdq(B, nq, pad, kNaN), sdk(B, nkv, pad, kNaN), sdv(B, nkv, pad, kNaN);
  dsa::SparseAttentionBackwardParams bp;
  bp.fwd = ap;
  bp.dout = sdout.data(), bp.dq = sdq.data(), bp.dk = sdk.data(), bp.dv = sdv.data();
  dsa::SparseAttentionBackward(bp);
  EXPECT_TRUE(sdq.PadsIntact(kNaN) && sdk.PadsIntact(kNaN) && sdv.PadsIntact(kNaN))
      << name << ": SparseAttentionBackward wrote into the batch padding";
  const auto dq = sdq.Dense(), dk = sdk.Dense(), dv = sdv.Dense();
  EXPECT_LE(RelErr(dq.data(), ref_dq.data(), B * nq), kTol) << name << ": dq";
  EXPECT_LE(RelErr(dk.data(), ref_dk.data(), B * nkv), kTol) << name << ": dk (every element written)";
  EXPECT_LE(RelErr(dv.data(), ref_dv.data(), B * nkv), kTol) << name << ": dv (every element written)";

  // 4. Indexer loss and its gradients, on the reference's lse.
  Strided<float> sdqi(B, nqi, pad, kNaN), sdki(B, nki, pad, kNaN), sdwi(B, nwi, pad, kNaN);
  dsa::IndexerLossParams lp;
  lp.indexer = ip;
  lp.indexer.idx = sref_idx.data();
  lp.indexer.idx_batch_stride = sref_idx.stride;
  lp.attn = ap;
  lp.attn.out = nullptr;
  std::vector<float> lse_in = ref_lse;
  lp.attn.lse = lse_in.data();
  lp.dqi = sdqi.data(), lp.dki = sdki.data(), lp.dwi = sdwi.data();
  lp.grad_scale = 1.f;
  const double loss = dsa::IndexerLoss(lp);
  EXPECT_NEAR(loss, ref_loss[0], kTol * std::fabs(ref_loss[0]) + 1e-9) << name << ": indexer loss";
  EXPECT_TRUE(sdqi.PadsIntact(kNaN) && sdki.PadsIntact(kNaN) && sdwi.PadsIntact(kNaN))
      << name << ": IndexerLoss wrote into the batch padding";
  const auto dqi = sdqi.Dense(), dki = sdki.Dense(), dwi = sdwi.Dense();
  EXPECT_LE(RelErr(dqi.data(), ref_dqi.data(), B * nqi), kTol) << name << ": dqi";
  EXPECT_LE(RelErr(dki.data(), ref_dki.data(), B * nki), kTol) << name << ": dki";
  EXPECT_LE(RelErr(dwi.data(), ref_dwi.data(), B * nwi), kTol) << name << ": dwi";

  // Loss only (null gradients): the same loss. grad_scale scales the gradients.
  {
    dsa::IndexerLossParams lp0 = lp;
    lp0.dqi = lp0.dki = lp0.dwi = nullptr;
    EXPECT_NEAR(dsa::IndexerLoss(lp0), loss, 1e-6 * std::fabs(loss) + 1e-12) << name << ": loss only";
    Strided<float> s2qi(B, nqi, pad, kNaN), s2ki(B, nki, pad, kNaN), s2wi(B, nwi, pad, kNaN);
    dsa::IndexerLossParams lp2 = lp;
    lp2.dqi = s2qi.data(), lp2.dki = s2ki.data(), lp2.dwi = s2wi.data();
    lp2.grad_scale = 0.25f;
    dsa::IndexerLoss(lp2);
    auto scaled = [](std::vector<float> x) {
      for (auto& e : x) e *= 4.f;
      return x;
    };
    EXPECT_LE(RelErr(scaled(s2qi.Dense()).data(), dqi.data(), B * nqi), 1e-5) << name << ": grad_scale dqi";
    EXPECT_LE(RelErr(scaled(s2ki.Dense()).data(), dki.data(), B * nki), 1e-5) << name << ": grad_scale dki";
    EXPECT_LE(RelErr(scaled(s2wi.Dense()).data(), dwi.data(), B * nwi), 1e-5) << name << ": grad_scale dwi";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, DsaGolden,
                         ::testing::Combine(::testing::Values("prefill_k5", "prefill_k16", "prefill_k64",
                                                              "decode_k16", "chunk_k16", "ties_k8"),
                                            ::testing::Values(0, 5)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_padded" : "");
                         });

// K >= Tk: sparse attention is dense causal attention -- the reference's,
// computed from the causal mask alone, and Myriad's own ops::Attention.
TEST(DsaGoldenDense, SparseWithAllKeysEqualsDense) {
  const Dump& dump = GetDump();
  if (!dump.skip.empty()) GTEST_SKIP() << "DSA golden test NOT RUN: " << dump.skip;
  ASSERT_TRUE(dump.error.empty()) << dump.error;
  const SafetensorsFile& f = *dump.file;
  const std::string name = "prefill_k64";
  const Case c = ReadCase(f, name);
  ASSERT_GT(c.B, 0);
  ASSERT_GE(c.K, c.Tk);
  ASSERT_EQ(c.Tq, c.Tk);
  const int B = c.B;
  const int64_t nq = int64_t{c.Tq} * c.H * c.D, nkv = int64_t{c.Tk} * c.Hkv * c.D;
  const int64_t nlse = int64_t{B} * c.H * c.Tq;
  auto q = Get<float>(f, name + "/q", "F32", B * nq), k = Get<float>(f, name + "/k", "F32", B * nkv);
  auto v = Get<float>(f, name + "/v", "F32", B * nkv);
  auto qi = Get<float>(f, name + "/qi", "F32", B * int64_t{c.Tq} * c.Hi * c.Di);
  auto ki = Get<float>(f, name + "/ki", "F32", B * int64_t{c.Tk} * c.Di);
  auto wi = Get<float>(f, name + "/wi", "F32", B * int64_t{c.Tq} * c.Hi);
  const auto dense_out = Get<float>(f, name + "/dense_out", "F32", B * nq);
  const auto dense_lse = Get<float>(f, name + "/dense_lse", "F32", nlse);
  ASSERT_FALSE(::testing::Test::HasFailure());

  // Myriad's own selection (every visible key, -1 pads) feeds the attention.
  std::vector<int32_t> idx(B * int64_t{c.Tq} * c.K, kIdxSentinel);
  dsa::IndexerParams ip;
  ip.B = B, ip.Tq = c.Tq, ip.Tk = c.Tk, ip.Hi = c.Hi, ip.Di = c.Di, ip.K = c.K;
  ip.qi_batch_stride = int64_t{c.Tq} * c.Hi * c.Di, ip.ki_batch_stride = int64_t{c.Tk} * c.Di;
  ip.wi_batch_stride = int64_t{c.Tq} * c.Hi, ip.idx_batch_stride = int64_t{c.Tq} * c.K;
  ip.qi = qi.data(), ip.ki = ki.data(), ip.wi = wi.data(), ip.idx = idx.data();
  dsa::IndexerTopK(ip);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < c.Tq; ++t)
      for (int j = 0; j < c.K; ++j)
        ASSERT_EQ(idx[(int64_t{b} * c.Tq + t) * c.K + j], j <= t ? j : -1) << b << "," << t << "," << j;

  std::vector<float> out(B * nq, kNaN), lse(nlse, kNaN);
  dsa::SparseAttentionParams ap;
  ap.B = B, ap.Tq = c.Tq, ap.Tk = c.Tk, ap.H = c.H, ap.Hkv = c.Hkv, ap.D = c.D, ap.K = c.K;
  ap.scale = c.scale;
  ap.q_batch_stride = nq, ap.kv_batch_stride = nkv, ap.out_batch_stride = nq;
  ap.idx_batch_stride = int64_t{c.Tq} * c.K;
  ap.q = q.data(), ap.k = k.data(), ap.v = v.data(), ap.idx = idx.data();
  ap.out = out.data(), ap.lse = lse.data();
  dsa::SparseAttention(ap);
  EXPECT_LE(RelErr(out.data(), dense_out.data(), B * nq), kTol) << "sparse vs PyTorch dense: out";
  EXPECT_LE(RelErr(lse.data(), dense_lse.data(), nlse), kTol) << "sparse vs PyTorch dense: lse";

  std::vector<float> mout(B * nq, kNaN), mlse(nlse, kNaN);
  AttentionParams dp;
  dp.B = B, dp.Tq = c.Tq, dp.Tk = c.Tk, dp.H = c.H, dp.Hkv = c.Hkv, dp.D = c.D;
  dp.scale = c.scale, dp.causal = true;
  dp.q_batch_stride = nq, dp.kv_batch_stride = nkv, dp.out_batch_stride = nq;
  dp.q = q.data(), dp.k = k.data(), dp.v = v.data(), dp.out = mout.data(), dp.lse = mlse.data();
  ops::Attention(dp);
  EXPECT_LE(RelErr(mout.data(), dense_out.data(), B * nq), kTol) << "ops::Attention vs PyTorch dense";
  EXPECT_LE(RelErr(out.data(), mout.data(), B * nq), kTol) << "sparse vs ops::Attention: out";
  EXPECT_LE(RelErr(lse.data(), mlse.data(), nlse), kTol) << "sparse vs ops::Attention: lse";
}

}  // namespace
}  // namespace myriad

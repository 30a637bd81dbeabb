// Kernel timing and the fits of the calibration.
#include "plan/calibrate.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include <sys/mman.h>

#include "core/check.h"
#include "core/rng.h"
#include "core/timing.h"
#include "ops/ops.h"

namespace myriad::plan {

std::pair<double, double> FitTwo(const std::vector<double>& x1, const std::vector<double>& x2,
                                 const std::vector<double>& t, double* max_rel_err) {
  CHECK(x1.size() == t.size() && x2.size() == t.size() && t.size() >= 2);
  double a11 = 0, a12 = 0, a22 = 0, b1 = 0, b2 = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const double w = 1 / (t[i] * t[i]);
    a11 += w * x1[i] * x1[i], a12 += w * x1[i] * x2[i], a22 += w * x2[i] * x2[i];
    b1 += w * x1[i] * t[i], b2 += w * x2[i] * t[i];
  }
  const double det = a11 * a22 - a12 * a12;
  double p1 = det != 0 ? (b1 * a22 - b2 * a12) / det : 0, p2 = det != 0 ? (a11 * b2 - a12 * b1) / det : 0;
  if (p2 < 0) p2 = 0, p1 = b1 / a11;  // no negative latency
  if (p1 < 0) p1 = 0, p2 = b2 / a22;
  if (max_rel_err) {
    *max_rel_err = 0;
    for (size_t i = 0; i < t.size(); ++i)
      *max_rel_err = std::max(*max_rel_err, std::abs(x1[i] * p1 + x2[i] * p2 - t[i]) / t[i]);
  }
  return {p1, p2};
}

nlohmann::json Calibration::ToJson() const {
  return {{"threads", threads},
          {"gemm_gflops", gemm_flops / 1e9},
          {"gemm_overhead_us", gemm_overhead_s * 1e6},
          {"gemm_fit_max_rel_err", gemm_fit_err},
          {"attention_gflops", attention_flops / 1e9},
          {"memory_gbs", memory_bw / 1e9},
          {"page_touch_gbs", page_touch_bw / 1e9},
          {"comm_gbs", comm_bandwidth / 1e9},
          {"allreduce_eff", allreduce_eff},
          {"allgather_eff", allgather_eff},
          {"alltoall_eff", alltoall_eff},
          {"comm_latency_us", comm_latency * 1e6},
          {"comm_fit_max_rel_err", comm_fit_err},
          {"comm_ranks", comm_ranks}};
}

namespace {

// An element-wise kernel over ~48 MB: SwiGLU reads 2F and writes F floats per row.
double MeasureStreamBandwidth(Rng* rng) {
  const int64_t N = 4096, F = 1024;
  std::vector<float> gu(N * 2 * F), h(N * F);
  for (auto& x : gu) x = rng->Uniform() - 0.5f;
  const double te = BestSeconds(5, [&] { ops::SwiGlu(gu.data(), N, F, h.data()); });
  return 3.0 * N * F * sizeof(float) / te;
}

// First touch of freshly mapped pages (what memory returned to the OS and
// used again costs): map 64 MB, write one byte per 4 KB page, unmap.
double MeasurePageTouch() {
  const size_t n = size_t{64} << 20;
  const double t = BestSeconds(3, [&] {
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    auto* c = static_cast<volatile char*>(p);
    for (size_t i = 0; i < n; i += 4096) c[i] = 1;
    munmap(p, n);
  });
  return static_cast<double>(n) / t;
}

}  // namespace

void MeasureKernels(const JobDesc& job, int64_t tokens, Calibration* cal) {
  const ModelConfig& m = job.model;
  const int64_t C = m.d_model, hd = m.head_dim(), H = m.n_heads, Hkv = m.n_kv_heads;
  // The GEMM shapes of one layer pass and the head, at the full, half and
  // quarter token counts (data, context and pipeline splits) and with the
  // widths halved (tensor parallelism).
  std::set<std::tuple<int64_t, int64_t, int64_t>> shapes;
  for (int64_t split : {1, 2, 4}) {
    const int64_t M = std::max<int64_t>(1, tokens / split);
    for (int64_t tp : {1, 2}) {
      shapes.insert({M, (H + 2 * Hkv) * hd / tp, C});
      shapes.insert({M, C, H * hd / tp});
      if (m.has_dense_layers()) {
        shapes.insert({M, 2 * m.d_ff / tp, C});
        shapes.insert({M, C, m.d_ff / tp});
      }
      if (m.n_routed_experts > 0) {
        const int64_t per_expert = std::max<int64_t>(1, M * m.top_k / m.n_routed_experts);
        shapes.insert({per_expert, 2 * m.d_expert / tp, C});
        shapes.insert({per_expert, C, m.d_expert / tp});
        shapes.insert({M, m.n_routed_experts, C});
      }
      shapes.insert({M, m.vocab_size / tp, C});
    }
  }
  std::vector<double> flops, secs;
  Rng rng(7);
  for (auto [M, N, K] : shapes) {
    std::vector<float> A(M * K), B(K * N), Cm(M * N);
    for (auto& v : A) v = rng.Uniform() - 0.5f;
    for (auto& v : B) v = rng.Uniform() - 0.5f;
    const double f = 2.0 * M * N * K;
    const int reps = std::clamp<int>(static_cast<int>(2e9 / std::max(f, 1.0)), 3, 50);
    const double t = BestSeconds(reps, [&] {
      ops::Gemm(Trans::kNo, Trans::kYes, M, N, K, 1.f, A.data(), K, B.data(), K, 0.f, Cm.data(), N);
    });
    flops.push_back(f);
    secs.push_back(t);
  }
  // The cost model's GEMM is a roofline plus a fixed cost per call: the
  // rate from the compute-bound shapes (median), the fixed cost from what
  // the small ones take beyond the roofline (median, never negative).
  const double bw_probe = MeasureStreamBandwidth(&rng);
  cal->memory_bw = bw_probe;
  cal->page_touch_bw = MeasurePageTouch();
  std::vector<double> rates, extra;
  size_t i = 0;
  for (auto [M, N, K] : shapes) {
    const double bytes = 4.0 * (M * K + K * N + M * N);
    if (flops[i] / bytes > 16) rates.push_back(flops[i] / secs[i]);
    ++i;
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  cal->gemm_flops = median(rates);
  if (!(cal->gemm_flops > 0)) {  // a model too small for any compute-bound GEMM: the fastest rate seen
    for (size_t k = 0; k < flops.size(); ++k) cal->gemm_flops = std::max(cal->gemm_flops, flops[k] / secs[k]);
  }
  auto roof = [&](size_t k, int64_t M, int64_t N, int64_t K) {
    return std::max(flops[k] / cal->gemm_flops, 4.0 * (M * K + K * N + M * N) / bw_probe);
  };
  i = 0;
  for (auto [M, N, K] : shapes) extra.push_back(secs[i] - roof(i, M, N, K)), ++i;
  cal->gemm_overhead_s = std::max(0.0, median(extra));
  cal->gemm_fit_err = 0;
  i = 0;
  for (auto [M, N, K] : shapes) {
    cal->gemm_fit_err = std::max(cal->gemm_fit_err, std::abs(roof(i, M, N, K) + cal->gemm_overhead_s - secs[i]) / secs[i]);
    ++i;
  }

  // Causal attention forward + backward on one micro-batch's sequences.
  const int B = static_cast<int>(std::max<int64_t>(1, tokens / job.seq_len)), T = static_cast<int>(job.seq_len);
  const int64_t q_n = int64_t{B} * T * H * hd, kv_n = int64_t{B} * T * Hkv * hd;
  std::vector<float> q(q_n), k(kv_n), v(kv_n), out(q_n), lse(int64_t{B} * H * T), dout(q_n), dq(q_n), dk(kv_n), dv(kv_n);
  for (auto* buf : {&q, &k, &v, &dout})
    for (auto& x : *buf) x = rng.Uniform() - 0.5f;
  AttentionParams p;
  p.B = B, p.Tq = T, p.Tk = T, p.H = static_cast<int>(H), p.Hkv = static_cast<int>(Hkv), p.D = static_cast<int>(hd);
  p.scale = 1.f / std::sqrt(static_cast<float>(hd));
  p.q_batch_stride = int64_t{T} * H * hd, p.kv_batch_stride = int64_t{T} * Hkv * hd, p.out_batch_stride = p.q_batch_stride;
  p.q = q.data(), p.k = k.data(), p.v = v.data(), p.out = out.data(), p.lse = lse.data();
  AttentionBackwardParams bp;
  bp.fwd = p, bp.dout = dout.data(), bp.dq = dq.data(), bp.dk = dk.data(), bp.dv = dv.data();
  const double tf = BestSeconds(3, [&] { ops::Attention(p); });
  const double tb = BestSeconds(3, [&] { ops::AttentionBackward(bp); });
  const double core = 4.0 * B * (double(T) * (T + 1) / 2) * H * hd;  // the cost model's forward count
  cal->attention_flops = 3.5 * core / (tf + tb);

}

void FitComm(const std::vector<CommSample>& samples, int ranks, Calibration* cal) {
  // The cost model's terms for g ranks on one tier, per collective: each
  // sample is t = x / beta_op + y * alpha, fitted op by op; the link's
  // bandwidth is send/recv's, the others are fractions of it.
  const double g = ranks;
  std::map<std::string, std::vector<double>> xs, ys, ts;
  for (const auto& s : samples) {
    double xb = 0, ya = 0;
    if (s.op == "allreduce") xb = 2 * (g - 1) / g * s.bytes, ya = 2 * (g - 1);
    else if (s.op == "allgather" || s.op == "alltoall") xb = (g - 1) / g * s.bytes, ya = g - 1;
    else if (s.op == "sendrecv") xb = s.bytes, ya = 1;
    else continue;
    xs[s.op].push_back(xb), ys[s.op].push_back(ya), ts[s.op].push_back(s.seconds);
  }
  std::map<std::string, double> beta;
  double latency = 0, worst = 0;
  int fits = 0;
  for (auto& [op, t] : ts) {
    if (t.size() < 2) continue;
    double err = 0;
    const auto [inv_beta, alpha] = FitTwo(xs[op], ys[op], t, &err);
    beta[op] = inv_beta > 0 ? 1 / inv_beta : 1e12;
    latency += alpha, ++fits;
    worst = std::max(worst, err);
  }
  if (!fits) return;
  cal->comm_bandwidth = beta.count("sendrecv") ? beta["sendrecv"] : beta.begin()->second;
  auto eff = [&](const char* op) { return beta.count(op) ? beta[op] / cal->comm_bandwidth : 1.0; };
  cal->allreduce_eff = eff("allreduce"), cal->allgather_eff = eff("allgather"), cal->alltoall_eff = eff("alltoall");
  cal->comm_latency = latency / fits;
  cal->comm_fit_err = worst;
  cal->comm_ranks = ranks;
}

// What expert parallelism over `ep` ranks costs for that load: each MoE
// layer waits for its busiest rank (contiguous ranges of experts), so the
// factor is the mean over layers of max(rank's tokens) / mean.
double EpImbalance(const std::vector<std::vector<double>>& load, int64_t ep) {
  if (ep <= 1 || load.empty()) return 1.0;
  double sum = 0;
  int layers = 0;
  for (const auto& layer : load) {
    const int64_t E = static_cast<int64_t>(layer.size());
    if (E == 0 || E % ep) continue;
    double total = 0, worst = 0;
    for (int64_t r = 0; r < ep; ++r) {
      double part = 0;
      for (int64_t e = r * (E / ep); e < (r + 1) * (E / ep); ++e) part += layer[e];
      worst = std::max(worst, part);
      total += part;
    }
    if (total <= 0) continue;
    sum += worst / (total / static_cast<double>(ep));
    ++layers;
  }
  return layers ? sum / layers : 1.0;
}

ClusterDesc CalibratedCluster(const Calibration& cal, int64_t devices) {
  ClusterDesc c;
  c.name = "this machine (calibrated)";
  c.devices = devices;
  DeviceDesc& d = c.device;
  d.name = std::to_string(cal.threads) + "-thread rank";
  d.peak_flops = d.peak_flops_fp32 = cal.gemm_flops;  // Myriad trains in fp32 here
  d.gemm_efficiency = 1;
  d.attention_efficiency = std::min(1.0, cal.attention_flops / cal.gemm_flops);
  d.memory_bw = cal.memory_bw;
  d.memory_efficiency = 1;
  d.memory_bytes = 1e12;
  d.usable_memory = 1;
  d.gemm_overhead_s = cal.gemm_overhead_s;
  d.page_touch_bw = cal.page_touch_bw;
  d.comm_on_cores = true;  // one rank per core: MPI's copies and sums take compute time
  // (reduce_bw stays 0: the all-reduce's fitted bandwidth includes its sums.)
  TierDesc t{"node", devices, cal.comm_bandwidth > 0 ? cal.comm_bandwidth : 1e10, cal.comm_latency};
  t.allreduce_eff = cal.allreduce_eff, t.allgather_eff = cal.allgather_eff, t.alltoall_eff = cal.alltoall_eff;
  c.tiers = {t};
  return c;
}

}  // namespace myriad::plan

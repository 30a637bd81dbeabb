#include "train/supervise/health.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "backend/backend.h"
#include "core/rng.h"
#include "core/strings.h"
#include "core/timing.h"
#include "ops/ops.h"

namespace myriad::supervise {
namespace {


// Keeps the first failure; later checks still run for their figures.
void Fail(HealthReport* r, const std::string& why) {
  if (r->failure.empty()) r->failure = why;
}

std::vector<float> Randn(size_t n, Rng& rng, float scale = 1.f) {
  std::vector<float> v(n);
  for (auto& x : v) x = scale * rng.Normal();
  return v;
}

// ---------------------------------------------------------------- GEMM ----

struct GemmCase {
  int64_t M, N, K;
  bool ta, tb;
  float alpha, beta;
  int64_t pad;  // added to every leading dimension
};

std::string Describe(const GemmCase& c, const std::string& precision) {
  return StrFormat("%s, %c%c M=%lld N=%lld K=%lld", precision.c_str(), c.ta ? 'T' : 'N', c.tb ? 'T' : 'N',
             (long long)c.M, (long long)c.N, (long long)c.K);
}

// Ragged shapes: odd sizes around SIMD widths and tile edges, a GEMV-like
// row and column, all four Trans combinations, alpha and beta not 1 and 0,
// padded leading dimensions.
constexpr GemmCase kRaggedGemms[] = {
    {37, 53, 71, false, false, 0.75f, -0.5f, 3},
    {64, 17, 129, false, true, 0.75f, -0.5f, 1},
    {5, 96, 33, true, false, 0.75f, -0.5f, 2},
    {70, 41, 150, true, true, 0.75f, -0.5f, 5},
    {1, 67, 45, false, true, 1.f, 0.f, 0},
    {33, 1, 80, true, false, 1.f, 1.f, 4},
};

struct GemmBuffers {
  std::vector<float> A, B, C;
  int64_t lda, ldb, ldc;
};

GemmBuffers MakeGemm(const GemmCase& c, Rng& rng) {
  GemmBuffers g;
  const int64_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int64_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  g.lda = a_cols + c.pad, g.ldb = b_cols + c.pad, g.ldc = c.N + c.pad;
  g.A = Randn(static_cast<size_t>(a_rows * g.lda), rng);
  g.B = Randn(static_cast<size_t>(b_rows * g.ldb), rng);
  // beta == 0: C is overwritten; a finite non-zero start shows it is not read.
  g.C = c.beta != 0.f ? Randn(static_cast<size_t>(c.M * g.ldc), rng)
                      : std::vector<float>(static_cast<size_t>(c.M * g.ldc), 7.f);
  return g;
}

void RunGemm(const GemmCase& c, const GemmBuffers& g, float* C) {
  ops::Gemm(c.ta ? Trans::kYes : Trans::kNo, c.tb ? Trans::kYes : Trans::kNo, c.M, c.N, c.K, c.alpha,
            g.A.data(), g.lda, g.B.data(), g.ldb, c.beta, C, g.ldc);
}

// The rows of C the reference checks, and those rows of `C` gathered
// contiguously.
std::vector<float> Gather(const float* C, int64_t ldc, int64_t N, const std::vector<int64_t>& rows) {
  std::vector<float> out;
  out.reserve(rows.size() * static_cast<size_t>(N));
  for (int64_t r : rows) out.insert(out.end(), C + r * ldc, C + r * ldc + N);
  return out;
}

// Checks one GEMM's output: finite, then within `tol` of the oracle. Returns
// the normwise error (+inf when non-finite).
double CheckGemm(const GemmCase& c, const GemmBuffers& g, const float* C, const std::vector<int64_t>& rows,
                 const std::string& precision, double tol, HealthReport* r) {
  std::vector<float> got = Gather(C, g.ldc, c.N, rows);
  int64_t bad = -1;
  if (!AllFinite(got.data(), static_cast<int64_t>(got.size()), &bad)) {
    const int64_t row = rows[static_cast<size_t>(bad / c.N)], col = bad % c.N;
    Fail(r, StrFormat("gemm: non-finite output %g at C[%lld,%lld] (%s)", got[static_cast<size_t>(bad)],
                (long long)row, (long long)col, Describe(c, precision).c_str()));
    return std::numeric_limits<double>::infinity();
  }
  std::vector<double> want;
  ReferenceGemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, g.A.data(), g.lda, g.B.data(), g.ldb, c.beta,
                g.C.data(), g.ldc, rows, &want);
  const double err = MaxRelError(got.data(), want.data(), static_cast<int64_t>(got.size()));
  if (!(err <= tol))
    Fail(r, StrFormat("gemm: max relative error %.1e > %.0e (%s)", err, tol, Describe(c, precision).c_str()));
  return err;
}

std::vector<int64_t> AllRows(int64_t M) {
  std::vector<int64_t> rows(static_cast<size_t>(M));
  for (int64_t i = 0; i < M; ++i) rows[static_cast<size_t>(i)] = i;
  return rows;
}

// Every row up to 256; above that the first, the last and 62 seeded ones.
std::vector<int64_t> SquareRows(int64_t n, Rng& rng) {
  if (n <= 256) return AllRows(n);
  std::vector<int64_t> rows = {0, n - 1};
  for (int i = 0; i < 62; ++i) rows.push_back(static_cast<int64_t>(rng.Below(static_cast<uint64_t>(n))));
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

void GemmChecks(const HealthOptions& o, const std::string& precision, double tol, Rng& rng, HealthReport* r) {
  double worst = 0;
  for (const GemmCase& c : kRaggedGemms) {
    GemmBuffers g = MakeGemm(c, rng);
    std::vector<float> C = g.C;
    RunGemm(c, g, C.data());
    worst = std::max(worst, CheckGemm(c, g, C.data(), AllRows(c.M), precision, tol, r));
  }

  // The square product in Linear's layout (x @ W^T), checked, then timed.
  const int64_t n = o.gemm_n;
  const GemmCase sq{n, n, n, false, true, 1.f, 0.f, 0};
  GemmBuffers g = MakeGemm(sq, rng);
  std::vector<float> first = g.C, again = g.C;
  RunGemm(sq, g, first.data());
  worst = std::max(worst, CheckGemm(sq, g, first.data(), SquareRows(n, rng), precision, tol, r));
  r->gemm_max_rel_err = worst;

  const double best = std::max(1e-9, BestSeconds(3, [&] { RunGemm(sq, g, again.data()); }));
  r->gemm_gflops = 2.0 * static_cast<double>(n) * n * n / best / 1e9;

  // Same inputs, same bits (backend.h); a difference is a flaky device.
  int64_t bad = -1;
  if (!AllFinite(again.data(), static_cast<int64_t>(again.size()), &bad)) {
    Fail(r, StrFormat("gemm: non-finite output %g at C[%lld,%lld] in a repeat run (%s)",
                again[static_cast<size_t>(bad)], (long long)(bad / n), (long long)(bad % n),
                Describe(sq, precision).c_str()));
  } else if (std::memcmp(first.data(), again.data(), first.size() * sizeof(float)) != 0) {
    size_t i = 0;
    while (std::memcmp(&first[i], &again[i], sizeof(float)) == 0) ++i;
    Fail(r, StrFormat("gemm: repeat run differs from the first at C[%lld,%lld]: %.9g vs %.9g (%s; results "
                "must be bitwise deterministic)",
                (long long)(i / n), (long long)(i % n), again[i], first[i], Describe(sq, precision).c_str()));
  }

  if (o.min_gflops > 0 && r->gemm_gflops < o.min_gflops)
    Fail(r, StrFormat("throughput: %.3g GFLOP/s < required %.3g GFLOP/s (n=%lld, best of 3; slow device)",
                r->gemm_gflops, o.min_gflops, (long long)n));
}

// ----------------------------------------------------------- Attention ----

struct AttnCase {
  int B, Tq, Tk, H, Hkv, D;
  int64_t q_pad, kv_pad, out_pad;  // added to each batch stride
};

// Training shape, decode against a cache (Tq < Tk) with padded batch
// strides, and one long enough to cross the kernels' 64-row tiles.
constexpr AttnCase kAttnCases[] = {
    {2, 19, 19, 4, 2, 16, 0, 0, 0},
    {2, 3, 21, 6, 2, 32, 5, 7, 3},
    {1, 70, 70, 2, 1, 64, 0, 0, 0},
};

std::string Describe(const AttnCase& c) {
  return StrFormat("B=%d Tq=%d Tk=%d H=%d Hkv=%d D=%d", c.B, c.Tq, c.Tk, c.H, c.Hkv, c.D);
}

// out [B,Tq,H,D] (contiguous, padding dropped) and lse [B,H,Tq] of causal
// softmax(scale q k^T) v in double.
void ReferenceAttention(const AttentionParams& p, std::vector<double>* out, std::vector<double>* lse) {
  out->assign(static_cast<size_t>(p.B) * p.Tq * p.H * p.D, 0.0);
  lse->assign(static_cast<size_t>(p.B) * p.H * p.Tq, 0.0);
  const int group = p.H / p.Hkv, offset = p.Tk - p.Tq;
  std::vector<double> s(static_cast<size_t>(p.Tk));
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h)
      for (int i = 0; i < p.Tq; ++i) {
        const float* q = p.q + b * p.q_batch_stride + (static_cast<int64_t>(i) * p.H + h) * p.D;
        const int last = p.causal ? i + offset : p.Tk - 1;
        double mx = -std::numeric_limits<double>::infinity();
        for (int j = 0; j <= last; ++j) {
          const float* k = p.k + b * p.kv_batch_stride + (static_cast<int64_t>(j) * p.Hkv + h / group) * p.D;
          double dot = 0;
          for (int d = 0; d < p.D; ++d) dot += static_cast<double>(q[d]) * k[d];
          s[static_cast<size_t>(j)] = dot * static_cast<double>(p.scale);
          mx = std::max(mx, s[static_cast<size_t>(j)]);
        }
        double sum = 0;
        for (int j = 0; j <= last; ++j) sum += std::exp(s[static_cast<size_t>(j)] - mx);
        double* o = out->data() + ((static_cast<size_t>(b) * p.Tq + i) * p.H + h) * p.D;
        for (int j = 0; j <= last; ++j) {
          const double w = std::exp(s[static_cast<size_t>(j)] - mx) / sum;
          const float* v = p.v + b * p.kv_batch_stride + (static_cast<int64_t>(j) * p.Hkv + h / group) * p.D;
          for (int d = 0; d < p.D; ++d) o[d] += w * v[d];
        }
        (*lse)[(static_cast<size_t>(b) * p.H + h) * p.Tq + i] = mx + std::log(sum);
      }
}

double CheckOutput(const char* what, const std::vector<float>& got, const std::vector<double>& want,
                   const AttnCase& c, HealthReport* r) {
  int64_t bad = -1;
  if (!AllFinite(got.data(), static_cast<int64_t>(got.size()), &bad)) {
    Fail(r, StrFormat("attention: non-finite %s %g at index %lld of %zu (%s)", what, got[static_cast<size_t>(bad)],
                (long long)bad, got.size(), Describe(c).c_str()));
    return std::numeric_limits<double>::infinity();
  }
  const double err = MaxRelError(got.data(), want.data(), static_cast<int64_t>(got.size()));
  if (!(err <= kAttentionTolerance))
    Fail(r, StrFormat("attention: %s max relative error %.1e > %.0e (%s)", what, err, kAttentionTolerance,
                Describe(c).c_str()));
  return err;
}

void AttentionChecks(Rng& rng, HealthReport* r) {
  double worst = 0;
  for (const AttnCase& c : kAttnCases) {
    AttentionParams p;
    p.B = c.B, p.Tq = c.Tq, p.Tk = c.Tk, p.H = c.H, p.Hkv = c.Hkv, p.D = c.D;
    p.scale = 1.f / std::sqrt(static_cast<float>(c.D));
    p.causal = true;
    const int64_t q_row = static_cast<int64_t>(c.H) * c.D, kv_row = static_cast<int64_t>(c.Hkv) * c.D;
    p.q_batch_stride = c.Tq * q_row + c.q_pad;
    p.kv_batch_stride = c.Tk * kv_row + c.kv_pad;
    p.out_batch_stride = c.Tq * q_row + c.out_pad;
    // Scores of spread ~1.5: peaked enough that the softmax's max and
    // rescaling matter.
    std::vector<float> q = Randn(static_cast<size_t>(c.B * p.q_batch_stride), rng, 1.5f);
    std::vector<float> k = Randn(static_cast<size_t>(c.B * p.kv_batch_stride), rng);
    std::vector<float> v = Randn(static_cast<size_t>(c.B * p.kv_batch_stride), rng);
    std::vector<float> out(static_cast<size_t>(c.B * p.out_batch_stride), 7.f);
    std::vector<float> lse(static_cast<size_t>(c.B) * c.H * c.Tq, 7.f);
    p.q = q.data(), p.k = k.data(), p.v = v.data(), p.out = out.data(), p.lse = lse.data();
    ops::Attention(p);

    std::vector<double> out_ref, lse_ref;
    ReferenceAttention(p, &out_ref, &lse_ref);
    std::vector<float> out_used;
    out_used.reserve(out_ref.size());
    for (int b = 0; b < c.B; ++b)
      out_used.insert(out_used.end(), out.begin() + b * p.out_batch_stride,
                      out.begin() + b * p.out_batch_stride + c.Tq * q_row);
    worst = std::max(worst, CheckOutput("out", out_used, out_ref, c, r));
    worst = std::max(worst, CheckOutput("lse", lse, lse_ref, c, r));
  }
  r->attention_max_rel_err = worst;
}

double Median(std::vector<double> x) {
  const size_t m = x.size() / 2;
  std::nth_element(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(m), x.end());
  const double hi = x[m];
  if (x.size() % 2) return hi;
  return 0.5 * (hi + *std::max_element(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(m)));
}

nlohmann::json Num(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

}  // namespace

bool AllFinite(const float* x, int64_t n, int64_t* first_bad) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) {
      if (first_bad) *first_bad = i;
      return false;
    }
  if (first_bad) *first_bad = -1;
  return true;
}

double MaxRelError(const float* got, const double* want, int64_t n) {
  double scale = 0, err = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    scale = std::max(scale, std::fabs(want[i]));
    err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
  }
  return err / (scale > 0 ? scale : 1.0);
}

void ReferenceGemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
                   const float* A, int64_t lda, const float* B, int64_t ldb, double beta,
                   const float* C0, int64_t ldc, const std::vector<int64_t>& rows,
                   std::vector<double>* want) {
  const std::vector<int64_t> all = rows.empty() ? AllRows(M) : std::vector<int64_t>();
  const std::vector<int64_t>& rs = rows.empty() ? all : rows;
  want->assign(rs.size() * static_cast<size_t>(N), 0.0);
  std::vector<double> a(static_cast<size_t>(K));
  for (size_t ri = 0; ri < rs.size(); ++ri) {
    const int64_t i = rs[ri];
    for (int64_t k = 0; k < K; ++k) a[static_cast<size_t>(k)] = trans_a ? A[k * lda + i] : A[i * lda + k];
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k)
        acc += a[static_cast<size_t>(k)] * (trans_b ? B[j * ldb + k] : B[k * ldb + j]);
      double c = alpha * acc;
      if (beta != 0) c += beta * C0[i * ldc + j];
      (*want)[ri * static_cast<size_t>(N) + static_cast<size_t>(j)] = c;
    }
  }
}

nlohmann::json HealthReport::ToJson() const {
  return {{"ok", ok},
          {"failure", failure},
          {"backend", backend},
          {"gemm_precision", gemm_precision},
          {"gemm_tolerance", Num(gemm_tolerance)},
          {"attention_tolerance", Num(attention_tolerance)},
          {"gemm_max_rel_err", Num(gemm_max_rel_err)},
          {"attention_max_rel_err", Num(attention_max_rel_err)},
          {"gemm_n", gemm_n},
          {"gemm_gflops", Num(gemm_gflops)},
          {"seconds", Num(seconds)}};
}

HealthReport RunHealthCheck(const HealthOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  HealthReport r;
  r.backend = ops::Active()->name();
  const bool bf16 = ops::GetGemmPrecision() == ops::GemmPrecision::kBf16 && ops::HasBf16Gemm();
  r.gemm_precision = bf16 ? "bf16" : "fp32";
  r.gemm_tolerance = bf16 ? kGemmToleranceBf16 : kGemmToleranceFp32;
  r.attention_tolerance = kAttentionTolerance;
  r.gemm_n = options.gemm_n;

  if (options.gemm_n < 1 || options.gemm_n > kMaxHealthGemmN) {
    Fail(&r, StrFormat("options: gemm_n=%lld is outside [1, %lld]", (long long)options.gemm_n,
                 (long long)kMaxHealthGemmN));
  } else if (!(options.min_gflops >= 0) || !std::isfinite(options.min_gflops)) {
    Fail(&r, StrFormat("options: min_gflops=%g must be a finite number >= 0", options.min_gflops));
  } else {
    if (!options.inject_failure.empty()) Fail(&r, options.inject_failure);
    Rng rng(options.seed);
    GemmChecks(options, r.gemm_precision, r.gemm_tolerance, rng, &r);
    AttentionChecks(rng, &r);
  }
  r.ok = r.failure.empty();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::vector<Straggler> FindStragglers(const std::vector<std::vector<double>>& step_s_by_rank, double factor,
                                      size_t window) {
  std::vector<Straggler> out;
  if (window == 0) return out;
  std::vector<int> judged;
  std::vector<double> medians;
  for (size_t rank = 0; rank < step_s_by_rank.size(); ++rank) {
    const std::vector<double>& s = step_s_by_rank[rank];
    if (s.size() < window) continue;
    std::vector<double> last(s.end() - static_cast<std::ptrdiff_t>(window), s.end());
    if (!std::all_of(last.begin(), last.end(), [](double x) { return std::isfinite(x) && x >= 0; })) continue;
    judged.push_back(static_cast<int>(rank));
    medians.push_back(Median(std::move(last)));
  }
  if (medians.empty()) return out;
  const double all = Median(medians);
  if (!(all > 0)) return out;
  for (size_t i = 0; i < judged.size(); ++i)
    if (medians[i] > factor * all)
      out.push_back(Straggler{judged[i], medians[i], all, medians[i] / all});
  return out;
}

}  // namespace myriad::supervise

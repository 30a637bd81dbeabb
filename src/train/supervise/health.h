// Device health for training ranks: a self-test a rank runs before it joins
// a job (or when a supervisor suspects it), and a straggler detector over the
// step times the ranks report.
//
// RunHealthCheck proves, on the calling thread and through the active backend
// (src/ops/ops.h, exactly the entry points the model uses), that the device
//   1. computes GEMMs correctly: ops::Gemm on seeded random matrices, one
//      square n x n x n product in the layout of Linear's forward (A @ B^T)
//      and ragged shapes in all four Trans combinations with alpha, beta and
//      padded leading dimensions, against a scalar triple loop in double;
//      repeating the square product must give the same bits (backend.h:
//      results are deterministic), which catches flaky hardware;
//   2. computes the fused causal attention forward correctly: ops::Attention
//      on small GQA cases (training shape Tq == Tk, and decode-like Tq < Tk
//      with padded batch strides), out and lse, against a naive
//      softmax(scale q k^T) v in double written here (independent of the
//      backend's own oracles);
//   3. produces only finite numbers: every output of 1 and 2;
//   4. is fast enough: the best of 3 timed runs (after a warm-up) of the
//      square GEMM gives GFLOP/s, compared with min_gflops when set.
//
// Errors are normwise: max_i |got_i - want_i| / max_i |want_i| (see
// MaxRelError), so entries near zero do not inflate them. Tolerances:
//   gemm, fp32 precision  1e-4  (fp32 accumulation vs double: measured
//                                ~6e-7 on cpu-avx512; a wrong element, index
//                                or tile shows up as 1e-3 .. 1)
//   gemm, bf16 precision  2e-2  (inputs rounded to bf16, at most 2^-8
//                                relative each, fp32 accumulation: measured
//                                ~3e-3 for n from 192 to 2048, and always
//                                above 1e-4, so an fp32 run that silently
//                                computes in bf16 fails)
//   attention             1e-4  (always fp32; the kernels use a vectorised
//                                exp: measured ~6e-7)
// The GEMM precision is the process-wide one ops::Gemm uses
// (ops::GetGemmPrecision, bf16 only where the backend has gemm_bf16); the
// report names it. The reference uses the fp32 inputs, so under bf16 the
// tolerance covers the rounding of the inputs.
//
// The report's `failure` is the first failing check with its numbers, e.g.
//   "gemm: max relative error 3.1e-02 > 1e-04 (fp32, NT M=192 N=192 K=192)"
//   "attention: non-finite out nan at index 17 of 2432 (B=2 Tq=19 Tk=19 H=4 Hkv=2 D=16)"
//   "throughput: 12.3 GFLOP/s < required 50 GFLOP/s (n=192, best of 3; slow device)"
// All checks run even after one fails, so the report's figures are complete.
//
// Cost: the reference of the square GEMM checks every row for n <= 256 and
// 64 seeded rows (always the first and the last) above that, so a large
// gemm_n for a fast device costs O(n^2) in the reference (generating the
// random inputs takes about 1 s at n=2048). At the default n=192 the
// whole check takes ~20 ms on one AVX-512 core. The throughput probe is short
// (4 x 14 MFLOP at n=192): it measures what the device does now, so an
// oversubscribed host (more OpenMP threads than free cores) reads slow.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace myriad::supervise {

// Tolerances of the normwise relative errors (see above).
inline constexpr double kGemmToleranceFp32 = 1e-4;
inline constexpr double kGemmToleranceBf16 = 2e-2;
inline constexpr double kAttentionTolerance = 1e-4;
// gemm_n outside [1, kMaxHealthGemmN] fails the check ("options: ...").
inline constexpr int64_t kMaxHealthGemmN = 8192;

struct HealthOptions {
  int64_t gemm_n = 192;        // square GEMM size of the self-test and the throughput probe
  double min_gflops = 0;       // 0: no floor; else below this the check fails ("slow device")
  std::string inject_failure;  // non-empty: fail with exactly this reason (fault injection for
                               // drills/tests); the checks still run and report their figures
  uint64_t seed = 1;           // of the random inputs
};

struct HealthReport {
  bool ok = false;
  std::string failure;  // first failing check with its numbers; empty when ok
  std::string backend;         // the active backend's name, e.g. "cpu-avx512"
  std::string gemm_precision;  // "fp32" or "bf16": what ops::Gemm computed in
  double gemm_tolerance = 0, attention_tolerance = 0;
  double gemm_max_rel_err = 0, attention_max_rel_err = 0;  // worst over all cases
  int64_t gemm_n = 0;
  double gemm_gflops = 0;  // throughput probe: best of 3 runs of the n^3 GEMM through ops::Gemm
  double seconds = 0;      // wall time of the whole check
  // All fields above; non-finite numbers become null.
  nlohmann::json ToJson() const;
};

// Runs the checks above on the calling thread through the active backend.
// Never aborts on a bad device or bad options: every problem ends up in
// `failure`.
HealthReport RunHealthCheck(const HealthOptions& options);

// True when all n floats are finite; *first_bad (if given) gets the index of
// the first that is not (and -1 when all are finite).
bool AllFinite(const float* x, int64_t n, int64_t* first_bad = nullptr);

// Normwise relative error max_i |got_i - want_i| / max_i |want_i| over n
// elements (the denominator is taken as 1 when every want_i is 0). Any
// non-finite got_i makes it +inf, so a NaN can never pass a tolerance.
double MaxRelError(const float* got, const double* want, int64_t n);

// want[M,N] = alpha * op(A) @ op(B) + beta * C0 in double over the float
// inputs: the scalar oracle of the GEMM self-test (same contract and
// row-major layout as ops::Gemm; C0 read with ldc, not at all when beta is
// 0, so it may then be null). Computes only the rows listed in `rows` (all
// M rows when empty); want is [rows, N] contiguous in that order.
void ReferenceGemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
                   const float* A, int64_t lda, const float* B, int64_t ldb, double beta,
                   const float* C0, int64_t ldc, const std::vector<int64_t>& rows,
                   std::vector<double>* want);

// Stragglers: per rank, its recent step times (seconds, newest last). A rank
// is a straggler when the median of its last `window` step times exceeds
// `factor` x the median over ranks of those per-rank medians. Ranks with
// fewer than `window` samples, or with a non-finite or negative time among
// their last `window`, are not judged (and do not count in the median over
// ranks). Nothing is reported when no rank can be judged, the median over
// ranks is not positive, or window is 0. Result in rank order.
struct Straggler {
  int rank = 0;
  double rank_median_s = 0, all_median_s = 0, ratio = 0;  // ratio = rank / all
};
std::vector<Straggler> FindStragglers(const std::vector<std::vector<double>>& step_s_by_rank,
                                      double factor = 1.5, size_t window = 8);

}  // namespace myriad::supervise

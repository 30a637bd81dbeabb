// The lab's built-in tasks. softmax_rows: y[n, :] = softmax(x[n, :]).
//
// The candidate kernels are plain C++ (`omp simd` loops, OpenMP over rows),
// compiled three times by target attributes: AVX-512, AVX2 and the baseline
// x86-64 ISA; the variant used is the one of the active CPU backend
// (CpuBackend(): cpuid, or MYRIAD_CPU_ISA). The row code is always_inline and
// in an anonymous namespace so each variant gets its own copy (see
// backend/cpu/impl/common.h on COMDAT sharing across ISAs).
#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "backend/cpu/impl/common.h"
#include "core/check.h"
#include "core/log.h"
#include "core/rng.h"
#include "lab/lab.h"

namespace myriad::lab {
namespace {

using json = nlohmann::json;
using cpu::ExpF;

// ------------------------------------------------------------ softmax_rows kernels
//
// x, y: [N, C] row-major. B (the "block" parameter) is the number of columns
// an inner `omp simd` block handles: B independent lane accumulators for the
// max and the sum. Columns past the last full block (the tail) run scalar.

template <int B>
[[gnu::always_inline]] inline float RowMax(const float* x, int64_t C) {
  float acc[B];
  for (int k = 0; k < B; ++k) acc[k] = -std::numeric_limits<float>::infinity();
  int64_t c = 0;
  for (; c + B <= C; c += B) {
#pragma omp simd
    for (int k = 0; k < B; ++k) acc[k] = acc[k] > x[c + k] ? acc[k] : x[c + k];
  }
  float m = -std::numeric_limits<float>::infinity();
  for (int k = 0; k < B; ++k) m = m > acc[k] ? m : acc[k];
  for (; c < C; ++c) m = m > x[c] ? m : x[c];
  return m;
}

// Sums run in B float lanes within a chunk of kChunk columns and across
// chunks in double: fp32 lanes alone would add C / B terms each (4096 for
// C = 32768, B = 8), about 1e-5 relative error, the whole tolerance.
constexpr int64_t kChunk = 1024;  // a multiple of every block

// Returns sum(exp(x - m)), storing the terms in y when kStore.
template <int B, bool kStore>
[[gnu::always_inline]] inline double ExpSum(const float* x, float* y, int64_t C, float m) {
  double total = 0;
  int64_t c = 0;
  while (c + B <= C) {
    float acc[B] = {};
    const int64_t end = c + kChunk < C ? c + kChunk : C;
    for (; c + B <= end; c += B) {
#pragma omp simd
      for (int k = 0; k < B; ++k) {
        float e = ExpF(x[c + k] - m);
        if constexpr (kStore) y[c + k] = e;
        acc[k] += e;
      }
    }
    float s = 0;
    for (int k = 0; k < B; ++k) s += acc[k];
    total += s;
  }
  for (; c < C; ++c) {
    float e = ExpF(x[c] - m);
    if constexpr (kStore) y[c] = e;
    total += e;
  }
  return total;
}

template <int B>
[[gnu::always_inline]] inline void Scale(float* y, int64_t C, float a) {
  int64_t c = 0;
  for (; c + B <= C; c += B) {
#pragma omp simd
    for (int k = 0; k < B; ++k) y[c + k] *= a;
  }
  for (; c < C; ++c) y[c] *= a;
}

// Max and sum in one sweep over memory: per chunk of kChunk columns (4 KiB,
// read twice from L1) the chunk's max, which rescales the running sum by
// exp(m_old - m_new) when it raises the running max m, then the chunk's sum
// of exp(x - m). Sets *m_out, *s_out.
template <int B>
[[gnu::always_inline]] inline void OnlineMaxSum(const float* x, int64_t C, float* m_out, float* s_out) {
  float m = -std::numeric_limits<float>::infinity();
  double total = 0;
  for (int64_t c0 = 0; c0 < C; c0 += kChunk) {
    const int64_t len = C - c0 < kChunk ? C - c0 : kChunk;
    const float cm = RowMax<B>(x + c0, len);
    if (cm > m) {
      total *= ExpF(m - cm);  // m = -inf on the first chunk: 0 x 0
      m = cm;
    }
    total += ExpSum<B, false>(x + c0, nullptr, len, m);
  }
  *m_out = m;
  *s_out = (float)total;
}

// y = exp(x - m) * a.
template <int B>
[[gnu::always_inline]] inline void ExpScale(const float* x, float* y, int64_t C, float m, float a) {
  int64_t c = 0;
  for (; c + B <= C; c += B) {
#pragma omp simd
    for (int k = 0; k < B; ++k) y[c + k] = ExpF(x[c + k] - m) * a;
  }
  for (; c < C; ++c) y[c] = ExpF(x[c] - m) * a;
}

// two_pass: max, then exp + sum (storing exp), then normalise (3 sweeps, one
// exp per element). online: max and sum in one sweep, then exp again and
// normalise (2 sweeps over memory, two exps per element).
template <int B, bool kTwoPass>
[[gnu::always_inline]] inline void SoftmaxRow(const float* x, float* y, int64_t C) {
  if constexpr (kTwoPass) {
    const float m = RowMax<B>(x, C);
    const float s = (float)ExpSum<B, true>(x, y, C, m);
    Scale<B>(y, C, 1.f / s);
  } else {
    float m, s;
    OnlineMaxSum<B>(x, C, &m, &s);
    ExpScale<B>(x, y, C, m, 1.f / s);
  }
}

// The OpenMP region sits in each target-attributed function (its outlined
// body inherits the target); below kMinParallelElems the rows run on the
// calling thread, as the backend's elementwise kernels do.
template <int B, bool kTwoPass>
[[gnu::target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,prefer-vector-width=512")]]
void SoftmaxRowsAvx512(const float* x, float* y, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C >= cpu::kMinParallelElems)
  for (int64_t n = 0; n < N; ++n) SoftmaxRow<B, kTwoPass>(x + n * C, y + n * C, C);
}
template <int B, bool kTwoPass>
[[gnu::target("avx2,fma,f16c")]]
void SoftmaxRowsAvx2(const float* x, float* y, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C >= cpu::kMinParallelElems)
  for (int64_t n = 0; n < N; ++n) SoftmaxRow<B, kTwoPass>(x + n * C, y + n * C, C);
}
template <int B, bool kTwoPass>
void SoftmaxRowsGeneric(const float* x, float* y, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C >= cpu::kMinParallelElems)
  for (int64_t n = 0; n < N; ++n) SoftmaxRow<B, kTwoPass>(x + n * C, y + n * C, C);
}

using RowsFn = void (*)(const float* x, float* y, int64_t N, int64_t C);

template <int B, bool kTwoPass>
RowsFn PickIsa(const std::string& backend) {
  if (backend == "cpu-avx512") return SoftmaxRowsAvx512<B, kTwoPass>;
  if (backend == "cpu-avx2") return SoftmaxRowsAvx2<B, kTwoPass>;
  return SoftmaxRowsGeneric<B, kTwoPass>;
}

template <int B>
RowsFn PickPasses(const std::string& backend, bool two_pass) {
  return two_pass ? PickIsa<B, true>(backend) : PickIsa<B, false>(backend);
}

// ------------------------------------------------------------ softmax_rows task

using SoftmaxInstance = SoftmaxRowsInstance;

// x uniform in [-8, 8) plus a per-row offset that breaks kernels without the max
// subtraction: rows n%4 == 1 sit at +100 (exp overflows fp32), n%4 == 2 at
// -100 (exp underflows to 0), n%4 == 3 have one spike 30 above the rest.
std::unique_ptr<Instance> MakeSoftmaxInstance(const Shape& shape, uint64_t seed) {
  auto inst = std::make_unique<SoftmaxInstance>();
  inst->shape = shape;
  inst->seed = seed;
  inst->N = shape.Get("N");
  inst->C = shape.Get("C");
  const int64_t N = inst->N, C = inst->C;
  inst->x.resize((size_t)(N * C));
  inst->out.resize((size_t)(N * C));
  Rng rng(seed * 0x9e3779b97f4a7c15ULL + (uint64_t)(N * 1000003 + C));
  for (int64_t n = 0; n < N; ++n) {
    const float offset = n % 4 == 1 ? 100.f : n % 4 == 2 ? -100.f : 0.f;
    float* row = inst->x.data() + n * C;
    for (int64_t c = 0; c < C; ++c) row[c] = 16.f * rng.Uniform() - 8.f + offset;
    if (n % 4 == 3 && C > 0) row[rng.Below((uint64_t)C)] += 30.f;
  }
  return inst;
}

std::vector<double> SoftmaxReference(const Instance& base) {
  const auto& in = static_cast<const SoftmaxInstance&>(base);
  std::vector<double> y((size_t)(in.N * in.C));
  for (int64_t n = 0; n < in.N; ++n) {
    const float* x = in.x.data() + n * in.C;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < in.C; ++c) m = std::max(m, (double)x[c]);
    double* yr = y.data() + n * in.C;
    double s = 0;
    for (int64_t c = 0; c < in.C; ++c) s += (yr[c] = std::exp((double)x[c] - m));
    for (int64_t c = 0; c < in.C; ++c) yr[c] /= s;
  }
  return y;
}

constexpr int kBlocks[] = {8, 16, 32, 64};

}  // namespace

Result<Kernel> BuildSoftmaxRowsKernel(const Params& params) {
  const std::string where = "softmax_rows candidate " + params.dump();
  if (!params.is_object()) return Status::Error(where + ": expected a JSON object such as {\"block\": 32, \"two_pass\": true}");
  for (const auto& [key, value] : params.items()) {
    if (key != "block" && key != "two_pass")
      return Status::Error(where + ": unknown parameter '" + key + "' (hint: the parameters are block and two_pass)");
  }
  if (!params.contains("block") || !params["block"].is_number_integer() ||
      std::find(std::begin(kBlocks), std::end(kBlocks), params["block"].get<int>()) == std::end(kBlocks))
    return Status::Error(where + ": \"block\" must be one of 8, 16, 32, 64");
  if (!params.contains("two_pass") || !params["two_pass"].is_boolean())
    return Status::Error(where + ": \"two_pass\" must be true or false");
  const int block = params["block"].get<int>();
  const bool two_pass = params["two_pass"].get<bool>();
  const Backend* backend = CpuBackend("");
  const std::string isa = backend ? backend->name() : "cpu-scalar";
  RowsFn fn = nullptr;
  switch (block) {
    case 8: fn = PickPasses<8>(isa, two_pass); break;
    case 16: fn = PickPasses<16>(isa, two_pass); break;
    case 32: fn = PickPasses<32>(isa, two_pass); break;
    case 64: fn = PickPasses<64>(isa, two_pass); break;
    default: return Status::Error(where + ": \"block\" must be one of 8, 16, 32, 64, not " + std::to_string(block));
  }
  return Kernel([fn](Instance& base) {
    auto& in = static_cast<SoftmaxInstance&>(base);
    fn(in.x.data(), in.out.data(), in.N, in.C);
  });
}

Task MakeSoftmaxRowsTask() {
  Task t;
  t.name = "softmax_rows";
  t.description =
      "Row softmax over a row-major [N, C] fp32 matrix: y[n, c] = exp(x[n, c] - m_n) / sum_c' exp(x[n, c'] - m_n), "
      "m_n = max_c x[n, c]. The inputs are uniform in [-8, 8) with rows offset by +100 or -100 (exp overflows or underflows "
      "without the max subtraction) or carrying one spike 30 above the rest. Kernels are plain C++ with `omp simd` "
      "inner blocks and OpenMP over rows (below 32768 elements on the calling thread), compiled for the active CPU "
      "ISA; exp is backend/cpu/impl/common.h's ExpF (about 2 ulp). Tuned: the block width of the inner loops and "
      "the pass structure.";
  t.param_doc =
      "- `block` (int, one of 8, 16, 32, 64): columns per inner `omp simd` block, i.e. the number of independent "
      "lane accumulators for the max and the sum; columns past the last full block run scalar.\n"
      "- `two_pass` (bool): true = max, then exp + sum (storing exp), then normalise: three sweeps, one exp per "
      "element; false = online softmax: max and sum in one sweep over memory (per 1024-column chunk, L1-resident: "
      "the chunk max, then the sum of exp, the running sum rescaled when a chunk raises the max), then exp again "
      "and normalise: two sweeps, two exps per element.";
  t.make_instance = MakeSoftmaxInstance;
  t.reference = SoftmaxReference;
  t.build = BuildSoftmaxRowsKernel;
  for (int block : kBlocks) {
    for (bool two_pass : {true, false}) {
      Params p = {{"block", block}, {"two_pass", two_pass}};
      Result<Candidate> c =
          MakeCandidate(t, "b" + std::to_string(block) + (two_pass ? "_two_pass" : "_online"), p);
      CHECK(c.ok());
      t.candidates.push_back(std::move(c.value()));
    }
  }
  // The textbook kernel: one 16-lane vector of accumulators, three sweeps.
  t.baseline = "b16_two_pass";
  for (int64_t C : {100, 1000, 4097, 32768}) t.shapes.push_back(Shape{{{"N", 64}, {"C", C}}});
  t.seeds = {1, 2, 3};
  t.tolerance = 1e-5;
  // Floors: max, subtract, add, multiply per element (exp not counted: a
  // lower bound); x read once, y written once.
  t.cost = [](const Shape& s) {
    const double e = (double)s.Get("N") * (double)s.Get("C");
    return Cost{4 * e, 8 * e};
  };
  return t;
}

void RegisterBuiltinTasks() {
  static std::once_flag once;
  std::call_once(once, [] {
    Status s = RegisterTask(MakeSoftmaxRowsTask());
    if (!s.ok()) LOG_WARN("%s", s.message().c_str());
    if (std::optional<Task> sparse = MakeSparseAttentionTask()) {
      s = RegisterTask(std::move(*sparse));
      if (!s.ok()) LOG_WARN("%s", s.message().c_str());
    }
  });
}

}  // namespace myriad::lab

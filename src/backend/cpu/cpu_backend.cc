// CpuBackend(): one immutable Backend per ISA, created on first request and
// alive for the whole process (callers never delete it). The ISA is checked
// against cpuid here, so no ISA-specific code runs on a CPU without it.
//
// What the backends are made of (see kernels.h):
//   scalar  impl/*.h portable kernels at baseline x86-64 flags (paged
//           attention, impl/paged_attention.h, is portable in every table)
//   avx2    the same compiled for AVX2/FMA/F16C, plus impl/flash_simd.h,
//           impl/elementwise_simd.h and isa_avx2/gemv_avx2.cc (intrinsics)
//   avx512  likewise for AVX-512, GEMV q8 through VNNI when present
// gemm always goes through blas.h. Ops may be called from several threads
// at once; each call parallelises with OpenMP. Attention keeps grow-only
// per-calling-thread scratch (impl/common.h ThreadWorkspace): about
// 8 x B x H x T x D floats for a training-shape backward, kept until the
// thread exits. MYRIAD_CPU_ISA=avx512|avx2|scalar overrides the choice made
// for CpuBackend("") (benchmarks, debugging).
#include <omp.h>

#include <cstdlib>
#include <memory>
#include <mutex>

#include "backend/backend.h"
#include "backend/cpu/cpu_info.h"
#include "backend/cpu/kernels.h"
#include "core/log.h"

namespace myriad {
namespace {

class CpuBackendImpl final : public Backend {
 public:
  CpuBackendImpl(std::string name, const BackendOps& ops) : name_(std::move(name)), ops_(ops) {}
  std::string name() const override { return name_; }
  const BackendOps& ops() const override { return ops_; }
  int num_threads() const override { return omp_get_max_threads(); }

 private:
  std::string name_;
  BackendOps ops_;
};

std::unique_ptr<Backend> Make(const std::string& isa) {
  const CpuInfo& cpu = GetCpuInfo();
  BackendOps ops{};
  if (isa == "avx512") {
    if (!cpu.has_avx512_kernels()) return nullptr;
    cpu::FillAvx512Ops(&ops);
  } else if (isa == "avx2") {
    if (!cpu.has_avx2_kernels()) return nullptr;
    cpu::FillAvx2Ops(&ops);
  } else if (isa == "scalar") {
    cpu::FillGenericOps(&ops);
  } else {
    return nullptr;
  }
  std::string missing = MissingRequiredSlots(ops);
  if (!missing.empty()) {
    LOG_ERROR("cpu-%s backend leaves required slots empty: %s", isa.c_str(), missing.c_str());
    return nullptr;
  }
  return std::make_unique<CpuBackendImpl>("cpu-" + isa, ops);
}

std::string BestIsa() {
  const CpuInfo& cpu = GetCpuInfo();
  if (cpu.has_avx512_kernels()) return "avx512";
  if (cpu.has_avx2_kernels()) return "avx2";
  return "scalar";
}

}  // namespace

Backend* CpuBackend(const std::string& isa_in) {
  std::string isa = isa_in;
  if (isa.empty()) {
    const char* env = std::getenv("MYRIAD_CPU_ISA");  // override for debugging/benchmarks
    isa = env && *env ? env : BestIsa();
  }
  static std::mutex mu;
  static std::unique_ptr<Backend> backends[3];
  static bool made[3] = {false, false, false};
  int slot = isa == "avx512" ? 0 : isa == "avx2" ? 1 : isa == "scalar" ? 2 : -1;
  if (slot < 0) return nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (!made[slot]) {
    backends[slot] = Make(isa);
    made[slot] = true;
  }
  return backends[slot].get();
}

}  // namespace myriad

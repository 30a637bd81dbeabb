// myriad doctor: what this machine is and what Myriad will run on it.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <vector>

#include "backend/cpu/blas.h"
#include "backend/cpu/cpu_info.h"
#include "cli/verbs.h"
#include "ops/ops.h"
#include "backend/cpu/kernel_bench.h"

namespace myriad::cli {


int RunDoctor(int argc, char** argv) {
  CLI::App app{"Report the CPU, ISA, BLAS kernel, cores and memory Myriad sees", "myriad doctor"};
  bool quick = false, bench = false;
  app.add_flag("--quick", quick, "skip the SGEMM probe");
  app.add_flag("--bench", bench, "also time the kernels (attention, GEMV, elementwise) and memory bandwidth");
  CLI11_PARSE(app, argc, argv);

  const CpuInfo& cpu = GetCpuInfo();
  const BlasInfo& blas = GetBlasInfo();
  Backend* be = ops::Active();
  std::printf("cpu        %s (%s)\n", cpu.model_name.c_str(), cpu.vendor.c_str());
  std::printf("cores      %d logical\n", cpu.logical_cores);
  std::printf("memory     %.1f GiB total, %.1f GiB available\n", cpu.mem_total_bytes / 1073741824.0,
              cpu.mem_available_bytes / 1073741824.0);
  std::printf("isa        %s\n", cpu.FeatureString().c_str());
  std::printf("backend    %s (%d threads)\n", be->name().c_str(), be->num_threads());
  std::printf("blas       %s\n", blas.library.c_str());
  std::printf("blas core  %s%s\n", blas.corename.empty() ? "(none)" : blas.corename.c_str(),
              blas.coretype_set_by_us ? " (OPENBLAS_CORETYPE chosen by Myriad from cpuid)"
                                      : (blas.coretype_env.empty() ? "" : " (OPENBLAS_CORETYPE from the environment)"));
  if (!blas.note.empty()) std::printf("blas note  %s\n", blas.note.c_str());
  if (!quick) std::printf("sgemm      %.1f GFLOP/s (n=1024, best of 3)\n", MeasureSgemmPeakGflops(1024));
  if (bench) std::printf("\n%s\n", RunKernelMicrobench().c_str());
  if (!blas.fast_kernel) {
    std::fprintf(stderr,
                 "\n*** WARNING: the BLAS runs a GENERIC kernel (%s); dense GEMM will be several times slower "
                 "than this CPU allows. (hint: install libopenblas0-openmp, or set OPENBLAS_CORETYPE to a core "
                 "type OpenBLAS knows, e.g. SkylakeX or Haswell) ***\n\n",
                 blas.corename.empty() ? "none" : blas.corename.c_str());
    return 1;
  }
  std::printf("status     ok\n");
  return 0;
}

}  // namespace myriad::cli

// Kernel microbenchmarks for `myriad doctor --bench` and for MFU / roofline
// figures. Not used by tests (timings are never asserted). Each call takes
// the CPU for a while (RunKernelMicrobench: tens of seconds) and allocates
// its own buffers; call from one thread at a time.
#pragma once

#include <string>

namespace myriad {

// Best-of-3 SGEMM rate (C = A B, n x n x n, through blas.h) in GFLOP/s.
double MeasureSgemmPeakGflops(int n = 2048);
// Best-of-3 read bandwidth in GB/s (1e9 B/s): a sum over a 256 MB buffer on
// all OpenMP threads.
double MeasureReadBandwidthGBs();
// Human-readable report: SGEMM at n=1024/2048, attention fwd+bwd (B=4,
// T=256, H=12, D=64) vs the scalar oracle, GEMV fp32/fp16/q8 for a
// 50257x768 matrix vs the read roofline and OpenBLAS's M=1 GEMM, and the
// read bandwidth. Ends with one JSON line per benchmark (BENCHMARKS.md).
std::string RunKernelMicrobench();

}  // namespace myriad

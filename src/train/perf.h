// Machine limits measured in-process, for MFU and roofline figures.
#pragma once

namespace myriad {
// Best-of-3 SGEMM GFLOP/s at n x n x n through the active backend.
double MeasureSgemmGflops(int n = 1024);
}  // namespace myriad

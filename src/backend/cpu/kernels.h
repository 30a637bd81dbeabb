// Per-ISA op tables of the CPU backend (internal to src/backend/cpu).
// Each Fill*Ops lives in a TU compiled for its ISA; call it only when
// GetCpuInfo() reports that ISA (cpu_backend.cc does the check).
#pragma once

#include "backend/backend.h"

namespace myriad::cpu {

void FillGenericOps(BackendOps* ops);  // baseline x86-64 (SSE2), no -m flags
void FillAvx2Ops(BackendOps* ops);     // needs AVX2 + FMA + F16C
void FillAvx512Ops(BackendOps* ops);   // needs AVX-512 F/BW/VL/DQ (VNNI optional)

}  // namespace myriad::cpu

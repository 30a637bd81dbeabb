// What this CPU can do, read once from cpuid, /proc/cpuinfo and /proc/meminfo.
// `myriad doctor` prints it; CpuBackend("") uses it to choose the kernel ISA.
// Thread-safe: computed on first call, immutable afterwards.
#pragma once

#include <cstdint>
#include <string>

namespace myriad {

struct CpuInfo {
  std::string model_name, vendor;  // "AMD EPYC ...", "AuthenticAMD"
  int logical_cores = 0;           // online logical CPUs
  // ISA extensions that are both reported by cpuid and enabled by the OS
  // (XCR0 saves the AVX / AVX-512 register state).
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_vnni = false, avx512_bf16 = false, avx512_fp16 = false, avx_vnni = false;
  uint64_t mem_total_bytes = 0, mem_available_bytes = 0;

  // AVX-512 F+BW+VL+DQ: what the isa_avx512 kernels need (VNNI is checked
  // separately by the int8 kernels).
  bool has_avx512_kernels() const { return avx512f && avx512bw && avx512vl && avx512dq; }
  bool has_avx2_kernels() const { return avx2 && fma && f16c; }
  // One line such as "avx2 fma f16c avx512f avx512bw ... avx_vnni".
  std::string FeatureString() const;
};

const CpuInfo& GetCpuInfo();

}  // namespace myriad

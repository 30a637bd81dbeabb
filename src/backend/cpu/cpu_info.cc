#include "backend/cpu/cpu_info.h"

#include <cpuid.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

namespace myriad {
namespace {

struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs Cpuid(unsigned leaf, unsigned sub) {
  Regs r;
  __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
  return r;
}

uint64_t Xgetbv0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

bool Bit(unsigned v, int i) { return (v >> i) & 1u; }

// Reads "Key:   12345 kB" from /proc/meminfo.
uint64_t MeminfoBytes(const std::string& text, const char* key) {
  auto at = text.find(key);
  if (at == std::string::npos) return 0;
  std::istringstream in(text.substr(at + std::strlen(key)));
  uint64_t kb = 0;
  in >> kb;
  return kb * 1024;
}

std::string ReadFile(const char* path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

CpuInfo Detect() {
  CpuInfo info;
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  Regs v = Cpuid(0, 0);
  char vendor[13] = {};
  std::memcpy(vendor + 0, &v.b, 4);
  std::memcpy(vendor + 4, &v.d, 4);
  std::memcpy(vendor + 8, &v.c, 4);
  info.vendor = vendor;

  Regs l1 = Cpuid(1, 0);
  bool osxsave = Bit(l1.c, 27);
  uint64_t xcr0 = osxsave ? Xgetbv0() : 0;
  bool os_avx = (xcr0 & 0x6) == 0x6;             // XMM + YMM state
  bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;  // opmask + ZMM state
  info.fma = os_avx && Bit(l1.c, 12);
  info.f16c = os_avx && Bit(l1.c, 29);
  if (max_leaf >= 7) {
    Regs l7 = Cpuid(7, 0);
    info.avx2 = os_avx && Bit(l7.b, 5);
    info.avx512f = os_avx512 && Bit(l7.b, 16);
    info.avx512dq = os_avx512 && Bit(l7.b, 17);
    info.avx512bw = os_avx512 && Bit(l7.b, 30);
    info.avx512vl = os_avx512 && Bit(l7.b, 31);
    info.avx512_vnni = os_avx512 && Bit(l7.c, 11);
    info.avx512_fp16 = os_avx512 && Bit(l7.d, 23);
    if (l7.a >= 1) {
      Regs l71 = Cpuid(7, 1);
      info.avx_vnni = os_avx && Bit(l71.a, 4);
      info.avx512_bf16 = os_avx512 && Bit(l71.a, 5);
    }
  }

  // Brand string from cpuid; /proc/cpuinfo's "model name" wins when present.
  if (__get_cpuid_max(0x80000000, nullptr) >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      Regs r = Cpuid(0x80000002 + i, 0);
      std::memcpy(brand + 16 * i + 0, &r.a, 4);
      std::memcpy(brand + 16 * i + 4, &r.b, 4);
      std::memcpy(brand + 16 * i + 8, &r.c, 4);
      std::memcpy(brand + 16 * i + 12, &r.d, 4);
    }
    info.model_name = brand;
  }
  std::string cpuinfo = ReadFile("/proc/cpuinfo");
  auto at = cpuinfo.find("model name");
  if (at != std::string::npos) {
    auto colon = cpuinfo.find(':', at);
    auto eol = cpuinfo.find('\n', at);
    if (colon != std::string::npos && colon < eol) info.model_name = cpuinfo.substr(colon + 1, eol - colon - 1);
  }
  while (!info.model_name.empty() && info.model_name.front() == ' ') info.model_name.erase(0, 1);
  while (!info.model_name.empty() && info.model_name.back() == ' ') info.model_name.pop_back();

  long n = sysconf(_SC_NPROCESSORS_ONLN);
  info.logical_cores = n > 0 ? static_cast<int>(n) : 1;
  std::string meminfo = ReadFile("/proc/meminfo");
  info.mem_total_bytes = MeminfoBytes(meminfo, "MemTotal:");
  info.mem_available_bytes = MeminfoBytes(meminfo, "MemAvailable:");
  return info;
}

}  // namespace

std::string CpuInfo::FeatureString() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512dq, "avx512dq");
  add(avx512_vnni, "avx512_vnni");
  add(avx512_bf16, "avx512_bf16");
  add(avx512_fp16, "avx512_fp16");
  add(avx_vnni, "avx_vnni");
  return s;
}

const CpuInfo& GetCpuInfo() {
  static const CpuInfo info = Detect();
  return info;
}

}  // namespace myriad

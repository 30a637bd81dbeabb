// Device memory for the CPU backend: the device is the host, so allocation
// is aligned host memory and copies of every kind are memcpy. Ops complete
// when they return, so synchronize has nothing to wait for.
#include <sys/mman.h>
#include <unistd.h>

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/kernels.h"

namespace myriad::cpu {
namespace {

void* HostAlloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  size_t rounded = (bytes + 63) / 64 * 64;  // aligned_alloc wants a multiple of the alignment
  void* p = std::aligned_alloc(64, rounded);
  if (!p) {
    std::fprintf(stderr, "[mem_alloc] out of host memory allocating %zu bytes\n", bytes);
    std::abort();
  }
  return p;
}
void HostFree(void* p) { std::free(p); }
// Large copies (checkpoint snapshots, tier transfers) are split over the
// threads: one core does not reach the memory bandwidth.
constexpr size_t kParallelCopyBytes = size_t{8} << 20;
void HostCopy(void* dst, const void* src, size_t bytes, CopyKind) {
  if (bytes < kParallelCopyBytes || omp_in_parallel() || omp_get_max_threads() == 1) {
    if (bytes) std::memcpy(dst, src, bytes);
    return;
  }
  const int64_t chunks = static_cast<int64_t>((bytes + (size_t{1} << 20) - 1) >> 20);  // 1 MiB each
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t off = static_cast<size_t>(c) << 20;
    std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off,
                std::min(bytes - off, size_t{1} << 20));
  }
}
void HostSet(void* dst, int value, size_t bytes) {
  if (bytes) std::memset(dst, value, bytes);
}
// Whole pages inside the range back to the OS (they read as zero after).
void HostDiscard(void* p, size_t bytes) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(page - 1);
  if (e > b) madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
}
void HostSync() {}

}  // namespace

void FillHostMemoryOps(BackendOps* ops) {
  ops->mem_alloc = HostAlloc;
  ops->mem_free = HostFree;
  ops->mem_copy = HostCopy;
  ops->mem_set = HostSet;
  ops->mem_discard = HostDiscard;
  ops->synchronize = HostSync;
}

}  // namespace myriad::cpu

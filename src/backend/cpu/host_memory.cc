// Device memory for the CPU backend: the device is the host, so allocation
// is aligned host memory and copies of every kind are memcpy. Ops complete
// when they return, so synchronize has nothing to wait for.
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
void HostCopy(void* dst, const void* src, size_t bytes, CopyKind) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void HostSet(void* dst, int value, size_t bytes) {
  if (bytes) std::memset(dst, value, bytes);
}
void HostSync() {}

}  // namespace

void FillHostMemoryOps(BackendOps* ops) {
  ops->mem_alloc = HostAlloc;
  ops->mem_free = HostFree;
  ops->mem_copy = HostCopy;
  ops->mem_set = HostSet;
  ops->synchronize = HostSync;
}

}  // namespace myriad::cpu

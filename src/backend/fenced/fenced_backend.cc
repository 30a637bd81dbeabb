// See fenced_backend.h. The arena: 64 GiB of address space reserved with
// PROT_NONE and MAP_NORESERVE (no memory is committed until touched), carved
// into page-aligned blocks by a first-fit free list; [base, high) is the
// span ever handed out, and that span alone is opened and closed around
// each backend call (two mprotect calls).
#include "backend/fenced/fenced_backend.h"

#include "core/transport_access.h"

#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

namespace myriad {
namespace {

constexpr size_t kArenaBytes = size_t{64} << 30;

struct Arena {
  std::mutex mu;
  char* base = nullptr;
  size_t high = 0;                       // bytes of [base, base+high) handed out so far
  std::map<size_t, size_t> free_blocks;  // offset -> size, coalesced
  std::map<size_t, size_t> used;         // offset -> size
  size_t in_use = 0;
  int open_calls = 0;                    // backend calls in flight

  Arena() {
    void* p = mmap(nullptr, kArenaBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "[fenced] cannot reserve %zu bytes of address space\n", kArenaBytes);
      std::abort();
    }
    base = static_cast<char*>(p);
  }
  void Protect(size_t from, size_t bytes, int prot) {
    if (bytes && mprotect(base + from, bytes, prot) != 0) {
      std::perror("[fenced] mprotect");
      std::abort();
    }
  }
};

Arena* g_arena = nullptr;

// A fault inside the arena is a host access to device memory: say so, with
// the stack (addr2line -e BINARY ADDR gives the line), then die of the
// signal as before.
void OnSegv(int sig, siginfo_t* info, void*) {
  const char* addr = static_cast<const char*>(info->si_addr);
  if (g_arena && addr >= g_arena->base && addr < g_arena->base + kArenaBytes) {
    char msg[160];
    int n = std::snprintf(msg, sizeof msg,
                          "[fenced] host access to device memory at %p (arena offset %zu) outside a backend call:\n",
                          info->si_addr, static_cast<size_t>(addr - g_arena->base));
    if (n > 0) (void)!write(2, msg, static_cast<size_t>(n));
    void* frames[48];
    backtrace_symbols_fd(frames, backtrace(frames, 48), 2);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

Arena& GetArena() {
  static Arena* a = [] {
    Arena* arena = new Arena();  // never destroyed: blocks may be freed at exit
    g_arena = arena;
    struct sigaction sa = {};
    sa.sa_sigaction = OnSegv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, nullptr);
    return arena;
  }();
  return *a;
}

size_t PageRound(size_t n) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}

// Opens the arena for the duration of one backend call.
void ArenaOpen() {
  Arena& a = GetArena();
  std::lock_guard<std::mutex> l(a.mu);
  if (a.open_calls++ == 0) a.Protect(0, a.high, PROT_READ | PROT_WRITE);
}
void ArenaClose() {
  Arena& a = GetArena();
  std::lock_guard<std::mutex> l(a.mu);
  if (--a.open_calls == 0) a.Protect(0, a.high, PROT_NONE);
}
struct OpenArena {
  OpenArena() { ArenaOpen(); }
  ~OpenArena() { ArenaClose(); }
};

BackendOps g_inner{};


void* FencedAlloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  Arena& a = GetArena();
  const size_t n = PageRound(bytes);
  std::lock_guard<std::mutex> l(a.mu);
  size_t off = SIZE_MAX;
  for (auto it = a.free_blocks.begin(); it != a.free_blocks.end(); ++it) {
    if (it->second < n) continue;
    off = it->first;
    const size_t rest = it->second - n;
    a.free_blocks.erase(it);
    if (rest) a.free_blocks[off + n] = rest;
    break;
  }
  if (off == SIZE_MAX) {
    if (a.high + n > kArenaBytes) {
      std::fprintf(stderr, "[fenced] arena exhausted allocating %zu bytes\n", bytes);
      std::abort();
    }
    off = a.high;
    a.high += n;
    if (a.open_calls > 0) a.Protect(off, n, PROT_READ | PROT_WRITE);
  }
  a.used[off] = n;
  a.in_use += n;
  return a.base + off;
}

void FencedFree(void* p) {
  if (!p) return;
  Arena& a = GetArena();
  std::lock_guard<std::mutex> l(a.mu);
  const size_t off = static_cast<size_t>(static_cast<char*>(p) - a.base);
  auto it = a.used.find(off);
  if (it == a.used.end()) {
    std::fprintf(stderr, "[fenced] mem_free of %p, which mem_alloc did not return\n", p);
    std::abort();
  }
  size_t start = off, size = it->second;
  a.in_use -= size;
  a.used.erase(it);
  madvise(a.base + start, size, MADV_DONTNEED);  // give the pages back; contents are unspecified
  auto next = a.free_blocks.lower_bound(start);
  if (next != a.free_blocks.end() && next->first == start + size) {
    size += next->second;
    next = a.free_blocks.erase(next);
  }
  if (next != a.free_blocks.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      a.free_blocks.erase(prev);
    }
  }
  a.free_blocks[start] = size;
}

void FencedCopy(void* dst, const void* src, size_t bytes, CopyKind kind) {
  OpenArena open;
  g_inner.mem_copy(dst, src, bytes, kind);
}
void FencedSet(void* dst, int value, size_t bytes) {
  OpenArena open;
  g_inner.mem_set(dst, value, bytes);
}

// Every other slot: the inner op with the arena open.
template <typename F>
struct Fence;
template <typename R, typename... A>
struct Fence<R (*)(A...)> {
  template <R (*BackendOps::*M)(A...)>
  static R Call(A... args) {
    OpenArena open;
    return (g_inner.*M)(args...);
  }
};

class FencedBackendImpl final : public Backend {
 public:
  explicit FencedBackendImpl(Backend* inner) : inner_(inner) {
    g_inner = inner->ops();
#define MYRIAD_FENCE_SLOT(slot, req) \
  if (g_inner.slot) ops_.slot = &Fence<decltype(BackendOps::slot)>::template Call<&BackendOps::slot>;
    MYRIAD_BACKEND_SLOTS(MYRIAD_FENCE_SLOT)
#undef MYRIAD_FENCE_SLOT
    ops_.mem_alloc = FencedAlloc;
    ops_.mem_free = FencedFree;
    ops_.mem_copy = FencedCopy;
    ops_.mem_set = FencedSet;
  }
  std::string name() const override { return "fenced-" + inner_->name(); }
  const BackendOps& ops() const override { return ops_; }
  int num_threads() const override { return inner_->num_threads(); }
  Backend* inner() const { return inner_; }

 private:
  Backend* inner_;
  BackendOps ops_{};
};

}  // namespace

Backend* FencedBackend(Backend* inner) {
  static std::mutex mu;
  static FencedBackendImpl* made = nullptr;
  std::lock_guard<std::mutex> l(mu);
  if (!inner) return nullptr;
  if (!made) {
    made = new FencedBackendImpl(inner);
    // Transports (comm) read device memory directly, as a device-aware MPI
    // would: the arena is open for the span of each of their calls.
    SetTransportAccessHooks({ArenaOpen, ArenaClose});
  }
  return made->inner() == inner ? made : nullptr;
}

bool IsFencedPointer(const void* p) {
  Arena& a = GetArena();
  const char* c = static_cast<const char*>(p);
  return c >= a.base && c < a.base + kArenaBytes;
}

size_t FencedBytesInUse() {
  Arena& a = GetArena();
  std::lock_guard<std::mutex> l(a.mu);
  return a.in_use;
}

}  // namespace myriad

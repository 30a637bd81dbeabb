// The fenced backend: a debug backend that proves the seam holds. It wraps
// another backend (the CPU one) and hands out device memory that the host
// cannot touch: every mem_alloc block lives in one reserved arena kept
// PROT_NONE, opened read-write only while a backend call runs. A host
// dereference of device memory anywhere else faults (SIGSEGV) at its line.
//
// Select it with MYRIAD_BACKEND=fenced (ops::Active()); tests may call
// FencedBackend() directly. Calls may come from several threads at once: the
// arena is open while any call is in flight, so a host access racing with an
// op on another thread can go unnoticed; serial host code is always caught.
#pragma once

#include <cstddef>

#include "backend/backend.h"

namespace myriad {

// The fenced wrapper of `inner` (one per process: the first call fixes the
// inner backend; later calls with another inner return null). Never deleted.
Backend* FencedBackend(Backend* inner);

// Whether p points into the fenced arena (tests, diagnostics).
bool IsFencedPointer(const void* p);
// Bytes currently allocated in the arena.
size_t FencedBytesInUse();

}  // namespace myriad

// Transports (MPI, the in-process ranks) read and write device memory
// directly, as a device-aware MPI does. A backend that must know when that
// happens installs hooks here (the fenced backend opens its arena for the
// span of each transport call, so the fence still catches any other host
// access); without hooks a scope costs a load and a branch.
//
// The comm layer opens a scope around each collective, point-to-point call,
// queued operation and request wait; nothing else should.
#pragma once

namespace myriad {

struct TransportAccessHooks {
  void (*begin)() = nullptr;
  void (*end)() = nullptr;
};
// Process-wide; set before any transport runs (a backend's creation).
void SetTransportAccessHooks(TransportAccessHooks hooks);
const TransportAccessHooks& GetTransportAccessHooks();

class ScopedTransportAccess {
 public:
  ScopedTransportAccess() : h_(GetTransportAccessHooks()) {
    if (h_.begin) h_.begin();
  }
  ~ScopedTransportAccess() {
    if (h_.end) h_.end();
  }
  ScopedTransportAccess(const ScopedTransportAccess&) = delete;
  ScopedTransportAccess& operator=(const ScopedTransportAccess&) = delete;

 private:
  TransportAccessHooks h_;
};

}  // namespace myriad

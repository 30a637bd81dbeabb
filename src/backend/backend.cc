// The slot list of backend.h as data: supports(), the parity test and the
// docs check iterate it.
#include "backend/backend.h"

namespace myriad {

namespace {
#define MYRIAD_SLOT_ENTRY(slot, req) \
  BackendSlot{#slot, req, [](const BackendOps& o) { return o.slot != nullptr; }},
const BackendSlot kSlots[] = {MYRIAD_BACKEND_SLOTS(MYRIAD_SLOT_ENTRY)};
#undef MYRIAD_SLOT_ENTRY
}  // namespace

const BackendSlot* BackendSlots() { return kSlots; }

const BackendSlot* FindBackendSlot(const std::string& name) {
  for (const BackendSlot& s : kSlots)
    if (name == s.name) return &s;
  return nullptr;
}

std::string MissingRequiredSlots(const BackendOps& ops) {
  std::string missing;
  for (const BackendSlot& s : kSlots)
    if (s.required && !s.present(ops)) missing += (missing.empty() ? "" : ", ") + std::string(s.name);
  return missing;
}

}  // namespace myriad

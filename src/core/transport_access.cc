#include "core/transport_access.h"

namespace myriad {
namespace {
TransportAccessHooks g_hooks;
}  // namespace

void SetTransportAccessHooks(TransportAccessHooks hooks) { g_hooks = hooks; }
const TransportAccessHooks& GetTransportAccessHooks() { return g_hooks; }

}  // namespace myriad

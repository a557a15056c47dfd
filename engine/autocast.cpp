#include "engine/autocast.h"

#include "engine/tensor.h"

namespace nd {

namespace {
thread_local bool g_enabled[2] = {false, false};  // indexed by DeviceType
int index_of(DeviceType t) { return t == kCUDA ? 1 : 0; }
}  // namespace

AutocastGuard::AutocastGuard(DeviceType device_type, bool enabled)
    : device_type_(device_type), previous_(g_enabled[index_of(device_type)]) {
  g_enabled[index_of(device_type)] = enabled;
}

AutocastGuard::~AutocastGuard() { g_enabled[index_of(device_type_)] = previous_; }

bool is_autocast_enabled(DeviceType device_type) { return g_enabled[index_of(device_type)]; }

bool autocast_applies(const Tensor& t) { return t.dtype() == kFloat32 && is_autocast_enabled(t.device().type); }

}  // namespace nd

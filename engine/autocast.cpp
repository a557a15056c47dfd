#include "engine/autocast.h"

#include "engine/error.h"
#include "engine/tensor.h"

namespace nd {

namespace {
thread_local bool g_enabled[2] = {false, false};  // indexed by DeviceType
thread_local ScalarType g_dtype[2] = {kBFloat16, kBFloat16};
int index_of(DeviceType t) { return t == kCUDA ? 1 : 0; }
}  // namespace

AutocastGuard::AutocastGuard(DeviceType device_type, bool enabled, ScalarType dtype)
    : device_type_(device_type), previous_(g_enabled[index_of(device_type)]),
      previous_dtype_(g_dtype[index_of(device_type)]) {
  ND_CHECK(dtype == kBFloat16 || dtype == kFloat16, "AutocastGuard: expected dtype bf16 or f16, found ",
           dtype_name(dtype));
  g_enabled[index_of(device_type)] = enabled;
  g_dtype[index_of(device_type)] = dtype;
}

AutocastGuard::~AutocastGuard() {
  g_enabled[index_of(device_type_)] = previous_;
  g_dtype[index_of(device_type_)] = previous_dtype_;
}

ScalarType autocast_dtype(DeviceType device_type) { return g_dtype[index_of(device_type)]; }

bool is_autocast_enabled(DeviceType device_type) { return g_enabled[index_of(device_type)]; }

bool autocast_applies(const Tensor& t) { return t.dtype() == kFloat32 && is_autocast_enabled(t.device().type); }

}  // namespace nd

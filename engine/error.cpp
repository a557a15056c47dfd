#include "engine/error.h"

#include <iostream>
#include <mutex>

namespace nd {
namespace {
std::mutex g_warning_mutex;
WarningHandler& handler_slot() {
  static WarningHandler h;
  return h;
}
}  // namespace

WarningHandler set_warning_handler(WarningHandler handler) {
  std::lock_guard<std::mutex> lock(g_warning_mutex);
  WarningHandler old = std::move(handler_slot());
  handler_slot() = std::move(handler);
  return old;
}

void warn(const std::string& message) {
  WarningHandler h;
  {
    std::lock_guard<std::mutex> lock(g_warning_mutex);
    h = handler_slot();
  }
  if (h)
    h(message);
  else
    std::cerr << "nanoddp warning: " << message << std::endl;
}

}  // namespace nd

#pragma once
// The engine's error helpers around nd::Error, the one exception type (defined in
// kernels/common/error.h so kernels throw it too): ND_CHECK and warnings. Messages say
// what was expected, what was found, and which tensor/parameter/op; docs/contributing.md.
#include <functional>
#include <sstream>
#include <string>

#include "kernels/common/error.h"

namespace nd {

namespace detail {
template <class... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// Warnings go through one handler so tests can capture them and apps can route them.
using WarningHandler = std::function<void(const std::string&)>;
// Installs `handler` (nullptr restores the default, which prints "nanoddp warning: ..."
// to stderr); returns the previous handler.
WarningHandler set_warning_handler(WarningHandler handler);
void warn(const std::string& message);

}  // namespace nd

// ND_CHECK(cond, parts...): throw nd::Error built from parts when cond is false.
#define ND_CHECK(cond, ...)                                      \
  do {                                                           \
    if (!(cond)) throw ::nd::Error(::nd::detail::str_cat(__VA_ARGS__)); \
  } while (0)

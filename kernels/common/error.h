#pragma once
// nd::Error, nanoddp's one exception type, defined at the lowest layer so that kernels
// (the CUDA runtime wrappers, the allocators) throw the same type the engine throws and
// users catch: no translation at each layer's border. Messages say what was expected,
// what was found and what to do. The engine's helpers around it (ND_CHECK, warnings) are
// engine/error.h.
#include <stdexcept>
#include <string>

namespace nd {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace nd

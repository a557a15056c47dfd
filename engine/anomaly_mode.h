#pragma once
// Anomaly mode (PyTorch: torch.autograd.set_detect_anomaly, torch::autograd::DetectAnomalyGuard):
// while it is on, every recorded op remembers where the user called it, forward outputs are
// checked for NaN/inf, and a backward node that returns NaN or inf throws an nd::Error
// naming the node, the tensor its gradient was for, the user's line that ran its forward,
// and the first forward op of the graph that produced a non-finite value.
//
// Why call sites look like this: std::source_location::current() names the user's line
// only as a defaulted argument of the function the user calls. So the functions users
// call for math (engine/ops/{elementwise,reduce,loss,matmul}.h) take a trailing
// `autograd::CallSite = {}` that nobody passes. A CallSite is constructed at the user's
// call and lives until the end of the user's full expression, so every op run inside
// it (nested library calls, and operators such as `-nd::log(p).mean()` on the same line)
// inherits the outermost user call site. Calls made from the library's own engine/
// sources never claim the site: an op that an operator or a module runs outside any
// user call site reports none (docs/anomaly.md). A user can open one explicitly
// (`nd::autograd::CallSite here;`) around code that runs only operators or modules.
//
// Cost when off: CallSite's constructor and destructor are inline and read one relaxed
// atomic bool; recording an op reads it once more. Nothing is allocated. Measured in
// bench/RESULTS.md ("Anomaly mode").
// Tests: tests/engine/anomaly_mode_test.cpp.
#include <atomic>
#include <source_location>
#include <string>
#include <vector>

namespace nd {
class Tensor;
}

namespace nd::autograd {

// std::source_location where the standard library has it. Clang before 15 with libstdc++ 12
// (tests/fuzz builds the engine with clang 14) lacks __builtin_source_location, so
// <source_location> is empty there: a stand-in with the members used here, from the
// builtins that name the caller's place as default arguments.
#if defined(__cpp_lib_source_location)
using SourceLocation = std::source_location;
#else
class SourceLocation {
 public:
  static constexpr SourceLocation current(const char* file = __builtin_FILE(), const char* function = __builtin_FUNCTION(),
                                          unsigned line = __builtin_LINE()) noexcept {
    SourceLocation here;
    here.file_ = file, here.function_ = function, here.line_ = line;
    return here;
  }
  constexpr const char* file_name() const noexcept { return file_; }
  constexpr const char* function_name() const noexcept { return function_; }
  constexpr unsigned line() const noexcept { return line_; }
  constexpr unsigned column() const noexcept { return 0; }

 private:
  const char* file_ = "";
  const char* function_ = "";
  unsigned line_ = 0;
};
#endif

namespace detail {
extern std::atomic<bool> g_anomaly_enabled;
}

// Global switch, as PyTorch's (not per thread). Off by default.
inline bool is_anomaly_enabled() { return detail::g_anomaly_enabled.load(std::memory_order_relaxed); }
void set_detect_anomaly(bool enabled);

// Turns anomaly mode on for its lifetime and then restores the previous state.
class DetectAnomalyGuard {
 public:
  DetectAnomalyGuard() : prev_(is_anomaly_enabled()) { set_detect_anomaly(true); }
  ~DetectAnomalyGuard() { set_detect_anomaly(prev_); }
  DetectAnomalyGuard(const DetectAnomalyGuard&) = delete;
  DetectAnomalyGuard& operator=(const DetectAnomalyGuard&) = delete;

 private:
  bool prev_;
};

// The place in the user's code that is running ops (see the comment at the top).
class CallSite {
 public:
  CallSite(SourceLocation where = SourceLocation::current()) : where_(where) {  // NOLINT: implicit
    if (is_anomaly_enabled()) enter();
  }
  ~CallSite() {
    if (owner_) leave();
  }
  CallSite(const CallSite&) = delete;
  CallSite& operator=(const CallSite&) = delete;

  // The call site ops are now recorded under on this thread, or null.
  static const SourceLocation* current();

 private:
  void enter();
  void leave();
  SourceLocation where_;
  bool owner_ = false;
};

// What an op recorded while anomaly mode was on (Node::anomaly).
struct AnomalyMetadata {
  SourceLocation call_site;
  bool has_call_site = false;
  std::vector<std::string> inputs;  // describe() of each forward input, in next_edges order
  std::string nonfinite_output;     // "-inf in output 0 [cpu f32 [4]]", when the forward made one
};

}  // namespace nd::autograd

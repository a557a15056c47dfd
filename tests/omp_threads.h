#pragma once
// OpenMP's thread count for one scope: set on construction (and by set()), restored when
// the scope ends, also when a REQUIRE throws out of it, so a failing test does not leave
// the next one with another thread count.
#include <omp.h>

namespace nd::testing {

class OmpThreads {
 public:
  explicit OmpThreads(int threads) : saved_(omp_get_max_threads()) { omp_set_num_threads(threads); }
  ~OmpThreads() { omp_set_num_threads(saved_); }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;
  void set(int threads) { omp_set_num_threads(threads); }

 private:
  int saved_;
};

}  // namespace nd::testing

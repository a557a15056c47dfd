#include "scale_model/step_model.h"

#include <algorithm>

#include <nanoddp.h>

namespace nd::scale {

namespace {

struct Launch {
  double at, first, second;
  size_t order;  // (model, bucket) in the Reducer's wait order
};

// When a backward's communication is done, compute having been delayed by `shift` so far.
double run_backward(const Backward& b, double shift) {
  std::vector<Launch> launches;
  for (const std::vector<BucketComm>& buckets : b.models) {
    double previous = b.start;
    for (size_t k = 0; k < buckets.size(); ++k) {
      const BucketComm& c = buckets[k];
      ND_CHECK(c.first >= 0 && c.second >= 0, "simulate_step: negative communication cost (", c.first, ", ", c.second,
               ")");
      const double at = k + 1 == buckets.size() ? b.end : std::max(previous, std::min(c.ready, b.end));
      previous = at;
      launches.push_back({at + shift, c.first, c.second, launches.size()});
    }
  }
  std::stable_sort(launches.begin(), launches.end(), [](const Launch& x, const Launch& y) { return x.at < y.at; });
  double free = 0;
  std::vector<double> first_done(launches.size());
  for (const Launch& l : launches) {
    free = std::max(free, l.at) + l.first;
    first_done[l.order] = free;
  }
  std::sort(launches.begin(), launches.end(), [](const Launch& x, const Launch& y) { return x.order < y.order; });
  double done = b.end + shift;
  for (const Launch& l : launches) {  // second rounds: issued at the wait, in index order
    if (l.second > 0) free = std::max({free, first_done[l.order], b.end + shift}) + l.second;
    done = std::max({done, first_done[l.order], free});
  }
  return done;
}

}  // namespace

StepResult simulate_step(const StepInput& in) {
  ND_CHECK(in.compute >= 0 && in.before >= 0 && in.after >= 0, "simulate_step: negative time (compute ", in.compute,
           ", before ", in.before, ", after ", in.after, ")");
  StepResult r;
  r.comm = in.before + in.after;
  double shift = in.before;  // what communication has delayed compute so far
  for (const Backward& b : in.backwards) {
    ND_CHECK(b.start >= 0 && b.start <= b.end && b.end <= in.compute, "simulate_step: a backward from ", b.start,
             " s to ", b.end, " s does not lie in a step of ", in.compute, " s");
    double sum = 0;
    for (const auto& buckets : b.models)
      for (const BucketComm& c : buckets) sum += c.first + c.second;
    r.comm += sum;
    if (!in.overlap) {
      shift += sum;
      continue;
    }
    shift = run_backward(b, shift) - b.end;
  }
  r.step = in.compute + shift + in.after;
  r.exposed = r.step - in.compute;
  r.hidden = std::max(0.0, r.comm - r.exposed);
  return r;
}

}  // namespace nd::scale

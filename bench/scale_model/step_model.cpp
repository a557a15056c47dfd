#include "scale_model/step_model.h"

#include <algorithm>

#include <nanoddp.h>

namespace nd::scale {

namespace {

struct Launch {
  double at;
  const BucketComm* c;
  size_t order;  // (model, bucket) in the Reducer's wait order
};

// When a backward's communication and the hooks' work are done, compute having been delayed by
// `shift` so far.
double run_backward(const Backward& b, double shift) {
  std::vector<Launch> launches;
  for (const std::vector<BucketComm>& buckets : b.models) {
    double previous = b.start;
    for (size_t k = 0; k < buckets.size(); ++k) {
      const BucketComm& c = buckets[k];
      const double at = k + 1 == buckets.size() ? b.end : std::max(previous, std::min(c.ready, b.end));
      previous = at;
      launches.push_back({at + shift, &c, launches.size()});
    }
  }
  std::stable_sort(launches.begin(), launches.end(), [](const Launch& x, const Launch& y) { return x.at < y.at; });
  // Each hook's launch work delays the backward after it, and its first collective.
  double free = 0, delay = 0;
  std::vector<double> first_done(launches.size());
  for (const Launch& l : launches) {
    delay += l.c->launch_compute;
    free = std::max(free, l.at + delay) + l.c->first;
    first_done[l.order] = free;
  }
  std::sort(launches.begin(), launches.end(), [](const Launch& x, const Launch& y) { return x.order < y.order; });
  double done = b.end + shift + delay;  // the waits, in index order, on backward's thread
  for (const Launch& l : launches) {
    done = std::max(done, first_done[l.order]) + l.c->wait_compute;
    if (l.c->second > 0) done = free = std::max(free, done) + l.c->second;  // issued at the wait
  }
  return done;
}

}  // namespace

StepResult simulate_step(const StepInput& in) {
  ND_CHECK(in.compute >= 0 && in.before >= 0 && in.after >= 0 && in.skew >= 0, "simulate_step: negative time (compute ",
           in.compute, ", before ", in.before, ", after ", in.after, ", skew ", in.skew, ")");
  StepResult r;
  r.comm = in.before + in.after;
  double shift = in.before;  // what communication has delayed compute so far
  for (const Backward& b : in.backwards) {
    ND_CHECK(b.start >= 0 && b.start <= b.end && b.end <= in.compute, "simulate_step: a backward from ", b.start,
             " s to ", b.end, " s does not lie in a step of ", in.compute, " s");
    double sum = 0, hook = 0;
    for (const auto& buckets : b.models)
      for (const BucketComm& c : buckets) {
        ND_CHECK(c.first >= 0 && c.second >= 0 && c.launch_compute >= 0 && c.wait_compute >= 0,
                 "simulate_step: negative cost (communication ", c.first, ", ", c.second, "; hook compute ",
                 c.launch_compute, ", ", c.wait_compute, ")");
        sum += c.first + c.second;
        hook += c.launch_compute + c.wait_compute;
      }
    r.comm += sum;
    r.hook += hook;
    if (!in.overlap) {
      shift += sum + hook;
      continue;
    }
    shift = run_backward(b, shift) - b.end;
  }
  r.step = in.compute + shift + in.after + in.skew;
  r.exposed = r.step - in.compute;
  r.hidden = std::max(0.0, r.comm + r.hook + in.skew - r.exposed);
  return r;
}

}  // namespace nd::scale

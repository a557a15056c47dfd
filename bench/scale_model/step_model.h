// The timeline of one DDP training step with its communication, as the Reducer runs it:
// each backward's gradient buckets launch in index order as their last gradient becomes ready
// (bucket k not before bucket k - 1), every model's last bucket at the end of that backward
// (it carries the status slots), all on one communication channel in launch order; the end
// of backward waits for every collective (Reducer::finish_iteration), so what is not done by
// then delays the rest of the step. A bucket may have a second round after the end of
// backward (PowerSGD's Q all-reduce, issued when the Reducer waits for the bucket, in index
// order). A communication hook's own compute (casts, PowerSGD's matmuls and QR) runs where the
// Reducer calls it, on the thread (or stream) of backward: what it does at the launch delays the
// rest of backward, what it does at the wait runs before that bucket's wait returns (PowerSGD's
// second round is issued from there). Times are in seconds from the start of the step, costs
// in seconds (the caller prices them: collective_cost.h); nothing here knows bytes or networks.
#pragma once

#include <vector>

namespace nd::scale {

struct BucketComm {
  double ready = 0;   // when its last gradient is ready
  double first = 0;   // its collective(s) launched then
  double second = 0;  // a round after the end of backward (0: none)
  double launch_compute = 0;  // the hook's compute before its first collective (delays backward)
  double wait_compute = 0;    // the hook's compute at the wait (decompression, PowerSGD's QR)
};

struct Backward {
  double start = 0, end = 0;                   // the backward's compute, without communication
  std::vector<std::vector<BucketComm>> models;  // per DDP model it reaches: its buckets, launch order
};

struct StepInput {
  double compute = 0;              // the whole step without communication
  std::vector<Backward> backwards;  // in order, within [0, compute]
  double before = 0;               // blocking communication at the start (buffer broadcasts)
  double after = 0;                // blocking communication at the end (ZeRO's all-gather)
  double skew = 0;                 // waiting for the slowest rank, once per step (never hidden)
  bool overlap = true;             // false: no communication overlaps compute (CPU MPI)
};

struct StepResult {
  double step = 0;     // predicted step time
  double comm = 0;     // every collective's cost, summed
  double hook = 0;     // every hook's compute, summed (never hidden)
  double exposed = 0;  // step - compute: what communication, the hooks' compute and the skew added
  double hidden = 0;   // comm + hook - exposed: what of both ran behind other work
};

// nd::Error when a backward ends before it starts or outside [0, compute], or a cost is negative.
StepResult simulate_step(const StepInput& input);

}  // namespace nd::scale

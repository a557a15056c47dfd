#pragma once
// CUDA graphs: a whole training step captured once and replayed with one launch (PyTorch's
// torch.cuda.CUDAGraph). docs/cuda_graphs.md says what can be captured and what is refused.
//
//   nd::cuda::Graph graph(0);          // cuda:0
//   graph.capture_begin();             // the device's work now goes to a side stream, recorded
//   ... forward, loss, backward, optimizer step on static tensors ...
//   graph.capture_end();
//   for (...) { input.copy_(batch); graph.replay(); }   // replays on the compute stream
//
// While capturing, compute_stream(device) and use_device(device) return the graph's own
// stream, so every op of the engine is recorded there; the caching allocator serves that
// stream from the graph's private pool (allocator.h), whose blocks stay reserved for the
// graph's life, so the addresses a replay writes stay the tensors made during the capture.
// Compiled in every build; without NANODDP_WITH_CUDA the constructor throws.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/stream.h"

struct CUgraphExec_st;

namespace nd::kernels::cuda {

class Graph {
 public:
  explicit Graph(int device);
  ~Graph();  // synchronises the device's compute stream, then frees the graph and its pool
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // requires: no capture on this device, this graph not captured yet. The side stream first
  // waits for the compute stream, so the capture starts after the warm-up's work.
  void capture_begin();
  // requires: capture_begin. An operation that cannot be captured has already thrown, naming
  // itself; a capture the runtime invalidated is an nd::Error here.
  void capture_end();
  // Launches the captured step on the device's compute stream. requires: capture_end.
  void replay();
  int device() const { return device_; }
  int64_t num_nodes() const { return nodes_; }  // kernels, copies, memsets captured

 private:
  friend void on_replay(int device, std::function<void(cudaStream_t)> fn);
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  CUgraphExec_st* exec_ = nullptr;
  bool capturing_ = false;
  int64_t nodes_ = 0;
  std::vector<std::function<void(cudaStream_t)>> on_replay_;  // on_replay's, in order
};

// While this thread captures `device`: `fn(stream)` runs after each replay of that graph has
// been launched, with the stream it was launched on (the NCCL process group watches its
// captured collectives with an event recorded there). Otherwise nothing.
void on_replay(int device, std::function<void(cudaStream_t)> fn);

// The stream `device`'s work is being captured on, or null: compute_stream(device) returns it.
cudaStream_t capture_stream(int device);
// The compute stream that capture stream's work follows (null when not capturing): what was
// queued there before capture_begin is ordered before the captured work and every replay.
cudaStream_t capture_origin(int device);
// Whether this thread is capturing a device's work (a CPU op then cannot be part of the
// step). Other threads, a DataLoader's workers, are not concerned.
bool capture_active();
// nd::Error "cannot <what> while a CUDA graph is being captured on cuda:<device> (<why>)"
// when this thread is capturing `device` (any device when -1).
void refuse_during_capture(int device, const std::string& what, const std::string& why);

}  // namespace nd::kernels::cuda

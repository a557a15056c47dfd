// CUDA graphs: capture on a side stream made the device's compute stream, replay on the
// compute stream; see graph.h.
#include "kernels/cuda/graph.h"

#include <mutex>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/cuda/allocator.h"

#ifdef NANODDP_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace nd::kernels::cuda {

namespace {
// The capture stream of each device (null: none). Process-wide, as the compute streams are.
std::mutex g_mutex;
std::vector<cudaStream_t> g_capturing, g_origin;
std::vector<Graph*> g_graph;  // the graph capturing each device
// Captures this thread began and has not ended: the one check every CPU op makes. Other
// threads (a DataLoader's workers) keep running CPU ops while a step is captured.
thread_local int t_captures = 0;

void set_capture_stream(int device, cudaStream_t stream, cudaStream_t origin, Graph* graph) {
  std::lock_guard lock(g_mutex);
  if (device >= static_cast<int>(g_capturing.size())) {
    g_capturing.resize(device + 1, nullptr);
    g_origin.resize(device + 1, nullptr);
    g_graph.resize(device + 1, nullptr);
  }
  t_captures += (stream != nullptr) - (g_capturing[device] != nullptr);
  g_capturing[device] = stream;
  g_origin[device] = origin;
  g_graph[device] = graph;
}
}  // namespace

cudaStream_t capture_stream(int device) {
  std::lock_guard lock(g_mutex);
  return device >= 0 && device < static_cast<int>(g_capturing.size()) ? g_capturing[device] : nullptr;
}

cudaStream_t capture_origin(int device) {
  std::lock_guard lock(g_mutex);
  return device >= 0 && device < static_cast<int>(g_origin.size()) ? g_origin[device] : nullptr;
}

bool capture_active() { return t_captures > 0; }

void on_replay(int device, std::function<void(cudaStream_t)> fn) {
  if (!capture_active()) return;
  std::lock_guard lock(g_mutex);
  if (device >= 0 && device < static_cast<int>(g_graph.size()) && g_graph[device] != nullptr)
    g_graph[device]->on_replay_.push_back(std::move(fn));
}

void refuse_during_capture(int device, const std::string& what, const std::string& why) {
  if (!capture_active()) return;
  int capturing = -1;
  {
    std::lock_guard lock(g_mutex);
    for (int d = 0; d < static_cast<int>(g_capturing.size()); ++d)
      if (g_capturing[d] != nullptr && (device < 0 || device == d)) capturing = d;
  }
  if (capturing >= 0)
    throw Error("cannot " + what + " while a CUDA graph is being captured on cuda:" + std::to_string(capturing) +
                " (" + why + ")");
}

#ifdef NANODDP_WITH_CUDA

Graph::Graph(int device) : device_(device) {
  const std::string what = "Graph on cuda:" + std::to_string(device);
  check(cudaSetDevice(device), "cudaSetDevice", what);
  check(cudaStreamCreate(&stream_), "cudaStreamCreate", what);
  hold_private_pool(device, stream_);
}

Graph::~Graph() {
  if (capturing_) {  // an exception left the capture open: end it, keep nothing
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream_, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    set_capture_stream(device_, nullptr, nullptr, nullptr);
  }
  cudaSetDevice(device_);
  cudaStreamSynchronize(compute_stream(device_));  // no replay still writes the pool
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  release_private_pool(device_, stream_, compute_stream(device_));
  cudaStreamDestroy(stream_);
  cudaGetLastError();  // never throws: a destructor
}

void Graph::capture_begin() {
  require(!capturing_ && exec_ == nullptr, "Graph::capture_begin", "this graph was already captured");
  require(capture_stream(device_) == nullptr, "Graph::capture_begin",
          "cuda:" + std::to_string(device_) + " is already being captured by another graph");
  const cudaStream_t compute = use_device(device_);
  Event ready(device_);  // the side stream starts after the work queued before the capture
  ready.record(compute);
  ready.wait(stream_);
  check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture", "Graph::capture_begin");
  capturing_ = true;
  set_capture_stream(device_, stream_, compute, this);
}

void Graph::capture_end() {
  require(capturing_, "Graph::capture_end", "no capture_begin before it");
  capturing_ = false;
  set_capture_stream(device_, nullptr, nullptr, nullptr);
  cudaGraph_t graph = nullptr;
  check(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture", "Graph::capture_end");
  size_t nodes = 0;
  cudaError_t err = cudaGraphGetNodes(graph, nullptr, &nodes);
  if (err == cudaSuccess) err = cudaGraphInstantiate(&exec_, graph, 0);
  cudaGraphDestroy(graph);
  check(err, "cudaGraphInstantiate", "Graph::capture_end");
  nodes_ = static_cast<int64_t>(nodes);
}

void Graph::replay() {
  require(exec_ != nullptr, "Graph::replay", "nothing captured (capture_begin and capture_end first)");
  const cudaStream_t stream = use_device(device_);
  check(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch", "Graph::replay");
  for (const auto& fn : on_replay_) fn(stream);
}

#else  // CPU-only build

Graph::Graph(int device) : device_(device) {
  throw Error("nanoddp was built without CUDA (NANODDP_CUDA=OFF or no nvcc at configure time)");
}
Graph::~Graph() = default;
void Graph::capture_begin() {}
void Graph::capture_end() {}
void Graph::replay() {}

#endif

}  // namespace nd::kernels::cuda

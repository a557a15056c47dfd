#pragma once
// Emulator stand-in for CUDA's stream capture and graphs (part of cuda_runtime.h, included at
// its end): the calls nanoddp's CUDA graphs make, with the real runtime's signatures and
// error codes.
// - cudaStreamBeginCapture(stream, mode): from then on, every kernel launch, copy, memset and
//   event record queued on `stream` becomes a node of the capture's graph (a kernel's
//   arguments copied at the launch) and does not run. The legacy null stream cannot be
//   captured (cudaErrorStreamCaptureUnsupported); a stream already capturing gives
//   cudaErrorIllegalState.
// - During a capture (cuda_runtime.h): cudaStreamSynchronize of the capturing stream, and the
//   "potentially unsafe" calls cudaMalloc, cudaFree and cudaDeviceSynchronize where the
//   capture's mode and the thread's (cudaThreadExchangeStreamCaptureMode) forbid them, fail
//   with cudaErrorStreamCaptureUnsupported and invalidate the capture; a copy between the
//   host and the device on the capturing stream must use pinned memory (otherwise the same);
//   an operation on an invalidated capture fails with cudaErrorStreamCaptureInvalidated and
//   cudaStreamEndCapture then returns that error and no graph. cudaEventQuery/Synchronize of
//   an event last recorded in a capture: cudaErrorCapturedEvent.
// - Other streams (cuda_runtime.h's cudaStreamWaitEvent): a stream waiting for an event
//   recorded in the capture is forked into it (its work becomes nodes after the event's) and
//   joins back when a stream of the capture waits for an event recorded on it;
//   cudaStreamEndCapture on a forked stream fails with cudaErrorStreamCaptureUnmatched (the
//   capture stays open, invalidated), and on the origin with cudaErrorStreamCaptureUnjoined
//   (no graph) when some node is not an ancestor of the origin's last ones (a fork not joined).
//   Waiting in a capture for an event of another capture: cudaErrorStreamCaptureMerge; for one
//   recorded outside any capture without cudaEventWaitExternal: cudaErrorStreamCaptureIsolation
//   (each invalidates).
// - cudaGraphInstantiate copies the graph's nodes; cudaGraphLaunch(exec, stream) runs them in
//   the order they were queued (every dependency points backwards in it) on `stream` (kernels
//   through emu_launch_allowed: traced, faults as any launch; host nodes, nccl.h's collectives,
//   call the library again).
// Not emulated: graphs built by hand (cudaGraphAdd*Node), child graphs (a graph launched into
// a capturing stream), graph updates, conditional nodes, memory nodes (cudaMallocAsync),
// concurrency between a graph's branches.

namespace emu_rt {
struct Graph {
  std::vector<GraphNode> nodes;
};
inline std::set<const Graph*>& graphs() {  // caller holds the mutex
  static auto* g = new std::set<const Graph*>();
  return *g;
}
inline std::set<const Graph*>& graph_execs() {  // caller holds the mutex
  static auto* g = new std::set<const Graph*>();
  return *g;
}
}  // namespace emu_rt

struct CUgraph_st : emu_rt::Graph {};
struct CUgraphExec_st : emu_rt::Graph {};
typedef CUgraph_st* cudaGraph_t;
typedef CUgraphExec_st* cudaGraphExec_t;
struct CUgraphNode_st;
typedef CUgraphNode_st* cudaGraphNode_t;

inline cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  if (mode == nullptr || unsigned(*mode) > cudaStreamCaptureModeRelaxed) return emu_rt::fail(cudaErrorInvalidValue);
  std::swap(*mode, emu_rt::thread_capture_mode);
  return cudaSuccess;
}

inline cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  using namespace emu_rt;
  if (unsigned(mode) > cudaStreamCaptureModeRelaxed) return fail(cudaErrorInvalidValue);
  if (stream == nullptr) return fail(cudaErrorStreamCaptureUnsupported);
  int device = 0;
  if (cudaError_t e = stream_device(stream, &device); e != cudaSuccess) return e;
  std::lock_guard lock(state().mutex);
  if (capture_of(stream) != nullptr) return fail(cudaErrorIllegalState);
  auto c = std::make_shared<Capture>();
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->id = state().next_capture++;
  c->origin = stream;
  c->frontier[stream] = {};
  state().captures[stream] = std::move(c);
  return cudaSuccess;
}

namespace emu_rt {
// Every node of the capture is the origin stream's frontier or one of its ancestors: each fork
// was joined back (an event recorded on the forked stream after its last node, waited for by
// the origin stream, directly or through other streams of the capture).
inline bool joined(const Capture& c) {
  std::vector<bool> reached(c.nodes.size(), false);
  std::vector<size_t> todo = c.frontier.at(c.origin);
  while (!todo.empty()) {
    const size_t n = todo.back();
    todo.pop_back();
    if (reached[n]) continue;
    reached[n] = true;
    todo.insert(todo.end(), c.nodes[n].deps.begin(), c.nodes[n].deps.end());
  }
  return std::find(reached.begin(), reached.end(), false) == reached.end();
}
// A capture query's output pointer is given and its stream exists.
inline cudaError_t check_capture_query(cudaStream_t stream, const void* out) {
  if (out == nullptr) return fail(cudaErrorInvalidValue);
  int device = 0;
  return stream_device(stream, &device);
}
}  // namespace emu_rt

inline cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  using namespace emu_rt;
  if (cudaError_t e = check_capture_query(stream, graph); e != cudaSuccess) return e;
  std::lock_guard lock(state().mutex);
  Capture* c = capture_of(stream);
  if (c == nullptr) return fail(cudaErrorIllegalState);
  if (c->origin != stream) {  // a forked stream: the capture stays open, invalidated
    c->invalidated = true;
    return fail(cudaErrorStreamCaptureUnmatched);
  }
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id())
    return fail(cudaErrorStreamCaptureWrongThread);
  *graph = nullptr;
  const std::shared_ptr<Capture> ended = state().captures[stream];
  std::erase_if(state().captures, [&](const auto& member) { return member.second == ended; });
  if (ended->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  if (!joined(*ended)) return fail(cudaErrorStreamCaptureUnjoined);
  auto* g = new CUgraph_st();
  g->nodes = std::move(ended->nodes);
  graphs().insert(g);
  *graph = g;
  return cudaSuccess;
}

inline cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  using namespace emu_rt;
  if (cudaError_t e = check_capture_query(stream, status); e != cudaSuccess) return e;
  std::lock_guard lock(state().mutex);
  const Capture* c = capture_of(stream);
  *status = c == nullptr ? cudaStreamCaptureStatusNone
                         : c->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags = 0) {
  using namespace emu_rt;
  if (exec == nullptr || flags != 0) return fail(cudaErrorInvalidValue);
  std::lock_guard lock(state().mutex);
  if (graph == nullptr || !graphs().count(graph)) return fail(cudaErrorInvalidValue);
  auto* e = new CUgraphExec_st();
  e->nodes = graph->nodes;
  graph_execs().insert(e);
  *exec = e;
  return cudaSuccess;
}

// Only the count (nodes == null): the library reports how many operations a graph holds.
inline cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* count) {
  using namespace emu_rt;
  if (count == nullptr || nodes != nullptr) return fail(cudaErrorInvalidValue);
  std::lock_guard lock(state().mutex);
  if (graph == nullptr || !graphs().count(graph)) return fail(cudaErrorInvalidValue);
  *count = graph->nodes.size();
  return cudaSuccess;
}

namespace emu_rt {
// A graph or executable graph of `registry`, destroyed; null or unknown: cudaErrorInvalidValue.
template <class G>
cudaError_t destroy_graph(G* g, std::set<const Graph*>& registry) {
  std::lock_guard lock(state().mutex);
  if (g == nullptr || !registry.erase(g)) return fail(cudaErrorInvalidValue);
  delete g;
  return cudaSuccess;
}
}  // namespace emu_rt
inline cudaError_t cudaGraphDestroy(cudaGraph_t graph) { return emu_rt::destroy_graph(graph, emu_rt::graphs()); }
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) { return emu_rt::destroy_graph(exec, emu_rt::graph_execs()); }

// Runs the nodes in order on `stream`, as if each had been queued there.
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  using namespace emu_rt;
  int device = 0;
  if (cudaError_t e = stream_device(stream, &device); e != cudaSuccess) return e;
  std::vector<GraphNode>* nodes = nullptr;
  {
    std::lock_guard lock(state().mutex);
    if (exec == nullptr || !graph_execs().count(exec)) return fail(cudaErrorInvalidValue);
    if (capture_of(stream) != nullptr) return fail(cudaErrorStreamCaptureUnsupported);  // child graphs: not emulated
    ++state().stats.graph_launches;
    nodes = &exec->nodes;
  }
  for (GraphNode& n : *nodes) {
    if (n.kind == GraphNode::kHost) {
      n.kernel();
      continue;
    }
    if (n.kind == GraphNode::kKernel) {
      if (emu_launch_allowed(stream, n.name.c_str())) emu_launch_impl(n.grid, n.block, n.smem, n.name.c_str(), n.kernel);
      continue;
    }
    if (n.kind == GraphNode::kCopy) std::memmove(n.dst, n.src, n.bytes);
    if (n.kind == GraphNode::kMemset) std::memset(n.dst, n.value, n.bytes);
    if (n.dst != nullptr) emu_san::host_wrote(n.dst, n.bytes);
    std::lock_guard lock(state().mutex);
    if (n.kind == GraphNode::kEventRecord) {
      if (!state().events.count(n.event)) continue;  // destroyed since: nothing to record
      ++state().stats.event_records;
      n.event->pending = state().hold_events;
      n.event->captured = false;
    } else {
      ++(n.kind == GraphNode::kCopy ? state().stats.memcpys : state().stats.memsets);
    }
    traced({stream, "", n.dst, n.event});
  }
  return cudaSuccess;
}

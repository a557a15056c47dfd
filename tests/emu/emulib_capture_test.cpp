// The runtime stand-in's stream capture and graphs (include/emu_graph.h), with the library's
// real launchers: what a capture records, what a replay runs, and every call the real runtime
// refuses during a capture, with its error code and the capture's state after it.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "engine/error.h"
#include "kernels/cuda/elementwise.h"

namespace kc = nd::kernels::cuda;

namespace {

struct Fixture {
  cudaStream_t stream = nullptr;
  float* a = nullptr;
  Fixture() {
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
    REQUIRE(cudaMalloc(&a, 64 * sizeof(float)) == cudaSuccess);
  }
  ~Fixture() {  // a failed check may leave the capture open: end it first
    cudaGraph_t g = nullptr;
    if (cudaStreamEndCapture(stream, &g) == cudaSuccess) cudaGraphDestroy(g);
    cudaFree(a);
    cudaStreamDestroy(stream);
    cudaGetLastError();
  }
  // a += s over 64 values: the shape and strides live on this call's stack only, so a replay
  // that did not copy the launch's arguments would read them dangling.
  void add(float s) const { add_on(stream, a, s); }
  // p += s over 64 values, queued on `on`.
  static void add_on(cudaStream_t on, float* p, float s) {
    const int64_t shape[1] = {64}, strides[1] = {1};
    kc::binary_scalar<float>(kc::BinaryOp::add, 1, shape, p, strides, s, false, p, strides, on);
  }
  cudaStreamCaptureStatus status() const {
    cudaStreamCaptureStatus s = cudaStreamCaptureStatusNone;
    REQUIRE(cudaStreamIsCapturing(stream, &s) == cudaSuccess);
    return s;
  }
  // Ends the capture, which an earlier refused call invalidated: no graph comes back.
  void end_invalidated() const {
    static CUgraph_st sentinel;
    cudaGraph_t g = &sentinel;
    CHECK(cudaStreamEndCapture(stream, &g) == cudaErrorStreamCaptureInvalidated);
    CHECK(g == nullptr);
    CHECK(status() == cudaStreamCaptureStatusNone);
    cudaGetLastError();
  }
};

std::vector<float> read(const float* d, size_t n) {
  std::vector<float> h(n);
  REQUIRE(cudaMemcpyAsync(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, nullptr) == cudaSuccess);
  return h;
}

}  // namespace

TEST_CASE("a capture records launches, memsets and copies without running them, and each replay runs them in order") {
  Fixture f;
  float *b = nullptr, *c = nullptr, *pinned = nullptr;
  REQUIRE(cudaMalloc(&b, 64 * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(&c, 64 * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaHostAlloc(reinterpret_cast<void**>(&pinned), 64 * sizeof(float), cudaHostAllocDefault) == cudaSuccess);
  std::vector<float> host(64, 7.0f);
  std::memcpy(pinned, host.data(), 64 * sizeof(float));
  REQUIRE(cudaMemset(b, 0, 64 * sizeof(float)) == cudaSuccess);
  const std::vector<float> a_before = read(f.a, 64);  // cudaMalloc's 0xff bytes
  const auto launches = emu_launches;

  REQUIRE(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(f.status() == cudaStreamCaptureStatusActive);
  CHECK(cudaMemsetAsync(f.a, 0, 64 * sizeof(float), f.stream) == cudaSuccess);
  f.add(1.5f);
  f.add(2.0f);
  CHECK(cudaMemcpyAsync(b, f.a, 64 * sizeof(float), cudaMemcpyDeviceToDevice, f.stream) == cudaSuccess);
  f.add(-1.0f);  // after the copy: b keeps 3.5, a becomes 2.5
  CHECK(cudaMemcpyAsync(c, pinned, 64 * sizeof(float), cudaMemcpyHostToDevice, f.stream) == cudaSuccess);
  CHECK(cudaGetLastError() == cudaSuccess);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(f.stream, &graph) == cudaSuccess);
  REQUIRE(graph != nullptr);
  CHECK(f.status() == cudaStreamCaptureStatusNone);
  // Nothing ran: no kernel, a and b as they were.
  CHECK(emu_launches == launches);
  const std::vector<float> a_captured = read(f.a, 64);
  CHECK(std::memcmp(a_captured.data(), a_before.data(), 64 * sizeof(float)) == 0);
  CHECK(read(b, 64) == std::vector<float>(64, 0.0f));

  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);  // the executable graph keeps its own nodes
  const long graph_launches = emu_rt::stats().graph_launches;
  for (int replay = 0; replay < 3; ++replay) {
    for (int i = 0; i < 64; ++i) pinned[i] = float(replay * 100 + i);  // read at the replay, not at the capture
    REQUIRE(cudaGraphLaunch(exec, f.stream) == cudaSuccess);
    CHECK(read(f.a, 64) == std::vector<float>(64, 2.5f));
    CHECK(read(b, 64) == std::vector<float>(64, 3.5f));
    const std::vector<float> got = read(c, 64);
    for (int i = 0; i < 64; ++i) CHECK(got[i] == float(replay * 100 + i));
  }
  CHECK(emu_launches == launches + 9);  // three kernels a replay
  CHECK(emu_rt::stats().graph_launches == graph_launches + 3);
  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaGraphLaunch(exec, f.stream) == cudaErrorInvalidValue);
  CHECK(cudaGraphExecDestroy(exec) == cudaErrorInvalidValue);
  CHECK(cudaGraphDestroy(graph) == cudaErrorInvalidValue);
  cudaGetLastError();
  cudaFree(b);
  cudaFree(c);
  cudaFreeHost(pinned);
}

TEST_CASE("capture calls' own errors: the null stream, twice on one stream, an end without a begin, another thread") {
  Fixture f;
  CHECK(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported);
  CHECK(cudaGetLastError() == cudaErrorStreamCaptureUnsupported);
  cudaGraph_t g = nullptr;
  CHECK(cudaStreamEndCapture(f.stream, &g) == cudaErrorIllegalState);
  CHECK(cudaStreamBeginCapture(f.stream, cudaStreamCaptureMode(3)) == cudaErrorInvalidValue);
  REQUIRE(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeGlobal) == cudaErrorIllegalState);
  cudaError_t other = cudaSuccess;
  std::thread([&] { other = cudaStreamEndCapture(f.stream, &g); }).join();
  CHECK(other == cudaErrorStreamCaptureWrongThread);
  CHECK(f.status() == cudaStreamCaptureStatusActive);  // none of these invalidates it
  REQUIRE(cudaStreamEndCapture(f.stream, &g) == cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  CHECK(cudaGraphInstantiate(&exec, g, 1) == cudaErrorInvalidValue);
  CHECK(cudaGraphDestroy(g) == cudaSuccess);
  cudaGetLastError();
}

TEST_CASE("a stream synchronize during a capture fails and invalidates it, and later operations fail too") {
  Fixture f;
  REQUIRE(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  f.add(1.0f);
  const long waits = emu_rt::stats().host_waits;
  CHECK(cudaStreamSynchronize(f.stream) == cudaErrorStreamCaptureUnsupported);
  CHECK(emu_rt::stats().host_waits == waits);
  CHECK(f.status() == cudaStreamCaptureStatusInvalidated);
  CHECK(cudaStreamSynchronize(f.stream) == cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
  CHECK_THROWS_WITH_AS(f.add(1.0f),
                       "kernel launch failed in binary_scalar: cudaErrorStreamCaptureInvalidated (operation failed due "
                       "to a previous error during capture)",
                       nd::Error);
  CHECK(cudaMemsetAsync(f.a, 0, 4, f.stream) == cudaErrorStreamCaptureInvalidated);
  f.end_invalidated();
}

TEST_CASE("a device synchronize during a capture fails and invalidates it") {
  Fixture f;
  REQUIRE(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(cudaDeviceSynchronize() == cudaErrorStreamCaptureUnsupported);
  CHECK(f.status() == cudaStreamCaptureStatusInvalidated);
  f.end_invalidated();
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

TEST_CASE("cudaMalloc and cudaFree during a global capture fail and invalidate it, and in a relaxed thread they run") {
  Fixture f;
  void* p = nullptr;
  REQUIRE(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  const long mallocs = emu_rt::stats().mallocs;
  CHECK(cudaMalloc(&p, 256) == cudaErrorStreamCaptureUnsupported);
  CHECK(p == nullptr);
  CHECK(emu_rt::stats().mallocs == mallocs);
  CHECK(f.status() == cudaStreamCaptureStatusInvalidated);
  f.end_invalidated();

  REQUIRE(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  REQUIRE(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
  CHECK(mode == cudaStreamCaptureModeGlobal);
  CHECK(cudaMalloc(&p, 256) == cudaSuccess);
  CHECK(cudaFree(p) == cudaSuccess);
  REQUIRE(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);  // back to global
  CHECK(mode == cudaStreamCaptureModeRelaxed);
  CHECK(f.status() == cudaStreamCaptureStatusActive);
  CHECK(cudaFree(f.a) == cudaErrorStreamCaptureUnsupported);
  CHECK(f.status() == cudaStreamCaptureStatusInvalidated);
  f.end_invalidated();

  // Another thread, in its default global mode, is refused too during a global capture; a
  // thread-local capture does not concern it.
  REQUIRE(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  cudaError_t other = cudaErrorInvalidValue;
  std::thread([&] {
    other = cudaMalloc(&p, 256);
    cudaFree(p);
  }).join();
  CHECK(other == cudaSuccess);
  CHECK(f.status() == cudaStreamCaptureStatusActive);
  cudaGraph_t g = nullptr;
  REQUIRE(cudaStreamEndCapture(f.stream, &g) == cudaSuccess);
  CHECK(cudaGraphDestroy(g) == cudaSuccess);
}

TEST_CASE("a copy to or from pageable host memory during a capture fails and invalidates it, and pinned memory is captured") {
  Fixture f;
  std::vector<float> pageable(64, 0.0f);
  float* pinned = nullptr;
  REQUIRE(cudaHostAlloc(reinterpret_cast<void**>(&pinned), 64 * sizeof(float), cudaHostAllocDefault) == cudaSuccess);
  REQUIRE(cudaMemset(f.a, 0, 64 * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(cudaMemcpyAsync(pageable.data(), f.a, 64 * sizeof(float), cudaMemcpyDeviceToHost, f.stream) ==
        cudaErrorStreamCaptureUnsupported);
  CHECK(f.status() == cudaStreamCaptureStatusInvalidated);
  f.end_invalidated();
  REQUIRE(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(cudaMemcpyAsync(f.a, pageable.data(), 64 * sizeof(float), cudaMemcpyHostToDevice, f.stream) ==
        cudaErrorStreamCaptureUnsupported);
  f.end_invalidated();

  REQUIRE(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  f.add(4.0f);
  CHECK(cudaMemcpyAsync(pinned, f.a, 64 * sizeof(float), cudaMemcpyDeviceToHost, f.stream) == cudaSuccess);
  cudaGraph_t g = nullptr;
  REQUIRE(cudaStreamEndCapture(f.stream, &g) == cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, g, 0) == cudaSuccess);
  std::fill(pinned, pinned + 64, -1.0f);
  REQUIRE(cudaGraphLaunch(exec, f.stream) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, f.stream) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(f.stream) == cudaSuccess);
  CHECK(std::vector<float>(pinned, pinned + 64) == std::vector<float>(64, 8.0f));
  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaGraphDestroy(g) == cudaSuccess);
  cudaFreeHost(pinned);
}

TEST_CASE("an event recorded in a capture cannot be queried or waited for by the host, and its replay records it") {
  Fixture f;
  cudaEvent_t e = nullptr;
  REQUIRE(cudaEventCreate(&e) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE(cudaEventRecord(e, f.stream) == cudaSuccess);
  CHECK(cudaEventQuery(e) == cudaErrorCapturedEvent);
  CHECK(cudaEventSynchronize(e) == cudaErrorCapturedEvent);
  CHECK(f.status() == cudaStreamCaptureStatusActive);
  cudaGraph_t g = nullptr;
  REQUIRE(cudaStreamEndCapture(f.stream, &g) == cudaSuccess);
  CHECK(cudaEventQuery(e) == cudaErrorCapturedEvent);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, g, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, f.stream) == cudaSuccess);
  CHECK(cudaEventQuery(e) == cudaSuccess);
  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaGraphDestroy(g) == cudaSuccess);
  cudaEventDestroy(e);
  cudaGetLastError();
}

namespace {
// A second stream and buffer, and two events, beside the fixture's.
struct Fork : Fixture {
  cudaStream_t side = nullptr, third = nullptr;
  float* b = nullptr;
  cudaEvent_t forked = nullptr, done = nullptr;
  Fork() {
    REQUIRE(cudaStreamCreate(&side) == cudaSuccess);
    REQUIRE(cudaStreamCreate(&third) == cudaSuccess);
    REQUIRE(cudaMalloc(&b, 64 * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaEventCreate(&forked) == cudaSuccess);
    REQUIRE(cudaEventCreate(&done) == cudaSuccess);
    REQUIRE(cudaMemset(a, 0, 64 * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMemset(b, 0, 64 * sizeof(float)) == cudaSuccess);
  }
  ~Fork() {
    cudaEventDestroy(forked);
    cudaEventDestroy(done);
    cudaFree(b);
    cudaStreamDestroy(side);
    cudaStreamDestroy(third);
    cudaGetLastError();
  }
  cudaStreamCaptureStatus side_status() const {
    cudaStreamCaptureStatus s = cudaStreamCaptureStatusNone;
    REQUIRE(cudaStreamIsCapturing(side, &s) == cudaSuccess);
    return s;
  }
  // Begins a capture on `stream` with a = 1, and forks `side` into it.
  void begin_and_fork() {
    REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
    add(1.0f);
    REQUIRE(cudaEventRecord(forked, stream) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(side, forked, 0) == cudaSuccess);
  }
  // After begin_and_fork: `third` forked too, b += 2 on `side`, joined into `third` only.
  void join_side_into_third() {
    REQUIRE(cudaStreamWaitEvent(third, forked, 0) == cudaSuccess);
    add_on(side, b, 2.0f);
    REQUIRE(cudaEventRecord(done, side) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(third, done, 0) == cudaSuccess);
  }
};
}  // namespace

TEST_CASE("a stream waiting for an event recorded in a capture is forked into it, and joined back its work replays in order") {
  Fork f;
  const auto launches = emu_launches;
  f.begin_and_fork();
  CHECK(f.side_status() == cudaStreamCaptureStatusActive);
  Fixture::add_on(f.side, f.b, 2.0f);  // b += 2 on the forked stream, after a = 1
  const int64_t shape[1] = {64}, strides[1] = {1};
  kc::binary<float>(kc::BinaryOp::add, 1.0f, 1, shape, f.b, strides, f.a, strides, f.b, strides, f.side);  // b += a
  REQUIRE(cudaEventRecord(f.done, f.side) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(f.stream, f.done, 0) == cudaSuccess);  // the join
  kc::binary<float>(kc::BinaryOp::mul, 1.0f, 1, shape, f.a, strides, f.b, strides, f.a, strides, f.stream);  // a *= b
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(f.stream, &graph) == cudaSuccess);
  CHECK(f.side_status() == cudaStreamCaptureStatusNone);
  CHECK(emu_launches == launches);  // nothing ran, on either stream
  CHECK(read(f.a, 64) == std::vector<float>(64, 0.0f));
  CHECK(read(f.b, 64) == std::vector<float>(64, 0.0f));
  size_t nodes = 0;
  REQUIRE(cudaGraphGetNodes(graph, nullptr, &nodes) == cudaSuccess);
  CHECK(nodes == 6);  // 4 kernels, 2 event records
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  // Replay 1: a = 1, b = 2 + 1 = 3, a = 3. Replay 2: a = 4, b = 3 + 2 + 4 = 9, a = 36.
  REQUIRE(cudaGraphLaunch(exec, f.stream) == cudaSuccess);
  CHECK(read(f.a, 64) == std::vector<float>(64, 3.0f));
  CHECK(read(f.b, 64) == std::vector<float>(64, 3.0f));
  REQUIRE(cudaGraphLaunch(exec, f.stream) == cudaSuccess);
  CHECK(read(f.a, 64) == std::vector<float>(64, 36.0f));
  CHECK(read(f.b, 64) == std::vector<float>(64, 9.0f));
  CHECK(emu_launches == launches + 8);
  // The side stream is an ordinary stream again.
  Fixture::add_on(f.side, f.b, 1.0f);
  CHECK(read(f.b, 64) == std::vector<float>(64, 10.0f));
  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
}

TEST_CASE("a capture with a fork not joined back fails at its end with cudaErrorStreamCaptureUnjoined") {
  Fork f;
  cudaGraph_t graph = nullptr;
  bool ended = false;
  SUBCASE("the forked stream's work never joined") {
    f.begin_and_fork();
    Fixture::add_on(f.side, f.b, 2.0f);
  }
  SUBCASE("work queued on the forked stream after its join") {
    f.begin_and_fork();
    Fixture::add_on(f.side, f.b, 2.0f);
    REQUIRE(cudaEventRecord(f.done, f.side) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(f.stream, f.done, 0) == cudaSuccess);
    Fixture::add_on(f.side, f.b, 3.0f);
  }
  SUBCASE("joined into another forked stream only") {
    f.begin_and_fork();
    f.join_side_into_third();
    Fixture::add_on(f.third, f.b, 2.0f);
    static CUgraph_st sentinel;
    graph = &sentinel;  // must come back null
    CHECK(cudaStreamEndCapture(f.stream, &graph) == cudaErrorStreamCaptureUnjoined);
    CHECK(graph == nullptr);
    cudaStreamCaptureStatus s = cudaStreamCaptureStatusActive;
    REQUIRE(cudaStreamIsCapturing(f.third, &s) == cudaSuccess);
    CHECK(s == cudaStreamCaptureStatusNone);
    ended = true;
  }
  if (!ended) CHECK(cudaStreamEndCapture(f.stream, &graph) == cudaErrorStreamCaptureUnjoined);
  CHECK(cudaGetLastError() == cudaErrorStreamCaptureUnjoined);
  CHECK(std::string(cudaGetErrorString(cudaErrorStreamCaptureUnjoined)) == "capturing stream has unjoined work");
  CHECK(f.status() == cudaStreamCaptureStatusNone);  // the capture ended, on every stream
  CHECK(f.side_status() == cudaStreamCaptureStatusNone);
  CHECK(read(f.b, 64) == std::vector<float>(64, 0.0f));
}

TEST_CASE("a fork joined through a second forked stream into the origin is joined") {
  Fork f;
  f.begin_and_fork();
  cudaEvent_t last = nullptr;
  REQUIRE(cudaEventCreate(&last) == cudaSuccess);
  f.join_side_into_third();
  Fixture::add_on(f.third, f.b, 5.0f);
  REQUIRE(cudaEventRecord(last, f.third) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(f.stream, last, 0) == cudaSuccess);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(f.stream, &graph) == cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, f.stream) == cudaSuccess);
  CHECK(read(f.b, 64) == std::vector<float>(64, 7.0f));
  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  cudaEventDestroy(last);
}

TEST_CASE("ending a capture on a forked stream fails with cudaErrorStreamCaptureUnmatched and invalidates it") {
  Fork f;
  f.begin_and_fork();
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(f.side, &graph) == cudaErrorStreamCaptureUnmatched);
  CHECK(graph == nullptr);
  CHECK(f.side_status() == cudaStreamCaptureStatusInvalidated);
  CHECK(f.status() == cudaStreamCaptureStatusInvalidated);
  f.end_invalidated();
  CHECK(f.side_status() == cudaStreamCaptureStatusNone);
}

TEST_CASE("waiting in a capture for an event recorded outside it needs cudaEventWaitExternal, for another capture's it is a merge") {
  Fork f;
  SUBCASE("recorded before the capture: cudaErrorStreamCaptureIsolation, the capture invalidated") {
    REQUIRE(cudaEventRecord(f.done, f.side) == cudaSuccess);
    REQUIRE(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(cudaStreamWaitEvent(f.stream, f.done, 0) == cudaErrorStreamCaptureIsolation);
    CHECK(std::string(cudaGetErrorString(cudaErrorStreamCaptureIsolation)) ==
          "dependency created on uncaptured work in another stream");
    CHECK(f.status() == cudaStreamCaptureStatusInvalidated);
    f.end_invalidated();
  }
  SUBCASE("with cudaEventWaitExternal, or never recorded: accepted") {
    REQUIRE(cudaEventRecord(f.done, f.side) == cudaSuccess);
    REQUIRE(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(cudaStreamWaitEvent(f.stream, f.done, cudaEventWaitExternal) == cudaSuccess);
    CHECK(cudaStreamWaitEvent(f.stream, f.forked, 0) == cudaSuccess);  // never recorded: no work
    CHECK(cudaStreamWaitEvent(f.stream, f.done, 2) == cudaErrorInvalidValue);
    CHECK(f.status() == cudaStreamCaptureStatusActive);
    cudaGraph_t graph = nullptr;
    REQUIRE(cudaStreamEndCapture(f.stream, &graph) == cudaSuccess);
    CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  }
  SUBCASE("an event of another capture: cudaErrorStreamCaptureMerge, both invalidated") {
    REQUIRE(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
    REQUIRE(cudaStreamBeginCapture(f.side, cudaStreamCaptureModeGlobal) == cudaSuccess);
    REQUIRE(cudaEventRecord(f.forked, f.side) == cudaSuccess);
    CHECK(cudaStreamWaitEvent(f.stream, f.forked, 0) == cudaErrorStreamCaptureMerge);
    CHECK(f.status() == cudaStreamCaptureStatusInvalidated);
    CHECK(f.side_status() == cudaStreamCaptureStatusInvalidated);
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(f.side, &graph) == cudaErrorStreamCaptureInvalidated);
    f.end_invalidated();
  }
  SUBCASE("a stream outside any capture waiting for an event of an ended capture: cudaErrorCapturedEvent") {
    REQUIRE(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
    REQUIRE(cudaEventRecord(f.forked, f.stream) == cudaSuccess);
    cudaGraph_t graph = nullptr;
    REQUIRE(cudaStreamEndCapture(f.stream, &graph) == cudaSuccess);
    CHECK(cudaStreamWaitEvent(f.side, f.forked, 0) == cudaErrorCapturedEvent);
    CHECK(f.side_status() == cudaStreamCaptureStatusNone);
    CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  }
  cudaGetLastError();
}

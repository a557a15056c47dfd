// Fused multi-tensor optimizer steps (PyTorch's multi_tensor_apply): one launch updates
// every element of every tensor of a step, each read once and written once, with the CPU's
// per-element arithmetic (kernels/common/optim_math.h).
//
// Why it is built this way (these kernels move 28 bytes per f32 Adam element and do a
// dozen flops: they are bound by memory bandwidth, and what matters is bytes in flight):
// - A block per chunk of kChunk elements of one tensor. The block reads its chunk from a
//   table and its tensor's entry (length, pointers) from the launch's parameters, once,
//   into registers; nothing per element goes back to memory for them.
// - Each thread updates groups of kGroup = 4 consecutive elements: every load of the group
//   (p, g, m, v, and vmax under AMSGrad: 16 to 20 values) is issued before the first
//   update and every store after the last, as float4 / double2 when all of the tensor's
//   pointers are 16-byte aligned (kernels/cuda/vector_io.cuh); the chunk's last group may
//   be partial and goes element by element.
// - What changes from step to step travels by value with the launch (Launch: the
//   entries' pointers, since gradients are new tensors after zero_grad, and up to
//   kMaxCoefficients coefficient sets: learning rate, bias corrections per distinct step
//   count, the unscale factor), at most kParamBytes of it. The table of chunks depends on
//   the tensors' lengths only: it stays on the device between steps (TableCache) and is
//   uploaded, on the launch's stream, when the lengths or the stream change (a new parameter
//   list). A step with more tensors than
//   one launch's parameters hold (kEntries: 59 f32 Adam tensors, 85 f32 SGD ones) or more
//   distinct step counts than kMaxCoefficients takes one launch per such share, as
//   PyTorch's multi_tensor_apply does (which holds 36 Adam tensors and 320 chunks a launch).
// - Adam's step counts may instead live on the device (AdamTensor::step_on_device, what the
//   engine does for CUDA parameters; PyTorch's capturable=True): the coefficient set is then
//   the hyperparameters, every block derives its bias corrections from its entry's count, and
//   the entry's last block to finish (a counter per entry after the chunk table) stores the
//   count + 1, so a captured step replays with its own count, still in one launch.
// Checked: tests/emu/optim_emu_test.cpp (against the CPU twin and formulas in double;
// aligned and misaligned tensors, partial groups, a step split over launches),
// tests/emu/emulib_runtime_test.cpp (one launch and no upload in a steady step).
#include "kernels/cuda/optim.h"
#include "kernels/cuda/graph.h"

#include <algorithm>
#include <list>
#include <mutex>
#include <string>

#include "kernels/common/optim_math.h"
#include "kernels/common/twin_types.h"
#include "kernels/cuda/allocator.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/strided.cuh"
#include "kernels/cuda/vector_io.cuh"

namespace nd::kernels::cuda {

namespace {

using detail::kThreads;
using optim_math::Chunk;
using optim_math::kMaxCoefficients;

// Kernel parameters: 4 KiB on every architecture; some room left for the table pointer.
constexpr size_t kParamBytes = 3584;

template <class Entry>
struct Launch {
  using Coefficients = typename Entry::Coefficients;
  static constexpr int kEntries = int((kParamBytes - sizeof(Coefficients) * kMaxCoefficients) / sizeof(Entry));
  Coefficients coefficients[kMaxCoefficients];
  Entry entries[kEntries];
  const int32_t* skip;  // when set and *skip != 0 the launch changes nothing (GradScaler's skipped step)
};

template <class Entry>
__device__ bool skipped(const Launch<Entry>& launch) {
  return launch.skip != nullptr && *launch.skip != 0;
}

template <class Entry>
__global__ void multi_tensor_kernel(const Chunk* __restrict__ chunks, const Launch<Entry> launch) {
  if (skipped(launch)) return;
  const Chunk chunk = chunks[blockIdx.x];
  const Entry e = launch.entries[chunk.entry];
  // The entry's set, picked with constant indices (registers, not a copy of the list).
  typename Entry::Coefficients c = launch.coefficients[0];
#pragma unroll
  for (int k = 1; k < kMaxCoefficients; ++k)
    if (e.coefficients == k) c = launch.coefficients[k];
  optim_math::update_chunk<VectorIO>(e, c, chunk.start, threadIdx.x, blockDim.x);
}

// Adam with its step counts on the device (AdamCountedEntry): every block derives its
// coefficients from its entry's count + 1 with the host's arithmetic (optim_math::adam), so a
// CUDA graph's replay takes the bias corrections of its own step; the entry's last block to
// finish stores the new count. `finished` (one counter per entry, zero between launches):
// each block adds one after its threads have read the count, and the block that brings it
// to the entry's number of chunks writes the count and zeroes the counter. The bias
// corrections' pow() in every thread would take 77 registers in f32 (3 blocks an SM): the
// bounds hold it to 64 (4 blocks) without spills; f64 needs its 106.
template <class Entry>
__global__ void __launch_bounds__(kThreads, sizeof(typename Entry::Scalar) == 4 ? 4 : 2)
    adam_counted_kernel(const Chunk* __restrict__ chunks, unsigned* finished, const Launch<Entry> launch) {
  using T = typename Entry::Scalar;
  if (skipped(launch)) return;
  const Chunk chunk = chunks[blockIdx.x];
  const Entry e = launch.entries[chunk.entry];
  const double taken = *e.step;
  const optim_math::Adam<T> c = optim_math::adam<T>(launch.coefficients[0], static_cast<int64_t>(taken) + 1);
  optim_math::update_chunk<VectorIO, optim_math::AdamEntry<T>>(e, c, chunk.start, threadIdx.x, blockDim.x);
  __syncthreads();
  if (threadIdx.x != 0) return;
  __threadfence();
  const auto blocks = static_cast<unsigned>(optim_math::num_chunks(e.n, true));
  if (atomicAdd(&finished[chunk.entry], 1u) + 1 != blocks) return;
  *e.step = taken + 1;
  finished[chunk.entry] = 0;
}

// A launch's chunk table on the device, uploaded on the stream the launches that read it run
// on (work on two streams is unordered: a launch on another stream than the upload's could
// read the table before the copy has run).
struct DeviceTable {
  int device;
  cudaStream_t stream;
  std::string chunks;  // the host bytes of the chunks: with device and stream, the key
  const Chunk* table;
};

// The last kKept chunk tables, most recently used first. Held for the process's life
// (never destroyed: the allocator may be gone at exit); a table dropped from the list is
// released to the allocator, which reuses it only for work queued after the launches
// that read it.
class TableCache {
 public:
  static constexpr size_t kKept = 16;  // several optimizers per device, each with a few launches

  // After the chunks, one zeroed unsigned per entry: adam_counted_kernel's counters.
  static unsigned* finished(const Chunk* table, const std::vector<Chunk>& chunks) {
    return reinterpret_cast<unsigned*>(const_cast<Chunk*>(table + chunks.size()));
  }

  const Chunk* table(int device, const std::vector<Chunk>& chunks, cudaStream_t stream) {
    const size_t bytes = chunks.size() * sizeof(Chunk);
    std::string key(reinterpret_cast<const char*>(chunks.data()), bytes);
    const std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = tables_.begin(); it != tables_.end(); ++it) {
      // A capture (graph.h) starts after the compute stream's work: its tables serve it.
      const bool ordered = it->stream == stream || (stream == capture_stream(device) && it->stream == capture_origin(device));
      if (it->device != device || !ordered || it->chunks != key) continue;
      tables_.splice(tables_.begin(), tables_, it);
      return it->table;
    }
    std::string upload = key;  // the chunks, then a zero counter per entry (chunks are in entry order)
    upload.resize(bytes + size_t(chunks.back().entry + 1) * sizeof(unsigned), '\0');
    auto* table = static_cast<Chunk*>(allocate(device, upload.size(), stream));
    copy_host_to_device(device, table, upload.data(), upload.size(), stream);  // queued on `stream`: no wait
    tables_.push_front({device, stream, std::move(key), table});
    if (tables_.size() > kKept) {
      release(const_cast<Chunk*>(tables_.back().table));
      tables_.pop_back();
    }
    return table;
  }

 private:
  std::mutex mutex_;
  std::list<DeviceTable> tables_;
};

TableCache& table_cache() {
  static auto* cache = new TableCache;
  return *cache;
}

template <class Entry>
void launch_one(int device, const std::vector<Entry>& entries, const Launch<Entry>& launch, const char* op,
                cudaStream_t stream) {
  const std::vector<Chunk> chunks = optim_math::chunks_of(entries);
  if (chunks.empty()) return;
  require(chunks.size() <= (size_t(1) << 31) - 1, op, "more chunks than one grid holds");
  const Chunk* table = table_cache().table(device, chunks, stream);
  if constexpr (optim_math::IsCounted<Entry>::value)
    adam_counted_kernel<Entry><<<static_cast<unsigned>(chunks.size()), kThreads, 0, stream>>>(
        table, TableCache::finished(table, chunks), launch);
  else
    multi_tensor_kernel<Entry><<<static_cast<unsigned>(chunks.size()), kThreads, 0, stream>>>(table, launch);
  check_launch(op);
}

// The step's entries in order, a launch whenever the next entry would not fit: kEntries
// entries, kMaxCoefficients coefficient sets (one launch in the usual step).
template <class Entry>
void launch_multi_tensor(int device, const optim_math::Step<Entry>& step, const char* op, cudaStream_t stream,
                         const int32_t* skip = nullptr) {
  Launch<Entry> launch{};
  launch.skip = skip;
  std::vector<Entry> entries;
  std::vector<int32_t> local(step.coefficients.size(), -1);  // a set's index in this launch
  int32_t sets = 0;
  for (Entry e : step.entries) {
    const bool new_set = local[e.coefficients] < 0;
    if (entries.size() == size_t(Launch<Entry>::kEntries) || (new_set && sets == kMaxCoefficients)) {
      launch_one(device, entries, launch, op, stream);
      entries.clear();
      std::fill(local.begin(), local.end(), -1);
      sets = 0;
    }
    if (local[e.coefficients] < 0) {
      launch.coefficients[sets] = step.coefficients[e.coefficients];
      local[e.coefficients] = sets++;
    }
    e.coefficients = local[e.coefficients];
    launch.entries[entries.size()] = e;
    entries.push_back(e);
  }
  launch_one(device, entries, launch, op, stream);
}

}  // namespace

template <class T>
void sgd_step(int device, const std::vector<SgdTensor<T>>& tensors, const SgdParams& hp, cudaStream_t stream,
              const int32_t* skip_if) {
  launch_multi_tensor(device, optim_math::sgd_step_of(tensors, hp), "sgd_step", stream, skip_if);
}

template <class T>
void adam_step(int device, const std::vector<AdamTensor<T>>& tensors, const AdamParams& hp, cudaStream_t stream,
               const int32_t* skip_if) {
  const auto counted = std::count_if(tensors.begin(), tensors.end(),
                                     [](const AdamTensor<T>& t) { return t.step_on_device != nullptr; });
  require(counted == 0 || static_cast<size_t>(counted) == tensors.size(), "adam_step",
          "either every tensor or none has its step count on the device");
  if (counted > 0)
    launch_multi_tensor(device, optim_math::adam_counted_step_of(tensors, hp), "adam_step", stream, skip_if);
  else
    launch_multi_tensor(device, optim_math::adam_step_of(tensors, hp), "adam_step", stream, skip_if);
}

template <class T>
void unscale_grad(int device, const std::vector<UnscaleTensor<T>>& tensors, T inv_scale, cudaStream_t stream,
                  const double* scale_on_device) {
  optim_math::Step<optim_math::UnscaleEntry<T>> step;
  step.coefficients.push_back({inv_scale, scale_on_device});
  for (const UnscaleTensor<T>& t : tensors)
    if (t.n > 0) step.entries.push_back({t.n, t.g, t.found_nonfinite, 0, optim_math::aligned16(t.g)});
  launch_multi_tensor(device, step, "unscale_grad", stream);
}

// GradScaler's update on the device: one thread.
__global__ void update_scale_kernel(const ScaleUpdate u) {
  bool found = false;
  for (int i = 0; i < u.num_found; ++i) found = found || *u.found[i] != 0;
  auto tracker = static_cast<int64_t>(*u.growth_tracker);
  optim_math::update_scale(*u.scale, tracker, found, u.growth_factor, u.backoff_factor, u.growth_interval);
  *u.growth_tracker = static_cast<double>(tracker);
  *u.found_any = found ? 1 : 0;
}

void update_scale(int device, const ScaleUpdate& update, cudaStream_t stream) {
  (void)device;
  require(update.num_found >= 0 && update.num_found <= ScaleUpdate::kMaxFound, "update_scale",
          "expected 0 to " + std::to_string(ScaleUpdate::kMaxFound) + " flags, found " +
              std::to_string(update.num_found));
  update_scale_kernel<<<1, 1, 0, stream>>>(update);
  check_launch("update_scale");
}

#define ND_INSTANTIATE(T)                                                                                           \
  template void sgd_step<T>(int, const std::vector<SgdTensor<T>>&, const SgdParams&, cudaStream_t, const int32_t*);   \
  template void adam_step<T>(int, const std::vector<AdamTensor<T>>&, const AdamParams&, cudaStream_t, const int32_t*); \
  template void unscale_grad<T>(int, const std::vector<UnscaleTensor<T>>&, T, cudaStream_t, const double*);
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE)

}  // namespace nd::kernels::cuda

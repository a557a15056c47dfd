#pragma once
// Checkpoints as safetensors files (docs/checkpoints.md): nd::save, nd::load,
// nd::load_metadata. Files are readable by Python's `safetensors` and PyTorch, the
// saving device of every tensor is recorded, `map_location` places tensors on any
// device, writes are atomic, and every malformed file is an nd::Error naming the file.
// Tests: tests/io/checkpoint_test.cpp, checkpoint_interop_test.cpp, tests/fuzz/.
#include <concepts>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "engine/device.h"
#include "engine/tensor.h"

namespace nd {

// Ordered by name, so the same dict always gives the same file.
using TensorDict = std::map<std::string, Tensor>;

// Writes `tensors` to `path` as a safetensors file. Non-contiguous and CUDA tensors are
// copied to contiguous CPU memory first; each tensor's device goes into the metadata key
// "nanoddp.devices". `metadata` keys starting with "nanoddp." are reserved.
// Atomic: a temp file in the same folder is written, fsynced and renamed over `path`;
// on any error the temp file is removed and an existing `path` is left untouched.
void save(const TensorDict& tensors, const std::string& path,
          const std::map<std::string, std::string>& metadata = {});

// Where load() puts each tensor (PyTorch's map_location):
//   {}                                  every tensor on cpu (the default)
//   "cuda:1", nd::Device(...), nd::kCPU every tensor on that device
//   {{"cuda:0", "cuda:3"}}              saved device -> target; unlisted devices stay as saved
//   [](const std::string& name, const nd::Device& saved) { return nd::Device(...); }
struct MapLocation {
  using Fn = std::function<Device(const std::string& name, const Device& saved)>;

  MapLocation();
  MapLocation(Device device);
  MapLocation(DeviceType type) : MapLocation(Device(type)) {}
  MapLocation(const std::string& device) : MapLocation(Device(device)) {}
  MapLocation(const char* device) : MapLocation(Device(device)) {}
  // Keys and values are device strings ("cpu", "cuda", "cuda:N"); invalid ones throw.
  MapLocation(const std::map<std::string, std::string>& saved_to_target);
  MapLocation(std::initializer_list<std::pair<const std::string, std::string>> saved_to_target)
      : MapLocation(std::map<std::string, std::string>(saved_to_target)) {}
  template <class F>
    requires(std::is_invocable_r_v<Device, F, const std::string&, const Device&> &&
             !std::is_convertible_v<F, std::string>)
  MapLocation(F fn) : fn_(std::move(fn)), describe_("a map_location function") {}

  // The device for tensor `name` that was saved on `saved`.
  Device target(const std::string& name, const Device& saved) const { return fn_(name, saved); }
  // "map_location cuda:1", "map_location {cuda:0 -> cuda:3}", ... (for error messages)
  const std::string& describe() const { return describe_; }

 private:
  Fn fn_;
  std::string describe_;
};

// Reads every tensor of a safetensors file (written by nanoddp, Python or PyTorch) and
// places it per `map_location`. Each tensor is named after its key.
TensorDict load(const std::string& path, const MapLocation& map_location = {});
// The file's "__metadata__" (including nanoddp's own "nanoddp.*" keys), without
// reading any tensor data.
std::map<std::string, std::string> load_metadata(const std::string& path);

namespace detail {

// The reference implementation's limit on the JSON header.
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsEntry {
  std::string name;
  ScalarType dtype = kFloat32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // sorted by begin offset
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + header length
};

// Reads the 8-byte little-endian header length from `first8` (the file's first bytes)
// and checks it against the limit and `file_size`. `file` names the file in errors.
uint64_t parse_safetensors_header_length(std::string_view first8, uint64_t file_size, const std::string& file);
// Parses and validates the JSON header: fields, dtypes, shapes, offsets that tile the
// `data_size` bytes of the data section exactly. Throws nd::Error on any problem.
SafetensorsHeader parse_safetensors_header(std::string_view json, uint64_t data_size, const std::string& file);
// Both of the above over a whole file held in memory (the fuzz target's entry point).
SafetensorsHeader parse_safetensors(std::string_view file_bytes, const std::string& file);

}  // namespace detail
}  // namespace nd

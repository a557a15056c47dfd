// libFuzzer target for the safetensors header parser (io/checkpoint.cpp): any bytes
// as a whole file must either parse into a consistent header or throw nd::Error; never
// crash, hang, read out of bounds or allocate without bound. Build and run:
// tests/fuzz/run_fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "io/checkpoint.h"
#include "engine/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    const nd::detail::SafetensorsHeader h = nd::detail::parse_safetensors(bytes, "fuzz");
    // What load() relies on: the tensors tile the data section, inside the file.
    uint64_t pos = h.data_start;
    for (const auto& e : h.tensors) {
      if (h.data_start + e.begin != pos || e.end < e.begin) __builtin_trap();
      pos = h.data_start + e.end;
    }
    if (pos != size) __builtin_trap();
  } catch (const nd::Error&) {
  }
  return 0;
}

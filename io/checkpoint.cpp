// Safetensors reader and writer (docs/checkpoints.md).
//
// Why our own JSON parser (io/json.h): the header is a tiny, fixed schema, and a
// checkpoint can come from anywhere, so parsing must be strict and bounded: nesting
// depth is capped, every number is a checked unsigned integer, sizes are validated
// against the file before anything is allocated, and every problem is an nd::Error
// naming the file, the tensor and what was expected vs found. The fuzz target
// (tests/fuzz/) drives the parser.
//
// Why temp file + fsync + rename + fsync(dir): rename is atomic on POSIX, so a reader
// (or a restart after a crash or SIGKILL) sees either the old file or the complete new
// one, never a torn mix; the fsyncs make that hold across power loss too.
#include "io/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "engine/error.h"
#include "engine/factories.h"
#include "io/json.h"

namespace nd {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

using json::Json;

constexpr const char* kDevicesKey = "nanoddp.devices";
constexpr const char* kFormatVersionKey = "nanoddp.format_version";
constexpr const char* kFormatVersion = "1";

struct DtypeName {
  ScalarType dtype;
  const char* name;
};
constexpr DtypeName kDtypes[] = {{kFloat32, "F32"}, {kFloat64, "F64"}, {kBFloat16, "BF16"}, {kFloat16, "F16"},
                                 {kInt64, "I64"},   {kInt32, "I32"},   {kUInt8, "U8"},      {kBool, "BOOL"}};

const char* safetensors_dtype(ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.dtype == t) return d.name;
  throw Error("unreachable dtype");
}

// ---- files ----

[[noreturn]] void throw_errno(const std::string& what) { throw Error(what + ": " + std::strerror(errno)); }

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens a safetensors file for reading; returns its size.
uint64_t open_for_read(const std::string& path, Fd& f) {
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) throw_errno("cannot open safetensors file '" + path + "'");
  struct stat st;
  if (::fstat(f.fd, &st) != 0) throw_errno("cannot stat safetensors file '" + path + "'");
  ND_CHECK(!S_ISDIR(st.st_mode), "cannot load '", path, "': expected a safetensors file, found a directory");
  ND_CHECK(S_ISREG(st.st_mode), "cannot load '", path, "': expected a regular safetensors file");
  return static_cast<uint64_t>(st.st_size);
}

// Reads exactly n bytes at `offset`; a short read means the file shrank under us.
void read_exact(const Fd& f, void* dst, uint64_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(f.fd, p, std::min<uint64_t>(n, 1u << 30), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw_errno("cannot read safetensors file '" + path + "'");
    ND_CHECK(got > 0, "safetensors file '", path, "' is truncated: expected ", n, " more bytes at offset ", offset,
             ", found end of file");
    p += got, n -= static_cast<uint64_t>(got), offset += static_cast<uint64_t>(got);
  }
}

void write_all(int fd, const void* src, uint64_t n, const std::string& tmp) {
  const auto* p = static_cast<const char*>(src);
  while (n > 0) {
    const ssize_t put = ::write(fd, p, std::min<uint64_t>(n, 1u << 30));
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) throw_errno("cannot write checkpoint temp file '" + tmp + "'");
    p += put, n -= static_cast<uint64_t>(put);
  }
}

detail::SafetensorsHeader read_header(const Fd& f, uint64_t file_size, const std::string& path) {
  char first8[8] = {};
  read_exact(f, first8, std::min<uint64_t>(8, file_size), 0, path);
  const uint64_t n = detail::parse_safetensors_header_length(std::string_view(first8, std::min<uint64_t>(8, file_size)),
                                                             file_size, path);
  std::string json(n, '\0');
  read_exact(f, json.data(), n, 8, path);
  return detail::parse_safetensors_header(json, file_size - 8 - n, path);
}

std::map<std::string, Device> saved_devices(const detail::SafetensorsHeader& h, const std::string& path) {
  std::map<std::string, Device> out;
  const auto it = h.metadata.find(kDevicesKey);
  if (it == h.metadata.end()) return out;  // not written by nanoddp: everything was on cpu
  const std::string what = "safetensors file '" + path + "': metadata \"" + kDevicesKey + "\"";
  for (const auto& [name, dev] : json::string_map(json::parse(it->second, what), what)) {
    try {
      out[name] = Device(dev);
    } catch (const Error& e) {
      throw Error(what + ": tensor '" + name + "': " + e.what());
    }
  }
  return out;
}

}  // namespace

// ---- MapLocation ----

MapLocation::MapLocation()
    : fn_([](const std::string&, const Device&) { return Device(kCPU); }),
      describe_("the default map_location (cpu)") {}

MapLocation::MapLocation(Device device)
    : fn_([device](const std::string&, const Device&) { return device; }), describe_("map_location " + device.str()) {}

MapLocation::MapLocation(const std::map<std::string, std::string>& saved_to_target) {
  std::map<std::string, Device> m;  // keyed by canonical device string ("cuda" -> "cuda:0")
  describe_ = "map_location {";
  for (const auto& [from, to] : saved_to_target) {
    m[Device(from).str()] = Device(to);
    describe_ += (m.size() > 1 ? ", " : "") + Device(from).str() + " -> " + Device(to).str();
  }
  describe_ += "}";
  fn_ = [m](const std::string&, const Device& saved) {
    const auto it = m.find(saved.str());
    return it == m.end() ? saved : it->second;
  };
}

// ---- save ----

void save(const TensorDict& tensors, const std::string& path, const std::map<std::string, std::string>& metadata) {
  std::map<std::string, std::string> meta = metadata;
  for (const auto& [k, v] : metadata)
    ND_CHECK(k.rfind("nanoddp.", 0) != 0, "save('", path, "'): metadata key '", k,
             "' is reserved (keys starting with \"nanoddp.\" are written by nanoddp)");

  // Header first: it needs only shapes and dtypes.
  std::map<std::string, std::string> devices;
  std::string tensors_json;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    ND_CHECK(name != "__metadata__", "save('", path, "'): a tensor cannot be named \"__metadata__\"");
    try {
      const uint64_t nbytes = static_cast<uint64_t>(t.numel()) * element_size(t.dtype());
      devices[name] = t.device().str();
      tensors_json += ',';
      json::write_string(tensors_json, name);
      tensors_json += detail::str_cat(":{\"dtype\":\"", safetensors_dtype(t.dtype()), "\",\"shape\":[");
      for (size_t d = 0; d < t.sizes().size(); ++d) tensors_json += detail::str_cat(d ? "," : "", t.sizes()[d]);
      tensors_json += detail::str_cat("],\"data_offsets\":[", offset, ",", offset + nbytes, "]}");
      offset += nbytes;
    } catch (const Error& e) {
      throw Error("save('" + path + "'): tensor '" + name + "': " + e.what());
    }
  }
  meta[kDevicesKey] = json::object(devices);
  meta[kFormatVersionKey] = kFormatVersion;
  std::string header = "{\"__metadata__\":" + json::object(meta) + tensors_json + "}";
  header.resize((header.size() + 7) / 8 * 8, ' ');  // the reference pads to 8 bytes
  ND_CHECK(header.size() <= detail::kMaxSafetensorsHeaderBytes, "save('", path, "'): the header would be ",
           header.size(), " bytes, over the safetensors limit of ", detail::kMaxSafetensorsHeaderBytes);

  // Write a temp file next to the target, then rename it over the target.
  static std::atomic<uint64_t> counter{0};
  const std::filesystem::path target(path);
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  const std::string tmp = (dir / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()) + "." +
                                  std::to_string(counter++)))
                              .string();
  Fd f;
  f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (f.fd < 0) throw_errno("save('" + path + "'): cannot create temp file '" + tmp + "'");
  try {
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
    write_all(f.fd, len, 8, tmp);
    write_all(f.fd, header.data(), header.size(), tmp);
    for (const auto& [name, t] : tensors) {
      const Tensor c = t.detach().to(Device(kCPU)).contiguous();  // one tensor in memory at a time
      if (c.numel() > 0) write_all(f.fd, c.data_ptr(), static_cast<uint64_t>(c.numel()) * element_size(c.dtype()), tmp);
    }
    if (::fsync(f.fd) != 0) throw_errno("save('" + path + "'): fsync of '" + tmp + "' failed");
    const int fd = f.fd;
    f.fd = -1;
    if (::close(fd) != 0) throw_errno("save('" + path + "'): closing '" + tmp + "' failed");
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      throw_errno("save('" + path + "'): cannot rename '" + tmp + "' over it");
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  // Make the rename itself durable.
  Fd d;
  d.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d.fd < 0 || ::fsync(d.fd) != 0)
    throw_errno("save('" + path + "'): fsync of folder '" + dir.string() + "' failed");
}

// ---- load ----

std::map<std::string, std::string> load_metadata(const std::string& path) {
  Fd f;
  const uint64_t size = open_for_read(path, f);
  return read_header(f, size, path).metadata;
}

TensorDict load(const std::string& path, const MapLocation& map_location) {
  Fd f;
  const uint64_t size = open_for_read(path, f);
  const detail::SafetensorsHeader h = read_header(f, size, path);
  const std::map<std::string, Device> saved = saved_devices(h, path);

  // Resolve and check every target before reading any data.
  std::vector<Device> targets;
  for (const auto& e : h.tensors) {
    const auto it = saved.find(e.name);
    const Device from = it == saved.end() ? Device(kCPU) : it->second;
    const Device to = map_location.target(e.name, from);
    try {
      cuda::check_device(to);
    } catch (const Error& err) {
      throw Error(detail::str_cat("load('", path, "'): tensor '", e.name, "' was saved on ", from.str(),
                                  " and would be placed on ", to.str(), " by ", map_location.describe(),
                                  ", which is not usable here: ", err.what(),
                                  ". Pass a map_location that names a device available here, e.g. "
                                  "nd::load(path, \"cpu\") or nd::load(path, {{\"",
                                  from.str(), "\", \"cpu\"}})"));
    }
    targets.push_back(to);
  }

  TensorDict out;
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const auto& e = h.tensors[i];
    Tensor t = empty(e.shape, TensorOptions(e.dtype));
    read_exact(f, t.data_ptr(), e.end - e.begin, h.data_start + e.begin, path);
    if (e.dtype == kBool) {
      const auto* b = static_cast<const uint8_t*>(t.data_ptr());
      for (uint64_t j = 0; j < e.end - e.begin; ++j)
        ND_CHECK(b[j] <= 1, "safetensors file '", path, "': BOOL tensor '", e.name, "' element ", j,
                 ": expected byte 0 or 1, found ", static_cast<int>(b[j]));
    }
    t = t.to(targets[i]);
    t.set_name(e.name);
    out.emplace(e.name, t);
  }
  return out;
}

// ---- header parsing ----

namespace detail {

uint64_t parse_safetensors_header_length(std::string_view first8, uint64_t file_size, const std::string& file) {
  ND_CHECK(first8.size() >= 8 && file_size >= 8, "safetensors file '", file,
           "' is truncated: expected at least 8 bytes (the header length), found ",
           std::min<uint64_t>(file_size, first8.size()));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(first8[i]);
  ND_CHECK(n <= kMaxSafetensorsHeaderBytes, "safetensors file '", file, "': header length ", n,
           " is over the limit of ", kMaxSafetensorsHeaderBytes, " bytes (not a safetensors file, or corrupt)");
  ND_CHECK(n <= file_size - 8, "safetensors file '", file, "' is truncated: the header length says ", n,
           " bytes, but only ", file_size - 8, " bytes follow it");
  return n;
}

SafetensorsHeader parse_safetensors_header(std::string_view json, uint64_t data_size, const std::string& file) {
  const std::string where = "safetensors file '" + file + "'";
  const Json root = json::parse(json, where + ": the header");
  ND_CHECK(root.kind == Json::Object, where, ": expected the header to be a JSON object, found ",
           json::kind_name(root.kind));

  SafetensorsHeader h;
  h.data_start = 8 + json.size();
  for (size_t i = 0; i < root.keys.size(); ++i) {
    const std::string& name = root.keys[i];
    const Json& v = root.items[i];
    if (name == "__metadata__") {
      if (v.kind != Json::Null) h.metadata = json::string_map(v, where + ": \"__metadata__\"");
      continue;
    }
    const std::string what = where + ": tensor '" + name + "'";
    ND_CHECK(v.kind == Json::Object, what, ": expected an object with dtype, shape, data_offsets, found ",
             json::kind_name(v.kind));
    const Json *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
    for (size_t f = 0; f < v.keys.size(); ++f) {
      const std::string& field = v.keys[f];
      const Json& fv = v.items[f];
      if (field == "dtype")
        dtype = &fv;
      else if (field == "shape")
        shape = &fv;
      else if (field == "data_offsets")
        offsets = &fv;
      else
        throw Error(what + ": unknown field \"" + field + "\" (expected dtype, shape, data_offsets)");
    }
    const std::pair<const char*, const Json*> required[] = {
        {"dtype", dtype}, {"shape", shape}, {"data_offsets", offsets}};
    for (const auto& [field, p] : required) ND_CHECK(p != nullptr, what, ": missing field \"", field, "\"");
    ND_CHECK(dtype->kind == Json::String, what, ": expected \"dtype\" to be a string, found ",
             json::kind_name(dtype->kind));
    ND_CHECK(shape->kind == Json::Array, what, ": expected \"shape\" to be an array, found ",
             json::kind_name(shape->kind));
    ND_CHECK(offsets->kind == Json::Array && offsets->items.size() == 2, what,
             ": expected \"data_offsets\" to be an array [begin, end], found ",
             offsets->kind == Json::Array ? detail::str_cat("an array of ", offsets->items.size())
                                          : json::kind_name(offsets->kind));

    SafetensorsEntry e;
    e.name = name;
    const DtypeName* d =
        std::find_if(std::begin(kDtypes), std::end(kDtypes), [&](const DtypeName& x) { return dtype->text == x.name; });
    ND_CHECK(d != std::end(kDtypes), what, ": unsupported dtype \"", dtype->text,
             "\" (expected one of F32, F64, BF16, F16, I64, I32, U8, BOOL)");
    e.dtype = d->dtype;

    // Non-negative integer literal; limit bounds the value.
    auto integer = [&](const Json& j, const char* field, uint64_t limit) {
      ND_CHECK(j.kind == Json::Number, what, ": expected \"", field, "\" to hold non-negative integers, found ",
               json::kind_name(j.kind));
      ND_CHECK(!j.text.empty() && j.text.find_first_not_of("0123456789") == std::string::npos, what, ": expected \"",
               field, "\" to hold non-negative integers, found ", j.text);
      uint64_t x = 0;
      for (const char c : j.text) {
        const uint64_t digit = static_cast<uint64_t>(c - '0');
        ND_CHECK(x <= (limit - digit) / 10, what, ": \"", field, "\" value ", j.text, " is too large (limit ", limit,
                 ")");
        x = x * 10 + digit;
      }
      return x;
    };
    constexpr uint64_t kInt64Max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    uint64_t numel = 1;
    bool overflow = false;
    for (const Json& dim : shape->items) {
      const uint64_t n = integer(dim, "shape", kInt64Max);
      e.shape.push_back(static_cast<int64_t>(n));
      if (n != 0 && numel > kInt64Max / n)
        overflow = true;
      else
        numel *= n;
    }
    const bool zero = std::find(e.shape.begin(), e.shape.end(), 0) != e.shape.end();
    ND_CHECK(zero || !overflow, what, ": shape ", shape_str(e.shape), " has more elements than fit in int64");
    if (zero) numel = 0;
    ND_CHECK(numel <= std::numeric_limits<uint64_t>::max() / element_size(e.dtype), what, ": shape ",
             shape_str(e.shape), " has more bytes than fit in 64 bits");
    e.begin = integer(offsets->items[0], "data_offsets", std::numeric_limits<uint64_t>::max());
    e.end = integer(offsets->items[1], "data_offsets", std::numeric_limits<uint64_t>::max());
    ND_CHECK(e.begin <= e.end, what, ": data_offsets [", e.begin, ", ", e.end, "]: expected begin <= end");
    const uint64_t nbytes = numel * element_size(e.dtype);
    ND_CHECK(e.end - e.begin == nbytes, what, ": ", dtype->text, " ", shape_str(e.shape), " needs ", nbytes,
             " bytes, but data_offsets [", e.begin, ", ", e.end, "] span ", e.end - e.begin);
    h.tensors.push_back(std::move(e));
  }

  // The tensors must tile the data section exactly: no overlap, no gap, nothing past it.
  std::sort(h.tensors.begin(), h.tensors.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t pos = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const auto& e : h.tensors) {
    ND_CHECK(e.begin >= pos, where, ": tensor '", e.name, "' data_offsets [", e.begin, ", ", e.end,
             "] overlap tensor '", prev ? prev->name : "", "' [", prev ? prev->begin : 0, ", ", pos, "]");
    ND_CHECK(e.begin == pos, where, ": gap in the data: bytes [", pos, ", ", e.begin,
             ") belong to no tensor (expected tensor '", e.name, "' to start at ", pos, ")");
    ND_CHECK(e.end <= data_size, where, " is truncated: tensor '", e.name, "' data_offsets [", e.begin, ", ", e.end,
             "] reach past the ", data_size, " bytes of data in the file");
    pos = e.end;
    prev = &e;
  }
  ND_CHECK(pos == data_size, where, ": expected ", pos, " bytes of tensor data after the header, found ", data_size,
           " (", data_size - pos, " trailing bytes belong to no tensor)");
  return h;
}

SafetensorsHeader parse_safetensors(std::string_view file_bytes, const std::string& file) {
  const uint64_t n = parse_safetensors_header_length(file_bytes.substr(0, 8), file_bytes.size(), file);
  return parse_safetensors_header(file_bytes.substr(8, n), file_bytes.size() - 8 - n, file);
}

}  // namespace detail
}  // namespace nd

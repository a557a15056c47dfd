#include "io/event_file.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "engine/error.h"

namespace nd::tensorboard {

namespace {

const std::array<uint32_t, 256>& crc32c_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

void put_le(std::string& out, uint64_t bits, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>(bits >> (8 * i));
}

}  // namespace

uint32_t crc32c(std::string_view data, uint32_t crc) {
  const auto& table = crc32c_table();
  crc = ~crc;
  for (char c : data) crc = table[(crc ^ static_cast<uint8_t>(c)) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

EventFileWriter::EventFileWriter(const std::string& log_dir) {
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  ND_CHECK(!ec, "SummaryWriter: cannot create the log folder ", log_dir, ": ", ec.message());
  // <n> keeps two writers of one process in one second apart, as PyTorch's global uid does.
  static std::atomic<int> counter{0};
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  const auto now = std::chrono::system_clock::now();
  const double wall_time = std::chrono::duration<double>(now.time_since_epoch()).count();
  char name[512];
  std::snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s.%d.%d", static_cast<long long>(wall_time), host,
                static_cast<int>(getpid()), counter++);
  path_ = (std::filesystem::path(log_dir) / name).string();
  file_ = std::fopen(path_.c_str(), "wb");
  ND_CHECK(file_ != nullptr, "SummaryWriter: cannot create ", path_, ": ", std::strerror(errno));
  Event first;
  first.wall_time = wall_time;
  first.file_version = "brain.Event:2";
  add_event(first);
  flush();  // TensorBoard recognizes the run as soon as the file has its first record
}

EventFileWriter::~EventFileWriter() {
  try {
    close();
  } catch (const Error& e) {
    warn(e.what());
  }
}

void EventFileWriter::add_event(const Event& event) {
  ND_CHECK(file_ != nullptr, "SummaryWriter: ", path_, " is closed");
  const std::string data = serialize(event);
  std::string record;
  put_le(record, data.size(), 8);
  const uint32_t length_crc = masked_crc32c(record);
  put_le(record, length_crc, 4);
  record += data;
  put_le(record, masked_crc32c(data), 4);
  ND_CHECK(std::fwrite(record.data(), 1, record.size(), file_) == record.size(), "SummaryWriter: cannot write ", path_,
           ": ", std::strerror(errno));
}

void EventFileWriter::flush() {
  if (file_) ND_CHECK(std::fflush(file_) == 0, "SummaryWriter: cannot write ", path_, ": ", std::strerror(errno));
}

void EventFileWriter::close() {
  if (!file_) return;
  std::FILE* f = file_;
  file_ = nullptr;
  ND_CHECK(std::fclose(f) == 0, "SummaryWriter: cannot write ", path_, ": ", std::strerror(errno));
}

std::vector<Event> read_events(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ND_CHECK(in.good(), "read_events: cannot open ", path);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string_view all(bytes);
  auto le = [&](size_t at, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(all[at + i])) << (8 * i);
    return v;
  };
  std::vector<Event> events;
  for (size_t at = 0; at < all.size();) {
    const size_t left = all.size() - at;
    auto truncated = [&](uint64_t needed) {
      warn("read_events: " + path + ": the last record, at offset " + std::to_string(at) + ", is truncated (" +
           std::to_string(left) + " of " + std::to_string(needed) +
           " bytes; was the writer killed mid-write?); skipped");
    };
    if (left < 12) {
      truncated(12);
      break;
    }
    const uint64_t length = le(at, 8);
    const auto length_crc = static_cast<uint32_t>(le(at + 8, 4));
    ND_CHECK(masked_crc32c(all.substr(at, 8)) == length_crc, "read_events: ", path, ": corrupt record at offset ", at,
             ": the length's masked CRC-32C is ", hex(masked_crc32c(all.substr(at, 8))), ", the file says ",
             hex(length_crc));
    if (left < 16 || length > left - 16) {  // also when the CRC after the data is missing
      truncated(length + 16);
      break;
    }
    const std::string_view data = all.substr(at + 12, length);
    const auto data_crc = static_cast<uint32_t>(le(at + 12 + length, 4));
    ND_CHECK(masked_crc32c(data) == data_crc, "read_events: ", path, ": corrupt record at offset ", at,
             ": the data's masked CRC-32C is ", hex(masked_crc32c(data)), ", the file says ", hex(data_crc));
    try {
      events.push_back(parse_event(data));
    } catch (const Error& e) {
      throw Error("read_events: " + path + ": record at offset " + std::to_string(at) + ": " + e.what());
    }
    at += 16 + length;
  }
  return events;
}

}  // namespace nd::tensorboard

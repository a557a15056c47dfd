#pragma once
// TensorBoard's event files, written and read: Events (io/summary_proto.h), each in
// TFRecord framing:
//   uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)
// (little-endian; mask = ((crc >> 15) | (crc << 17)) + 0xa282ead8). The reader checks
// both CRCs: a damaged record in the middle is an nd::Error naming the file and offset;
// a truncated last record (the writer was killed mid-write) is skipped with a warning.
// The public face is SummaryWriter (io/tensorboard.h). Tests:
// tests/tensorboard/tensorboard_test.cpp (and against Python's tensorboard package).
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "io/summary_proto.h"

namespace nd::tensorboard {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `data`, continuing `crc`.
uint32_t crc32c(std::string_view data, uint32_t crc = 0);
// TFRecord's masked CRC: a CRC stored next to data that holds CRCs must not look like one.
uint32_t masked_crc32c(std::string_view data);

// Appends one TFRecord-framed record to an event file named as TensorFlow's are:
// events.out.tfevents.<unix time>.<hostname>.<pid>.<n> in `log_dir` (created), whose
// first record is the file_version event. Records are buffered: flush() pushes them to
// the file, close() flushes and closes (also on destruction).
class EventFileWriter {
 public:
  explicit EventFileWriter(const std::string& log_dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  void add_event(const Event& event);
  void flush();
  void close();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// Every event of an event file, in order (the file_version event first), after checking
// each record's two CRCs. A truncated last record is skipped with nd::warn; a bad CRC or
// a malformed message is an nd::Error naming the file and the record's offset.
std::vector<Event> read_events(const std::string& path);

}  // namespace nd::tensorboard

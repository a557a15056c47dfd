#pragma once
// The few TensorBoard messages a SummaryWriter writes (tensorboard/compat/proto/
// event.proto, summary.proto, histogram.proto, tensor.proto), with their protobuf wire
// encoding written by hand: no protobuf dependency. Field numbers are in the comments.
// Event files around them: io/event_file.h. Tests: tests/tensorboard/tensorboard_test.cpp.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nd::tensorboard {

// The messages, named and numbered as in TensorBoard's .proto files; only the fields a
// SummaryWriter writes. Fields the reader does not know are skipped.
struct HistogramProto {
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;  // fields 1..5
  // bucket[i] counts the values from bucket_limit[i-1] (-DBL_MAX for i = 0) to bucket_limit[i].
  std::vector<double> bucket_limit, bucket;  // 6, 7: packed doubles
};

inline constexpr int kDtString = 7;  // tensorboard.DataType DT_STRING

struct TensorProto {
  int dtype = 0;                        // 1
  std::vector<int64_t> tensor_shape;    // 2: TensorShapeProto {dim = 2: Dim {size = 1}}
  std::vector<std::string> string_val;  // 8
};

struct Summary {
  struct Image {
    int height = 0, width = 0;         // 1, 2
    int colorspace = 0;                // 3: channels (1 gray, 3 RGB, 4 RGBA)
    std::string encoded_image_string;  // 4: a PNG
  };
  struct Value {
    std::string tag;  // 1
    // The oneof `value`: exactly one is set.
    std::optional<float> simple_value;    // 2
    std::optional<Image> image;           // 4
    std::optional<HistogramProto> histo;  // 5
    std::optional<TensorProto> tensor;    // 8
    // metadata = 9: SummaryMetadata {plugin_data = 1: {plugin_name = 1, content = 2}}
    std::string plugin_name, plugin_content;
  };
  std::vector<Value> value;  // 1
};

// A START at event step N says the run (re)started at N: TensorBoard's loader then drops
// every event it has read with step >= N (what SummaryWriter's purge_step writes).
struct SessionLog {
  enum SessionStatus { STATUS_UNSPECIFIED = 0, START = 1, STOP = 2, CHECKPOINT = 3 };
  int status = STATUS_UNSPECIFIED;  // 1
};

struct Event {
  double wall_time = 0;  // 1: seconds since the epoch
  int64_t step = 0;      // 2
  // The oneof `what`: the first event of a file has file_version "brain.Event:2", the
  // others a summary (or, for purge_step, another file_version and a session_log).
  std::string file_version;               // 3
  std::optional<Summary> summary;         // 5
  std::optional<SessionLog> session_log;  // 7
};

// Protobuf wire format of an Event, and back. parse_event throws nd::Error on bytes
// that are not a well-formed message.
std::string serialize(const Event& event);
Event parse_event(std::string_view bytes);

}  // namespace nd::tensorboard

#include "io/summary_proto.h"

#include <cstring>

#include "engine/error.h"

namespace nd::tensorboard {

namespace {

// ---- protobuf wire format: key = field << 3 | wire type ----
enum Wire : uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  for (; v >= 0x80; v >>= 7) out += static_cast<char>(v | 0x80);
  out += static_cast<char>(v);
}
void put_key(std::string& out, int field, Wire wire) { put_varint(out, static_cast<uint64_t>(field) << 3 | wire); }
void put_le(std::string& out, uint64_t bits, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>(bits >> (8 * i));
}
void put_double(std::string& out, int field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  put_key(out, field, kFixed64);
  put_le(out, bits, 8);
}
void put_float(std::string& out, int field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  put_key(out, field, kFixed32);
  put_le(out, bits, 4);
}
// int32 and int64 alike: a negative value is sign-extended to ten bytes, as protobuf does.
void put_int(std::string& out, int field, int64_t v) {
  put_key(out, field, kVarint);
  put_varint(out, static_cast<uint64_t>(v));
}
void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, kBytes);
  put_varint(out, bytes.size());
  out += bytes;
}
void put_packed_doubles(std::string& out, int field, const std::vector<double>& values) {
  std::string packed;
  for (double v : values) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    put_le(packed, bits, 8);
  }
  put_bytes(out, field, packed);
}

// Reads one message's fields in order; every overrun or wrong wire type throws.
class WireReader {
 public:
  WireReader(std::string_view bytes, const char* message) : bytes_(bytes), message_(message) {}
  bool done() const { return at_ == bytes_.size(); }
  // The next field's number; its wire type goes to wire_.
  int next() {
    const uint64_t key = varint();
    wire_ = static_cast<uint32_t>(key & 7);
    return static_cast<int>(key >> 3);
  }
  void expect(Wire wire, const char* field) const {
    ND_CHECK(wire_ == wire, "malformed ", message_, ": field '", field, "' has wire type ", wire_, ", expected ",
             static_cast<int>(wire));
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      need(1);
      const auto b = static_cast<uint8_t>(bytes_[at_++]);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    ND_CHECK(false, "malformed ", message_, ": a varint longer than ten bytes at byte ", at_);
    return 0;
  }
  uint64_t fixed(int bytes) {
    need(static_cast<size_t>(bytes));
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(bytes_[at_++])) << (8 * i);
    return v;
  }
  double f64() {
    const uint64_t bits = fixed(8);
    double v;
    std::memcpy(&v, &bits, 8);
    return v;
  }
  float f32() {
    const auto bits = static_cast<uint32_t>(fixed(4));
    float v;
    std::memcpy(&v, &bits, 4);
    return v;
  }
  std::string_view bytes() {
    const uint64_t n = varint();
    need(n);
    const std::string_view v = bytes_.substr(at_, n);
    at_ += n;
    return v;
  }
  // Repeated doubles: packed (what writers emit) or one element per key.
  void append_doubles(std::vector<double>& out, const char* field) {
    if (wire_ == kFixed64) return out.push_back(f64());
    expect(kBytes, field);
    WireReader packed(bytes(), message_);
    ND_CHECK(packed.bytes_.size() % 8 == 0, "malformed ", message_, ": packed '", field, "' of ", packed.bytes_.size(),
             " bytes, not a multiple of 8");
    while (!packed.done()) out.push_back(packed.f64());
  }
  void skip() {
    switch (wire_) {
      case kVarint:
        varint();
        return;
      case kFixed64:
        fixed(8);
        return;
      case kBytes:
        bytes();
        return;
      case kFixed32:
        fixed(4);
        return;
      default:
        ND_CHECK(false, "malformed ", message_, ": unknown wire type ", wire_, " at byte ", at_);
    }
  }

 private:
  void need(uint64_t n) const {
    ND_CHECK(n <= bytes_.size() - at_, "malformed ", message_, ": ", n, " bytes needed at byte ", at_, " of ",
             bytes_.size());
  }
  std::string_view bytes_;
  const char* message_;
  size_t at_ = 0;
  uint32_t wire_ = 0;
};

// Calls fn(field number, reader) for each field of the message in `bytes`; fn reads the
// field's value and returns true, or returns false and the field is skipped (unknown).
template <class Fn>
void for_each_field(std::string_view bytes, const char* message, Fn fn) {
  WireReader r(bytes, message);
  while (!r.done())
    if (!fn(r.next(), r)) r.skip();
}

std::string serialize(const HistogramProto& h) {
  std::string out;
  put_double(out, 1, h.min);
  put_double(out, 2, h.max);
  put_double(out, 3, h.num);
  put_double(out, 4, h.sum);
  put_double(out, 5, h.sum_squares);
  put_packed_doubles(out, 6, h.bucket_limit);
  put_packed_doubles(out, 7, h.bucket);
  return out;
}

HistogramProto parse_histogram(std::string_view bytes) {
  HistogramProto h;
  double* scalars[] = {&h.min, &h.max, &h.num, &h.sum, &h.sum_squares};
  for_each_field(bytes, "HistogramProto", [&](int field, WireReader& r) {
    if (field >= 1 && field <= 5) return r.expect(kFixed64, "min..sum_squares"), *scalars[field - 1] = r.f64(), true;
    if (field == 6) return r.append_doubles(h.bucket_limit, "bucket_limit"), true;
    if (field == 7) return r.append_doubles(h.bucket, "bucket"), true;
    return false;
  });
  return h;
}

std::string serialize(const TensorProto& t) {
  std::string out, shape;
  put_int(out, 1, t.dtype);
  for (int64_t size : t.tensor_shape) {
    std::string dim;
    put_int(dim, 1, size);
    put_bytes(shape, 2, dim);
  }
  put_bytes(out, 2, shape);
  for (const std::string& s : t.string_val) put_bytes(out, 8, s);
  return out;
}

TensorProto parse_tensor(std::string_view bytes) {
  TensorProto t;
  for_each_field(bytes, "TensorProto", [&](int field, WireReader& r) {
    if (field == 1) return r.expect(kVarint, "dtype"), t.dtype = static_cast<int>(r.varint()), true;
    if (field == 8) return r.expect(kBytes, "string_val"), t.string_val.emplace_back(r.bytes()), true;
    if (field != 2) return false;
    r.expect(kBytes, "tensor_shape");
    for_each_field(r.bytes(), "TensorShapeProto", [&](int shape_field, WireReader& shape) {
      if (shape_field != 2) return false;
      shape.expect(kBytes, "dim");
      int64_t size = 0;
      for_each_field(shape.bytes(), "TensorShapeProto.Dim", [&](int dim_field, WireReader& dim) {
        return dim_field == 1 && (dim.expect(kVarint, "size"), size = static_cast<int64_t>(dim.varint()), true);
      });
      t.tensor_shape.push_back(size);
      return true;
    });
    return true;
  });
  return t;
}

std::string serialize(const Summary::Value& v) {
  std::string out;
  put_bytes(out, 1, v.tag);
  if (v.simple_value) put_float(out, 2, *v.simple_value);
  if (v.image) {
    std::string image;
    put_int(image, 1, v.image->height);
    put_int(image, 2, v.image->width);
    put_int(image, 3, v.image->colorspace);
    put_bytes(image, 4, v.image->encoded_image_string);
    put_bytes(out, 4, image);
  }
  if (v.histo) put_bytes(out, 5, serialize(*v.histo));
  if (v.tensor) put_bytes(out, 8, serialize(*v.tensor));
  if (!v.plugin_name.empty()) {
    std::string plugin_data, metadata;
    put_bytes(plugin_data, 1, v.plugin_name);
    put_bytes(plugin_data, 2, v.plugin_content);
    put_bytes(metadata, 1, plugin_data);
    put_bytes(out, 9, metadata);
  }
  return out;
}

Summary::Image parse_image(std::string_view bytes) {
  Summary::Image image;
  int* ints[] = {&image.height, &image.width, &image.colorspace};
  for_each_field(bytes, "Summary.Image", [&](int field, WireReader& r) {
    if (field >= 1 && field <= 3)
      return r.expect(kVarint, "height/width/colorspace"), *ints[field - 1] = static_cast<int>(r.varint()), true;
    if (field == 4) return r.expect(kBytes, "encoded_image_string"), image.encoded_image_string = r.bytes(), true;
    return false;
  });
  return image;
}

Summary::Value parse_value(std::string_view bytes) {
  Summary::Value v;
  for_each_field(bytes, "Summary.Value", [&](int field, WireReader& r) {
    if (field == 1) return r.expect(kBytes, "tag"), v.tag = r.bytes(), true;
    if (field == 2) return r.expect(kFixed32, "simple_value"), v.simple_value = r.f32(), true;
    if (field == 4) return r.expect(kBytes, "image"), v.image = parse_image(r.bytes()), true;
    if (field == 5) return r.expect(kBytes, "histo"), v.histo = parse_histogram(r.bytes()), true;
    if (field == 8) return r.expect(kBytes, "tensor"), v.tensor = parse_tensor(r.bytes()), true;
    if (field != 9) return false;
    r.expect(kBytes, "metadata");
    for_each_field(r.bytes(), "SummaryMetadata", [&](int metadata_field, WireReader& metadata) {
      if (metadata_field != 1) return false;
      metadata.expect(kBytes, "plugin_data");
      for_each_field(metadata.bytes(), "SummaryMetadata.PluginData", [&](int plugin_field, WireReader& plugin) {
        if (plugin_field == 1) return plugin.expect(kBytes, "plugin_name"), v.plugin_name = plugin.bytes(), true;
        if (plugin_field == 2) return plugin.expect(kBytes, "content"), v.plugin_content = plugin.bytes(), true;
        return false;
      });
      return true;
    });
    return true;
  });
  return v;
}

}  // namespace

std::string serialize(const Event& event) {
  std::string out;
  put_double(out, 1, event.wall_time);
  put_int(out, 2, event.step);
  if (!event.file_version.empty()) put_bytes(out, 3, event.file_version);
  if (event.summary) {
    std::string summary;
    for (const Summary::Value& v : event.summary->value) put_bytes(summary, 1, serialize(v));
    put_bytes(out, 5, summary);
  }
  if (event.session_log) {
    std::string log;
    if (event.session_log->status != SessionLog::STATUS_UNSPECIFIED) put_int(log, 1, event.session_log->status);
    put_bytes(out, 7, log);
  }
  return out;
}

Event parse_event(std::string_view bytes) {
  Event event;
  for_each_field(bytes, "Event", [&](int field, WireReader& r) {
    if (field == 1) return r.expect(kFixed64, "wall_time"), event.wall_time = r.f64(), true;
    if (field == 2) return r.expect(kVarint, "step"), event.step = static_cast<int64_t>(r.varint()), true;
    if (field == 3) return r.expect(kBytes, "file_version"), event.file_version = r.bytes(), true;
    if (field == 7) {
      r.expect(kBytes, "session_log");
      SessionLog& log = event.session_log.emplace();
      for_each_field(r.bytes(), "SessionLog", [&](int log_field, WireReader& v) {
        return log_field == 1 && (v.expect(kVarint, "status"), log.status = static_cast<int>(v.varint()), true);
      });
      return true;
    }
    if (field != 5) return false;
    r.expect(kBytes, "summary");
    Summary& summary = event.summary.emplace();
    for_each_field(r.bytes(), "Summary", [&](int summary_field, WireReader& values) {
      return summary_field == 1 &&
             (values.expect(kBytes, "value"), summary.value.push_back(parse_value(values.bytes())), true);
    });
    return true;
  });
  return event;
}

}  // namespace nd::tensorboard

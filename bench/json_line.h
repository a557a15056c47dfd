// The JSON line every bench binary prints per row: one object on one line, fields in the
// order added. The shared fields come first, through row():
//   {"op","shape","dtype","impl","ms","gflops","gbps","baseline","ratio"}
// then whatever fields a binary adds of its own ("note", "model", "comm_ms", ...).
// Numbers are printed with the caller's printf format, so each binary keeps the
// precision its readers (RESULTS.md, gpu_check.sh) expect. Strings are escaped by
// io/json.h's one escaper (nd::json::quoted).
// Header-only: every bench/*.cpp is its own executable (bench/CMakeLists.txt).
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

#include "io/json.h"

namespace nd::bench {

class JsonLine {
 public:
  // A line starting with the four string fields of a row: op, shape, dtype, impl.
  static JsonLine row(const std::string& op, const std::string& shape, const std::string& dtype,
                      const std::string& impl) {
    JsonLine line;
    line.text("op", op).text("shape", shape).text("dtype", dtype).text("impl", impl);
    return line;
  }

  JsonLine& text(const char* key, const std::string& value) { return raw(key, nd::json::quoted(value)); }
  // null for an empty string (a baseline row has no "baseline").
  JsonLine& text_or_null(const char* key, const std::string& value) {
    return value.empty() ? null(key) : text(key, value);
  }
  // `value` with the printf format `fmt` ("%.4f", "%d" needs an int: use integer()).
  JsonLine& number(const char* key, double value, const char* fmt) {
    char buf[64];
    std::snprintf(buf, sizeof buf, fmt, value);
    return raw(key, buf);
  }
  JsonLine& integer(const char* key, long long value) { return raw(key, std::to_string(value)); }
  // null for a value that was not measured or means nothing: <= 0, NaN or infinite.
  JsonLine& positive_or_null(const char* key, double value, const char* fmt) {
    return value > 0 && std::isfinite(value) ? number(key, value, fmt) : null(key);
  }
  JsonLine& null(const char* key) { return raw(key, "null"); }

  std::string str() const { return "{" + body_ + "}"; }
  // Prints the line and flushes: a benchmark killed by a timeout keeps the rows printed.
  void print() const {
    std::printf("%s\n", str().c_str());
    std::fflush(stdout);
  }

 private:
  JsonLine& raw(const char* key, const std::string& value) {
    if (!body_.empty()) body_ += ',';
    body_ += nd::json::quoted(key) + ":" + value;
    return *this;
  }

  std::string body_;
};

}  // namespace nd::bench

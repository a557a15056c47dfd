#include "io/json.h"

#include <cstdint>
#include <cstring>
#include <unordered_set>

#include "engine/error.h"

namespace nd::json {

const char* kind_name(Json::Kind k) {
  static const char* names[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
  return names[k];
}

namespace {

class JsonParser {
 public:
  JsonParser(std::string_view s, std::string what) : s_(s), what_(std::move(what)) {}

  Json parse_document() {
    Json v = value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("end of JSON", found());
    return v;
  }

 private:
  static constexpr int kMaxDepth = 32;  // the header needs 3

  [[noreturn]] void fail(const std::string& expected, const std::string& found) const {
    throw Error(
        detail::str_cat(what_, " is not valid JSON: expected ", expected, " at byte ", pos_, ", found ", found));
  }
  std::string found() const {
    if (pos_ >= s_.size()) return "end of header";
    const unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (c >= 0x20 && c < 0x7f) return std::string("'") + static_cast<char>(c) + "'";
    return detail::str_cat("byte 0x", "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15]);
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool eat(char c) {
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == c) return ++pos_, true;
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("'") + c + "'", found());
  }

  Json value(int depth) {
    if (depth > kMaxDepth) fail(detail::str_cat("at most ", kMaxDepth, " levels of nesting"), "deeper nesting");
    skip_ws();
    Json v;
    if (pos_ >= s_.size()) fail("a value", found());
    const char c = s_[pos_];
    if (c == '{') {
      v.kind = Json::Object;
      ++pos_;
      if (eat('}')) return v;
      std::unordered_set<std::string> seen;  // a set, so a huge header cannot make this quadratic
      do {
        skip_ws();
        const size_t key_pos = pos_;
        std::string key = string();
        if (!seen.insert(key).second) pos_ = key_pos, fail("unique keys", "duplicate key \"" + key + "\"");
        expect(':');
        v.keys.push_back(std::move(key));
        v.items.push_back(value(depth + 1));
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      v.kind = Json::Array;
      ++pos_;
      if (eat(']')) return v;
      do v.items.push_back(value(depth + 1));
      while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Json::String;
      v.text = string();
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = Json::Number;
      const size_t start = pos_;
      while (pos_ < s_.size() && std::strchr("+-.eE0123456789", s_[pos_]) && s_[pos_] != '\0') ++pos_;
      v.text = std::string(s_.substr(start, pos_ - start));
    } else if (s_.substr(pos_, 4) == "null") {
      pos_ += 4;
    } else if (s_.substr(pos_, 4) == "true" || s_.substr(pos_, 5) == "false") {
      v.kind = Json::Bool;
      v.text = s_[pos_] == 't' ? "true" : "false";
      pos_ += v.text.size();
    } else {
      fail("a value", found());
    }
    return v;
  }

  uint32_t hex4() {
    if (s_.size() - pos_ < 4) fail("4 hex digits after \\u", found());
    uint32_t u = 0;
    for (int i = 0; i < 4; ++i, ++pos_) {
      const char h = s_[pos_];
      const int d = h >= '0' && h <= '9'   ? h - '0'
                    : h >= 'a' && h <= 'f' ? h - 'a' + 10
                    : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                           : -1;
      if (d < 0) fail("a hex digit", found());
      u = u * 16 + static_cast<uint32_t>(d);
    }
    return u;
  }

  std::string string() {
    if (pos_ >= s_.size() || s_[pos_] != '"') fail("a string", found());
    ++pos_;
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("closing '\"'", found());
      const char c = s_[pos_];
      if (c == '"') return ++pos_, out;
      if (static_cast<unsigned char>(c) < 0x20) fail("no raw control characters in strings", found());
      if (c != '\\') {
        out += c, ++pos_;
        continue;
      }
      if (++pos_ >= s_.size()) fail("an escape", found());
      const char e = s_[pos_++];
      if (e != 'u') {
        static constexpr std::string_view kEscapes = "\"\\/bfnrt", kMeanings = "\"\\/\b\f\n\r\t";
        const size_t k = kEscapes.find(e);
        if (k == std::string_view::npos) --pos_, fail("one of \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u", found());
        out += kMeanings[k];
        continue;
      }
      uint32_t cp = hex4();
      if (cp >= 0xd800 && cp < 0xdc00) {  // high surrogate: a low one must follow
        if (s_.substr(pos_, 2) != "\\u") fail("a low surrogate \\uDC00-\\uDFFF", found());
        pos_ += 2;
        const uint32_t lo = hex4();
        if (lo < 0xdc00 || lo >= 0xe000) fail("a low surrogate \\uDC00-\\uDFFF", "another code unit");
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
      } else if (cp >= 0xdc00 && cp < 0xe000) {
        fail("a high surrogate before a low one", "a lone low surrogate");
      }
      append_utf8(out, cp);
    }
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6)), out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12)), out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18)), out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f)), out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  std::string_view s_;
  std::string what_;
  size_t pos_ = 0;
};

}  // namespace

Json parse(std::string_view text, const std::string& what) { return JsonParser(text, what).parse_document(); }


void write_string(std::string& out, const std::string& s) {
  out += '"';
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\', out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += detail::str_cat("\\u00", "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15]);
    } else {
      out += c;
    }
  }
  out += '"';
}

std::string quoted(const std::string& s) {
  std::string out;
  write_string(out, s);
  return out;
}

std::string object(const std::map<std::string, std::string>& m) {
  std::string out = "{";
  for (const auto& [k, v] : m) {
    if (out.size() > 1) out += ',';
    write_string(out, k);
    out += ':';
    write_string(out, v);
  }
  return out + "}";
}

// A JSON object of strings -> strings (the metadata, and nanoddp.devices inside it).
std::map<std::string, std::string> string_map(const Json& j, const std::string& what) {
  ND_CHECK(j.kind == Json::Object, what, ": expected an object of strings, found ", kind_name(j.kind));
  std::map<std::string, std::string> out;
  for (size_t i = 0; i < j.keys.size(); ++i) {
    const std::string& k = j.keys[i];
    const Json& v = j.items[i];
    ND_CHECK(v.kind == Json::String, what, ": expected a string value for key \"", k, "\", found ", kind_name(v.kind));
    out[k] = v.text;
  }
  return out;
}

}  // namespace nd::json

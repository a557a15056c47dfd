#pragma once
// The JSON that safetensors headers need, and no more: objects, arrays, strings,
// unsigned integers, booleans and null, parsed strictly and with bounded nesting, so
// a hostile checkpoint header is an nd::Error, never a crash (tests/fuzz/ drives it).
// Used by io/checkpoint.cpp; tests: tests/io/checkpoint_test.cpp.
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace nd::json {

struct Json {
  enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
  std::string text;               // String: the decoded value; Number: the literal
  std::vector<Json> items;        // Array elements, or Object values
  std::vector<std::string> keys;  // Object keys (keys[i] names items[i]), in file order
};

// "object", "string", ... for messages.
const char* kind_name(Json::Kind k);

// Parses a whole document; `what` names it in errors ("model.safetensors: the header").
Json parse(std::string_view text, const std::string& what);

// Appends s as a JSON string literal: quotes, a backslash before '"' and '\\', control
// characters as \u00XX. The one escaper: checkpoints, the apps' metrics.jsonl and the
// benchmarks' JSON lines all write strings through it.
void write_string(std::string& out, const std::string& s);
// The same literal as a new string.
std::string quoted(const std::string& s);
// {"k":"v",...} in key order.
std::string object(const std::map<std::string, std::string>& m);
// A JSON object of strings -> strings, or an nd::Error naming `what`.
std::map<std::string, std::string> string_map(const Json& j, const std::string& what);

}  // namespace nd::json

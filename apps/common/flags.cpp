#include "common/flags.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>

namespace app {

std::string format_double(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

namespace {

}  // namespace

Flags::Flags(std::string program, std::string description)
    : program_(std::move(program)), description_(std::move(description)) {}

void Flags::add(const std::string& name, int64_t* target, const std::string& help, int64_t min_value) {
  flags_.push_back({name, help, Kind::Int, target, min_value, std::to_string(*target), "", {}, {}, {}});
}
void Flags::add(const std::string& name, double* target, const std::string& help) {
  flags_.push_back({name, help, Kind::Double, target, 0, format_double(*target), "", {}, {}, {}});
}
void Flags::add(const std::string& name, std::string* target, const std::string& help, const std::string& metavar) {
  flags_.push_back({name, help, Kind::String, target, 0, *target, metavar, {}, {}, {}});
}
void Flags::add(const std::string& name, bool* target, const std::string& help) {
  flags_.push_back({name, help, Kind::Bool, target, 0, "", "", {}, {}, {}});
}
void Flags::add_choice(const std::string& name, std::vector<std::string> names, const std::string& help,
                       const std::string& metavar, std::function<void(size_t)> choose,
                       std::function<std::optional<size_t>()> chosen) {
  const std::optional<size_t> current = chosen();
  const std::string default_text = current ? names.at(*current) : "";
  flags_.push_back({name, help, Kind::Choice, nullptr, 0, default_text, metavar, std::move(names), std::move(choose),
                    std::move(chosen)});
}

const Flags::Flag* Flags::find(const std::string& name) const {
  for (const Flag& f : flags_)
    if (f.name == name) return &f;
  return nullptr;
}

std::string Flags::usage() const {
  std::ostringstream out;
  out << "Usage: " << program_ << " [options]\n" << description_ << "\n\nOptions:\n";
  for (const Flag& f : flags_) {
    std::string left = "  " + f.name;
    if (f.kind == Kind::Int) left += " N";
    if (f.kind == Kind::Double) left += " X";
    if (f.kind == Kind::String || f.kind == Kind::Choice) left += " " + f.metavar;
    if (left.size() < 22) left.resize(22, ' ');
    else left += "\n" + std::string(22, ' ');
    out << left << f.help;
    if (f.kind != Kind::Bool && !f.default_text.empty()) out << " (default " << f.default_text << ")";
    out << "\n";
  }
  out << "  --help              print this help and exit\n";
  return out.str();
}

std::string Flags::value_text(const Flag& f) const {
  switch (f.kind) {
    case Kind::Int: return std::to_string(*static_cast<const int64_t*>(f.target));
    case Kind::Double: return format_double(*static_cast<const double*>(f.target));
    case Kind::String: return *static_cast<const std::string*>(f.target);
    case Kind::Bool: return *static_cast<const bool*>(f.target) ? "yes" : "no";
    case Kind::Choice: {
      const std::optional<size_t> i = f.chosen();
      return i ? f.names.at(*i) : "";
    }
  }
  return "";
}

void Flags::set(const Flag& flag, const std::string& value) {
  switch (flag.kind) {
    case Kind::Int: {
      int64_t v = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (ec != std::errc() || end != value.data() + value.size() || v < flag.min_value)
        throw UsageError{flag.name + " expects an integer >= " + std::to_string(flag.min_value) + ", got '" +
                         value + "'"};
      *static_cast<int64_t*>(flag.target) = v;
      break;
    }
    case Kind::Double: {
      char* end = nullptr;
      const double v = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(v > 0) || !std::isfinite(v))
        throw UsageError{flag.name + " expects a positive number, got '" + value + "'"};
      *static_cast<double*>(flag.target) = v;
      break;
    }
    case Kind::String:
      if (value.empty()) throw UsageError{flag.name + " needs a non-empty value"};
      *static_cast<std::string*>(flag.target) = value;
      break;
    case Kind::Bool:
      *static_cast<bool*>(flag.target) = true;
      break;
    case Kind::Choice: {
      const auto it = std::find(flag.names.begin(), flag.names.end(), value);
      if (it == flag.names.end()) {
        std::string expected;
        for (size_t i = 0; i < flag.names.size(); ++i)
          expected += (i == 0 ? "" : i + 1 == flag.names.size() ? " or " : ", ") + flag.names[i];
        throw UsageError{flag.name + ": expected " + expected + ", found '" + value + "'"};
      }
      flag.choose(static_cast<size_t>(it - flag.names.begin()));
      break;
    }
  }
}

void Flags::parse(int argc, char** argv) {
  command_line_.assign(argv, argv + argc);
  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i];
    if (name == "--help" || name == "-h") {
      std::cout << usage();
      std::exit(0);
    }
    std::string value;
    bool has_value = false;
    if (const size_t eq = name.find('='); name.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
      has_value = true;
    }
    const Flag* flag = find(name);
    if (!flag) throw UsageError{"unknown option '" + name + "'"};
    if (flag->kind == Kind::Bool) {
      if (has_value) throw UsageError{name + " takes no value"};
    } else if (!has_value) {
      if (i + 1 >= argc) throw UsageError{name + " needs a value"};
      value = argv[++i];
    }
    set(*flag, value);
    given_.insert(name);
  }
  values_markdown_ = "| flag | value |\n|---|---|\n";
  for (const Flag& f : flags_) values_markdown_ += "| " + f.name + " | " + value_text(f) + " |\n";
}

}  // namespace app

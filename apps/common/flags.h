#pragma once
// Command-line flags for the training apps: each app declares its flags (name, target
// variable, help), parse() fills the targets. "--flag value" and "--flag=value" both
// work; --help prints the usage and exits 0; an unknown flag, a missing or malformed
// value is a UsageError (the app prints it on one line and exits with status 2).
// Tests: tests/apps/apps_test.cpp.
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace app {

// `v` as printf's %g writes it (0.00015, 2e-05): flag defaults, the apps' log lines.
std::string format_double(double v);

// A bad command line: run_main prints "<program>: <message>" and exits with status 2.
struct UsageError {
  std::string message;
};

class Flags {
 public:
  Flags(std::string program, std::string description);

  // An integer >= min_value.
  void add(const std::string& name, int64_t* target, const std::string& help, int64_t min_value = 1);
  // A finite number > 0.
  void add(const std::string& name, double* target, const std::string& help);
  // A non-empty string; `metavar` names it in the usage ("DIR", "PATH").
  void add(const std::string& name, std::string* target, const std::string& help, const std::string& metavar = "S");
  // A switch: present = true (no value).
  void add(const std::string& name, bool* target, const std::string& help);
  // One of `names`, stored as an enum E whose values 0, 1, ... are the names in order;
  // another value is a UsageError naming them ("--comm-hook: expected none, bf16, fp16 or
  // powersgd, found 'x'"). A std::optional<E> stays empty unless the flag is given (the
  // usage then shows no default).
  template <class E>
  void add_choice(const std::string& name, E* target, std::vector<std::string> names, const std::string& help,
                  const std::string& metavar = "S") {
    add_choice(name, std::move(names), help, metavar, [target](size_t i) { *target = static_cast<E>(i); },
               [target] { return std::optional<size_t>(static_cast<size_t>(*target)); });
  }
  template <class E>
  void add_choice(const std::string& name, std::optional<E>* target, std::vector<std::string> names,
                  const std::string& help, const std::string& metavar = "S") {
    add_choice(name, std::move(names), help, metavar, [target](size_t i) { *target = static_cast<E>(i); },
               [target] { return *target ? std::optional<size_t>(static_cast<size_t>(**target)) : std::nullopt; });
  }

  // Fills the targets; prints usage and exits 0 on --help; throws UsageError.
  void parse(int argc, char** argv);
  // Whether `name` ("--lr") was given on the command line.
  bool given(const std::string& name) const { return given_.count(name) != 0; }
  std::string usage() const;
  // Every flag with the value parse() left it with, as a markdown table (TensorBoard's
  // text tab shows it).
  const std::string& values_markdown() const { return values_markdown_; }
  const std::string& program() const { return program_; }
  // The command line parse() was given, argv[0] first, each word as given.
  const std::vector<std::string>& command_line() const { return command_line_; }

 private:
  enum class Kind { Int, Double, String, Bool, Choice };
  struct Flag {
    std::string name, help;
    Kind kind;
    void* target;
    int64_t min_value = 0;
    std::string default_text, metavar;
    std::vector<std::string> names;                   // Choice: the allowed values
    std::function<void(size_t)> choose;               // Choice: stores names[i]'s enum
    std::function<std::optional<size_t>()> chosen;    // Choice: the current one's index, if any
  };
  void add_choice(const std::string& name, std::vector<std::string> names, const std::string& help,
                  const std::string& metavar, std::function<void(size_t)> choose,
                  std::function<std::optional<size_t>()> chosen);
  const Flag* find(const std::string& name) const;
  void set(const Flag& flag, const std::string& value);
  std::string value_text(const Flag& flag) const;

  std::string program_, description_;
  std::vector<Flag> flags_;
  std::set<std::string> given_;
  std::vector<std::string> command_line_;
  std::string values_markdown_;
};

}  // namespace app

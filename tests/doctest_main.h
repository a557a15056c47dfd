#pragma once
// The main() of every doctest binary (tests/test_main.cpp, tests/emu/emu_main.cpp): doctest's
// own, plus one rule. A run given test-case filters that match no test case fails, instead
// of passing with "test cases: 0". CTest runs each TEST_CASE by name (doctest_discover_tests),
// and a name CMake mangles (it splits list items at ';') would otherwise be a test that runs
// nothing and always passes. Queries (--list-test-cases, --help) are unaffected.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string_view>

namespace nd_testing_main {

inline bool none_matched = false;

// Records whether any test case passed the filters (doctest counts them for the summary).
struct FilterListener : doctest::IReporter {
  explicit FilterListener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    none_matched = stats.numTestCasesPassingFilters == 0;
  }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

}  // namespace nd_testing_main

DOCTEST_REGISTER_LISTENER("nd_filter_listener", 1, nd_testing_main::FilterListener);

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int status = context.run();
  if (context.shouldExit()) return status;
  bool filtered = false;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    for (const char* f : {"--test-case=", "-tc=", "--test-suite=", "-ts=", "--source-file=", "-sf="})
      if (std::string_view(a).substr(0, std::string_view(f).size()) == f) filtered = true;
  }
  if (status == 0 && filtered && nd_testing_main::none_matched) {
    std::fprintf(stderr, "error: no test case matched the filters (a test name with ';' split by CMake?)\n");
    return 1;
  }
  return status;
}

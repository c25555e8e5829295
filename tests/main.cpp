// The doctest entry point shared by every suite. CTest runs each test case by name
// (--test-case=NAME); a run whose filter matches no test case fails instead of passing with
// nothing run (CMake splits a discovered name at a ';', so such a name would never run).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string_view>

namespace {

int g_started = 0;

// Counts the test cases that start; reports nothing.
struct StartCounter : doctest::IReporter {
  explicit StartCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override { ++g_started; }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

REGISTER_LISTENER("kiln_start_counter", 1, StartCounter);

}  // namespace

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int result = context.run();
  if (context.shouldExit()) return result;
  bool filtered = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    filtered = filtered || arg.starts_with("--test-case=") || arg.starts_with("-tc=");
  }
  if (filtered && g_started == 0) {
    std::fprintf(stderr,
                 "no test case matches the --test-case filter (is there a ';' in the "
                 "name? CTest splits names there)\n");
    return 1;
  }
  return result;
}

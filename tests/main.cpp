#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <iostream>
#include <string>

namespace {

// Says, once all tests are done, when the run as a whole was skipped: every selected test needs a GPU and none is
// visible, or every test that ran skipped itself (GTEST_SKIP) and nothing failed. CTest turns that line into a skip
// (tests/gtest_suites.cmake); a run with one test that passed or failed prints nothing.
class RunSkipReporter : public ::testing::EmptyTestEventListener {
 public:
  explicit RunSkipReporter(bool cuda_filtered) : cuda_filtered_(cuda_filtered) {}

  void OnTestProgramEnd(const ::testing::UnitTest& unit_test) override {
    if (cuda_filtered_ && unit_test.test_to_run_count() == 0) {
      std::cout << "[  SKIPPED ] the whole run: every selected test needs a GPU, none is visible\n";
    } else if (unit_test.Passed() && unit_test.test_to_run_count() > 0 &&
               unit_test.skipped_test_count() == unit_test.test_to_run_count()) {
      std::cout << "[  SKIPPED ] the whole run: every test that ran skipped itself\n";
    }
  }

 private:
  bool cuda_filtered_;
};

} // namespace

// As LibTorch's test/cpp/common/main.cpp: tests named *_CUDA need a GPU and are filtered out when none is visible.
// They are still listed, and a CTest entry whose suite holds nothing else is shown as skipped rather than hidden.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const bool cuda_filtered = !torch::cuda::is_available() && !::testing::GTEST_FLAG(list_tests);
  if (cuda_filtered) {
    std::string filter = ::testing::GTEST_FLAG(filter);
    filter += filter.find('-') == std::string::npos ? "-*_CUDA" : ":*_CUDA";
    ::testing::GTEST_FLAG(filter) = filter;
    std::cerr << "note: no GPU is visible: tests named *_CUDA are filtered out\n";
  }
  ::testing::UnitTest::GetInstance()->listeners().Append(new RunSkipReporter(cuda_filtered));
  return RUN_ALL_TESTS();
}

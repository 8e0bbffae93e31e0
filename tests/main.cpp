#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <iostream>
#include <string>

namespace {

// Says, once all tests are done, that the run selected nothing because every selected test needs a GPU. CTest
// turns that line into a skip.
class CudaSkipReporter : public ::testing::EmptyTestEventListener {
  void OnTestProgramEnd(const ::testing::UnitTest& unit_test) override {
    if (unit_test.test_to_run_count() == 0) {
      std::cout << "[  SKIPPED ] needs a GPU, none is visible\n";
    }
  }
};

} // namespace

// As LibTorch's test/cpp/common/main.cpp: tests named *_CUDA need a GPU and are filtered out when none is visible.
// They are still listed, and a CTest entry whose suite holds nothing else is shown as skipped rather than hidden.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!torch::cuda::is_available() && !::testing::GTEST_FLAG(list_tests)) {
    std::string filter = ::testing::GTEST_FLAG(filter);
    filter += filter.find('-') == std::string::npos ? "-*_CUDA" : ":*_CUDA";
    ::testing::GTEST_FLAG(filter) = filter;
    std::cerr << "note: no GPU is visible: tests named *_CUDA are filtered out\n";
    ::testing::UnitTest::GetInstance()->listeners().Append(new CudaSkipReporter);
  }
  return RUN_ALL_TESTS();
}

#include <dkit/core/format.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <limits>

namespace dkit {
namespace {

TEST(FormatTest, NumbersReadBackExactlyInTheirShortestForm) {
  EXPECT_EQ(format_number(0.001), "0.001");
  EXPECT_EQ(format_number(3.0), "3.0");
  EXPECT_EQ(format_number(1e-8), "1e-08");
  EXPECT_EQ(format_number(0.1f), "0.1");
  EXPECT_EQ(format_number(std::numeric_limits<double>::quiet_NaN()), "nan");
  EXPECT_EQ(format_number(-std::numeric_limits<double>::infinity()), "-inf");
  for (const double value : {1.0 / 3.0, 2.0 / 7.0 * 1e300, -5e-324, 0.30000000000000004}) {
    EXPECT_EQ(std::strtod(format_number(value).c_str(), nullptr), value) << format_number(value);
  }
  const float third = 1.0f / 3.0f;
  EXPECT_EQ(std::strtof(format_number(third).c_str(), nullptr), third);
}

TEST(FormatTest, FormatsSignificantDigitsWithoutExponents) {
  EXPECT_EQ(format_significant(0.0123456, 4), "0.01235");
  EXPECT_EQ(format_significant(1.23456, 4), "1.235");
  EXPECT_EQ(format_significant(15234.7, 4), "15235");
  EXPECT_EQ(format_significant(9.9996, 4), "10.00");
  EXPECT_EQ(format_significant(-2.5, 2), "-2.5");
  EXPECT_EQ(format_significant(0.0, 4), "0");
  EXPECT_EQ(format_significant(std::numeric_limits<double>::quiet_NaN(), 4), "nan");
  EXPECT_EQ(format_significant(std::numeric_limits<double>::infinity(), 4), "inf");
}

TEST(FormatTest, FormatsAFixedNumberOfDecimals) {
  EXPECT_EQ(format_fixed(2.5, 2), "2.50");
  EXPECT_EQ(format_fixed(1234.5678, 1), "1234.6");
  EXPECT_EQ(format_fixed(-0.25, 0), "-0");
}

TEST(FormatTest, PrintableWritesControlCharactersAsHexEscapesAndKeepsEveryOtherByte) {
  EXPECT_EQ(printable("runs/a\tb\x1b[2J\r\n\x7f"), "runs/a\\x09b\\x1b[2J\\x0d\\x0a\\x7f");
  EXPECT_EQ(printable(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(printable("caf\xc3\xa9 \xff ~"), "caf\xc3\xa9 \xff ~");
  EXPECT_EQ(printable(""), "");
}

TEST(FormatTest, TensorsReadAsTheirShapeAndDtype) {
  EXPECT_EQ(format_tensor(torch::zeros({64, 784})), "[64, 784] (float32)");
  EXPECT_EQ(format_tensor(torch::zeros({}, torch::kLong)), "[] (int64)");
  EXPECT_EQ(format_tensor(at::Tensor()), "(none)");
  EXPECT_EQ(format_tensor({3, 0}, c10::kBFloat16), "[3, 0] (bfloat16)");
}

TEST(FormatTest, RatesReadAsPeopleSayThem) {
  EXPECT_EQ(format_rate(812.54), "812.5");
  EXPECT_EQ(format_rate(310240.0), "310.2k");
  EXPECT_EQ(format_rate(1.25e6), "1.2M");
}

} // namespace
} // namespace dkit

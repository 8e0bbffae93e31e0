#include <dkit/core/json.h>

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace dkit {
namespace {

TEST(JsonWriterTest, WritesNestedObjectsAndArrays) {
  JsonWriter json;
  json.begin_object();
  json.key("name").value("mlp");
  json.key("shape").begin_array().value(int64_t{3}).value(4).end_array();
  json.key("ok").value(true);
  json.key("none").null();
  json.key("inner").begin_object().key("x").value(0.5).end_object();
  json.end_object();
  EXPECT_EQ(json.str(), R"({"name":"mlp","shape":[3,4],"ok":true,"none":null,"inner":{"x":0.5}})");
}

TEST(JsonWriterTest, EscapesStrings) {
  EXPECT_EQ(json_quote("a\"b\\c\nd\t\x01"), R"("a\"b\\c\nd\t\u0001")");
}

TEST(JsonWriterTest, WritesShortestRoundTripDoublesAndNullForNonFinite) {
  JsonWriter json;
  json.begin_array().value(0.1).value(1.0 / 3.0).value(std::numeric_limits<double>::quiet_NaN()).value(
      std::numeric_limits<double>::infinity());
  json.end_array();
  EXPECT_EQ(json.str(), "[0.1,0.3333333333333333,null,null]");
}

TEST(JsonWriterTest, EmptyContainers) {
  JsonWriter json;
  json.begin_object().key("a").begin_array().end_array().key("b").begin_object().end_object().end_object();
  EXPECT_EQ(json.str(), R"({"a":[],"b":{}})");
}

} // namespace
} // namespace dkit

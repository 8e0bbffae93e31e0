#include <dkit/core/enum_names.h>

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace dkit {
namespace {

enum class Fruit { kApple, kPear, kPlum, kFig };

constexpr EnumNames<Fruit, 3> kFruitNames = {{
    {Fruit::kApple, "apple"},
    {Fruit::kPear, "pear"},
    {Fruit::kPlum, "plum"},
}};

constexpr EnumNames<Fruit, 1> kOneFruit = {{{Fruit::kFig, "fig"}}};

std::string error_of(std::string_view name) {
  try {
    parse_name(kFruitNames, name, "fruit");
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(EnumNamesTest, NamesAndParsesEveryValue) {
  for (const auto& entry : kFruitNames) {
    EXPECT_EQ(name_of(kFruitNames, entry.value), entry.name);
    EXPECT_EQ(try_parse(kFruitNames, entry.name), entry.value);
    EXPECT_EQ(parse_name(kFruitNames, entry.name, "fruit"), entry.value);
  }
  EXPECT_EQ(try_parse(kFruitNames, "Apple"), std::nullopt);
  EXPECT_EQ(try_parse(kFruitNames, ""), std::nullopt);
  EXPECT_THROW(name_of(kFruitNames, Fruit::kFig), std::logic_error);
}

TEST(EnumNamesTest, ListsNamesForMessagesAndDocs) {
  EXPECT_EQ(list_names(kFruitNames), "apple, pear or plum");
  EXPECT_EQ(list_names(kFruitNames, /*last=*/", "), "apple, pear, plum");
  EXPECT_EQ(list_names(kFruitNames, " or ", "`"), "`apple`, `pear` or `plum`");
  EXPECT_EQ(list_names(kOneFruit), "fig");
}

TEST(EnumNamesTest, UnknownNameIsAnErrorListingTheNames) {
  EXPECT_EQ(error_of("banana"), "unknown fruit 'banana': expected apple, pear or plum");
  EXPECT_EQ(error_of(""), "unknown fruit '': expected apple, pear or plum");
}

} // namespace
} // namespace dkit

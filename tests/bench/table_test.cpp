#include <dkit/bench/table.h>

#include "../support.h"

#include <nlohmann/json.hpp>

#include <limits>

namespace dkit::bench {
namespace {

using ::dkit::test::error_message;

class TableTest : public test::SeedingFixture {
 protected:
  static ResultTable sample() {
    ResultTable table("t", {{"device"}, {"n", ColumnKind::kInteger}, {"median_ms", ColumnKind::kReal},
                            {"of_best", ColumnKind::kReal, 3}});
    table.add_row({std::string("cpu"), int64_t{50}, 0.0123456, 1.0});
    table.add_row({std::string("cuda:0"), int64_t{8192}, 15234.7, 0.5});
    table.add_row({std::string("a,b"), Cell(), int64_t{2}, Cell()});
    return table;
  }
};

TEST_F(TableTest, FormatsAlignedColumnsForTheTerminal) {
  EXPECT_EQ(sample().format(),
            "device     n  median_ms  of_best\n"
            "------  ----  ---------  -------\n"
            "cpu       50    0.01235     1.00\n"
            "cuda:0  8192      15235    0.500\n"
            "a,b        -      2.000        -\n");
}

TEST_F(TableTest, WritesCsvWithQuotingAndEmptyCells) {
  EXPECT_EQ(sample().to_csv(),
            "device,n,median_ms,of_best\n"
            "cpu,50,0.0123456,1\n"
            "cuda:0,8192,15234.7,0.5\n"
            "\"a,b\",,2,\n");
}

TEST_F(TableTest, WritesJsonRowsAsObjects) {
  EXPECT_EQ(json_text(sample()),
            R"({"name":"t","columns":["device","n","median_ms","of_best"],"rows":[)"
            R"({"device":"cpu","n":50,"median_ms":0.0123456,"of_best":1},)"
            R"({"device":"cuda:0","n":8192,"median_ms":15234.7,"of_best":0.5},)"
            R"({"device":"a,b","n":null,"median_ms":2,"of_best":null}]})");
}

TEST_F(TableTest, WritesRealsInShortestRoundTripFormAndNonFiniteAsEmpty) {
  ResultTable table("r", {{"text"}, {"a", ColumnKind::kReal}, {"b", ColumnKind::kReal}, {"c", ColumnKind::kReal},
                          {"d", ColumnKind::kReal}, {"e", ColumnKind::kReal}, {"f", ColumnKind::kReal}});
  table.add_row({std::string("a\"b\\c\nd\t\x01"), 0.1, 1.0 / 3.0, std::numeric_limits<double>::quiet_NaN(),
                 std::numeric_limits<double>::infinity(), 1e-8, 1e15});
  EXPECT_EQ(table.to_csv(), "text,a,b,c,d,e,f\n\"a\"\"b\\c\nd\t\x01\",0.1,0.3333333333333333,,,1e-08,1e+15\n");
  EXPECT_EQ(json_text(table), R"({"name":"r","columns":["text","a","b","c","d","e","f"],"rows":[)"
                              R"({"text":"a\"b\\c\nd\t\u0001","a":0.1,"b":0.3333333333333333,"c":null,"d":null,)"
                              R"("e":1e-08,"f":1e+15}]})");
}

TEST_F(TableTest, EmptyTableHasHeaderAndRuleOnly) {
  const ResultTable table("e", {{"name"}, {"value", ColumnKind::kReal}});
  EXPECT_EQ(table.format(), "name  value\n----  -----\n");
  EXPECT_EQ(table.to_csv(), "name,value\n");
}

TEST_F(TableTest, LooksUpCellsByColumnName) {
  const ResultTable table = sample();
  EXPECT_EQ(table.column_index("median_ms"), 2u);
  EXPECT_EQ(std::get<int64_t>(table.at(1, "n")), 8192);
  EXPECT_EQ(error_message([&] { table.column_index("gflops"); }),
            "table 't' has no column 'gflops'; its columns are device, n, median_ms, of_best");
  EXPECT_EQ(error_message([&] { table.at(3, "n"); }), "table 't' has 3 rows, no row 3");
}

TEST_F(TableTest, RejectsRowsThatDoNotFit) {
  ResultTable table = sample();
  EXPECT_EQ(error_message([&] { table.add_row({std::string("cpu")}); }), "a row of table 't' needs 4 cells, got 1");
  EXPECT_EQ(error_message([&] { table.add_row({std::string("cpu"), 1.5, 1.0, 1.0}); }),
            "column 'n' of table 't' holds integer cells");
  EXPECT_EQ(error_message([&] { table.add_row({int64_t{1}, int64_t{1}, 1.0, 1.0}); }),
            "column 'device' of table 't' holds text cells");
  EXPECT_EQ(table.rows().size(), 3u);
}

TEST_F(TableTest, RejectsDuplicateColumnNames) {
  EXPECT_EQ(error_message([] { ResultTable("d", {{"x"}, {"x", ColumnKind::kReal}}); }),
            "table 'd' has two columns named 'x'");
}

TEST_F(TableTest, QuotesCsvFieldsOnlyWhenNeeded) {
  EXPECT_EQ(csv_field("plain"), "plain");
  EXPECT_EQ(csv_field("say \"hi\", ok"), "\"say \"\"hi\"\", ok\"");
  EXPECT_EQ(csv_field("two\nlines"), "\"two\nlines\"");
}

TEST_F(TableTest, SkippedResultRecordsWhyInEveryOutput) {
  const SuiteResult result = SuiteResult::skipped("multi-gpu", "needs 2 GPUs, found 0");
  EXPECT_FALSE(result.ran());
  EXPECT_EQ(format_result(result), "multi-gpu: skipped: needs 2 GPUs, found 0\n");
  EXPECT_EQ(result.table.to_csv(), "suite,status,reason\nmulti-gpu,skipped,\"needs 2 GPUs, found 0\"\n");
  EXPECT_EQ(json_text(result),
            R"({"suite":"multi-gpu","status":"skipped","reason":"needs 2 GPUs, found 0","description":"",)"
            R"("summary":{},"notes":[],"table":{"name":"multi-gpu","columns":["suite","status","reason"],)"
            R"("rows":[{"suite":"multi-gpu","status":"skipped","reason":"needs 2 GPUs, found 0"}]}})");
}

TEST_F(TableTest, FormatsAResultWithItsDescriptionAndNotes) {
  ResultTable table("t", {{"x", ColumnKind::kInteger}});
  table.add_row({int64_t{7}});
  SuiteResult result("t", "what was measured", std::move(table));
  result.notes.push_back("note one");
  result.summary.emplace_back("best", 1.5);
  result.summary.emplace_back("n", int64_t{3});
  EXPECT_TRUE(result.ran());
  EXPECT_EQ(format_result(result), "t: what was measured\n\nx\n-\n7\n\nnote one\n");
  EXPECT_EQ(json_text(result), R"({"suite":"t","status":"ok","reason":"","description":"what was measured",)"
                               R"("summary":{"best":1.5,"n":3},"notes":["note one"],)"
                               R"("table":{"name":"t","columns":["x"],"rows":[{"x":7}]}})");
}

} // namespace
} // namespace dkit::bench

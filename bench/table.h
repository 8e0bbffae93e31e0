#pragma once

#include <dkit/core/format.h>

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace dkit::bench {

/// What a table column holds, which decides how it is aligned and written.
enum class ColumnKind {
  /// Words: left-aligned, quoted in CSV when they need it.
  kText,
  /// Whole numbers: right-aligned.
  kInteger,
  /// Measurements: right-aligned, shown with `digits` significant digits on the terminal and written in full
  /// (shortest round-trip form; a whole number without a decimal point) to CSV and JSON.
  kReal,
};

/// One column of a ResultTable.
struct Column {
  /// Header and JSON key, with its unit when it has one: `median_ms`, `gflops`, `bytes`.
  std::string name;
  /// What the column holds.
  ColumnKind kind = ColumnKind::kText;
  /// Significant digits shown on the terminal for kReal columns.
  int digits = 4;
};

/// One cell: empty (`-` on the terminal, an empty CSV field, JSON null), text, a whole number or a real number.
using Cell = std::variant<std::monostate, std::string, int64_t, double>;

/// A benchmark's results: named columns and rows of cells. Printed for people by format(), written for
/// programs by to_csv() and to_json(); the CSV feeds bench/plot.
class ResultTable {
 public:
  /// An empty table; `columns` must have distinct names.
  ResultTable(std::string name, std::vector<Column> columns);

  /// Appends a row: one cell per column, each empty or of the column's kind (an integer is accepted in a
  /// kReal column).
  ResultTable& add_row(std::vector<Cell> row);

  /// The table's name, e.g. `matmul`.
  const std::string& name() const {
    return name_;
  }
  /// The columns, in order.
  const std::vector<Column>& columns() const {
    return columns_;
  }
  /// The rows, in the order they were added.
  const std::vector<std::vector<Cell>>& rows() const {
    return rows_;
  }
  /// Index of the column called `name`; an error naming the table's columns when there is none.
  size_t column_index(std::string_view name) const;
  /// The cell of row `row` in the column called `name`.
  const Cell& at(size_t row, std::string_view name) const;

  /// A plain-text table for the terminal: a header, a rule, then the rows, columns separated by two spaces.
  std::string format() const;
  /// RFC 4180 CSV with a header line; lines end in `\n`.
  std::string to_csv() const;

 private:
  std::string name_;
  std::vector<Column> columns_;
  std::vector<std::vector<Cell>> rows_;
};

/// Sets `json` to `{"name":..., "columns":[...], "rows":[{column: value, ...}, ...]}`: the conversion that
/// `nlohmann::ordered_json json = table;` calls. Whole real numbers are written as integers, NaN, infinities and
/// empty cells as null.
void to_json(nlohmann::ordered_json& json, const ResultTable& table);

/// `text` as one CSV field: quoted, with quotes doubled, when it holds a comma, a quote or a line break.
std::string csv_field(std::string_view text);

/// What one suite found: its table, or why it could not run here.
struct SuiteResult {
  /// The suite's name, e.g. `matmul`.
  std::string suite;
  /// `ok` when it ran, `skipped` when this machine cannot run it.
  std::string status = "ok";
  /// Why it was skipped, e.g. `needs 2 GPUs, found 0`; empty when it ran.
  std::string reason;
  /// One line describing what was measured and how, printed above the table.
  std::string description;
  /// The measurements. A skipped suite has a one-row table with columns `suite`, `status` and `reason`, so
  /// that the CSV records the skip too.
  ResultTable table;
  /// Conclusions for people, printed under the table: crossovers, ratios, peaks.
  std::vector<std::string> notes;
  /// The same conclusions as named values for programs (JSON `summary`).
  std::vector<std::pair<std::string, Cell>> summary;

  /// A result whose table the suite fills in.
  SuiteResult(std::string suite_name, std::string what, ResultTable results);

  /// A suite that did not run on this machine, and why.
  static SuiteResult skipped(const std::string& suite_name, const std::string& why);
  /// Whether the suite ran.
  bool ran() const {
    return status == "ok";
  }
};

/// A suite's result for the terminal: the description, the table (or the reason it was skipped) and the notes.
std::string format_result(const SuiteResult& result);

/// Sets `json` to a result's object: suite, status, reason, description, summary, notes and the table.
void to_json(nlohmann::ordered_json& json, const SuiteResult& result);

/// `json` as compact text, as every JSON output of `dkit bench` is written; bytes that are not UTF-8 become U+FFFD.
std::string json_text(const nlohmann::ordered_json& json);

} // namespace dkit::bench

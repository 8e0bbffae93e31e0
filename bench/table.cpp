#include <dkit/bench/table.h>

#include <dkit/core/error.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <set>

namespace dkit::bench {
namespace {

const char* kind_name(ColumnKind kind) {
  switch (kind) {
    case ColumnKind::kText: return "text";
    case ColumnKind::kInteger: return "integer";
    case ColumnKind::kReal: return "real";
  }
  return "unknown";
}

bool fits(const Cell& cell, ColumnKind kind) {
  if (std::holds_alternative<std::monostate>(cell)) {
    return true;
  }
  switch (kind) {
    case ColumnKind::kText: return std::holds_alternative<std::string>(cell);
    case ColumnKind::kInteger: return std::holds_alternative<int64_t>(cell);
    case ColumnKind::kReal: return std::holds_alternative<double>(cell) || std::holds_alternative<int64_t>(cell);
  }
  return false;
}

// Whole numbers below 1e15 are written as integers (`2`, not `2.0`).
bool is_whole(double value) {
  return std::isfinite(value) && std::trunc(value) == value && std::fabs(value) < 1e15;
}

nlohmann::ordered_json real_json(double value) {
  if (is_whole(value)) {
    return static_cast<int64_t>(value);
  }
  return value;
}

std::string real_text(double value) {
  if (is_whole(value)) {
    return std::to_string(static_cast<int64_t>(value));
  }
  return std::isfinite(value) ? format_number(value) : "";
}

std::string terminal_text(const Cell& cell, const Column& column) {
  if (const auto* text = std::get_if<std::string>(&cell)) {
    return *text;
  }
  if (const auto* whole = std::get_if<int64_t>(&cell)) {
    return column.kind == ColumnKind::kReal ? format_significant(static_cast<double>(*whole), column.digits)
                                            : std::to_string(*whole);
  }
  if (const auto* real = std::get_if<double>(&cell)) {
    return format_significant(*real, column.digits);
  }
  return "-";
}

std::string csv_text(const Cell& cell) {
  if (const auto* text = std::get_if<std::string>(&cell)) {
    return csv_field(*text);
  }
  if (const auto* whole = std::get_if<int64_t>(&cell)) {
    return std::to_string(*whole);
  }
  if (const auto* real = std::get_if<double>(&cell)) {
    return real_text(*real);
  }
  return "";
}

nlohmann::ordered_json cell_json(const Cell& cell) {
  if (const auto* text = std::get_if<std::string>(&cell)) {
    return *text;
  }
  if (const auto* whole = std::get_if<int64_t>(&cell)) {
    return *whole;
  }
  if (const auto* real = std::get_if<double>(&cell)) {
    return real_json(*real);
  }
  return nullptr;
}

void pad(std::string& line, const std::string& text, size_t width, bool right) {
  const std::string fill(width - std::min(width, text.size()), ' ');
  line += right ? fill + text : text + fill;
}

void trim_right(std::string& line) {
  line.erase(line.find_last_not_of(' ') + 1);
}

} // namespace

ResultTable::ResultTable(std::string name, std::vector<Column> columns)
    : name_(std::move(name)), columns_(std::move(columns)) {
  std::set<std::string> seen;
  for (const auto& column : columns_) {
    DKIT_CHECK(seen.insert(column.name).second, "table '", name_, "' has two columns named '", column.name, "'");
  }
}

ResultTable& ResultTable::add_row(std::vector<Cell> row) {
  DKIT_CHECK(row.size() == columns_.size(), "a row of table '", name_, "' needs ", columns_.size(),
             " cells, got ", row.size());
  for (size_t i = 0; i < row.size(); ++i) {
    DKIT_CHECK(fits(row[i], columns_[i].kind), "column '", columns_[i].name, "' of table '", name_, "' holds ",
               kind_name(columns_[i].kind), " cells");
  }
  rows_.push_back(std::move(row));
  return *this;
}

size_t ResultTable::column_index(std::string_view name) const {
  std::string names;
  for (size_t i = 0; i < columns_.size(); ++i) {
    if (columns_[i].name == name) {
      return i;
    }
    names += (i == 0 ? "" : ", ") + columns_[i].name;
  }
  throw Error(dkit::detail::concat("table '", name_, "' has no column '", name, "'; its columns are ", names));
}

const Cell& ResultTable::at(size_t row, std::string_view name) const {
  DKIT_CHECK(row < rows_.size(), "table '", name_, "' has ", rows_.size(), " rows, no row ", row);
  return rows_[row][column_index(name)];
}

std::string ResultTable::format() const {
  std::vector<std::vector<std::string>> cells;
  std::vector<size_t> widths;
  for (const auto& column : columns_) {
    widths.push_back(column.name.size());
  }
  for (const auto& row : rows_) {
    std::vector<std::string> texts;
    for (size_t i = 0; i < row.size(); ++i) {
      texts.push_back(terminal_text(row[i], columns_[i]));
      widths[i] = std::max(widths[i], texts.back().size());
    }
    cells.push_back(std::move(texts));
  }
  std::string out;
  std::string line;
  std::string rule;
  for (size_t i = 0; i < columns_.size(); ++i) {
    line += i == 0 ? "" : "  ";
    rule += i == 0 ? "" : "  ";
    pad(line, columns_[i].name, widths[i], columns_[i].kind != ColumnKind::kText);
    rule += std::string(widths[i], '-');
  }
  trim_right(line);
  out += line + "\n" + rule + "\n";
  for (const auto& texts : cells) {
    line.clear();
    for (size_t i = 0; i < texts.size(); ++i) {
      line += i == 0 ? "" : "  ";
      pad(line, texts[i], widths[i], columns_[i].kind != ColumnKind::kText);
    }
    trim_right(line);
    out += line + "\n";
  }
  return out;
}

std::string ResultTable::to_csv() const {
  std::string out;
  for (size_t i = 0; i < columns_.size(); ++i) {
    out += (i == 0 ? "" : ",") + csv_field(columns_[i].name);
  }
  out += "\n";
  for (const auto& row : rows_) {
    for (size_t i = 0; i < row.size(); ++i) {
      out += (i == 0 ? "" : ",") + csv_text(row[i]);
    }
    out += "\n";
  }
  return out;
}

void to_json(nlohmann::ordered_json& json, const ResultTable& table) {
  nlohmann::ordered_json columns = nlohmann::ordered_json::array();
  for (const auto& column : table.columns()) {
    columns.push_back(column.name);
  }
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const auto& row : table.rows()) {
    nlohmann::ordered_json cells = nlohmann::ordered_json::object();
    for (size_t i = 0; i < row.size(); ++i) {
      cells[table.columns()[i].name] = cell_json(row[i]);
    }
    rows.push_back(std::move(cells));
  }
  json = {{"name", table.name()}, {"columns", std::move(columns)}, {"rows", std::move(rows)}};
}

std::string csv_field(std::string_view text) {
  if (text.find_first_of(",\"\r\n") == std::string_view::npos) {
    return std::string(text);
  }
  std::string out = "\"";
  for (char c : text) {
    out += c;
    if (c == '"') {
      out += '"';
    }
  }
  return out + "\"";
}

SuiteResult::SuiteResult(std::string suite_name, std::string what, ResultTable results)
    : suite(std::move(suite_name)), description(std::move(what)), table(std::move(results)) {}

SuiteResult SuiteResult::skipped(const std::string& suite_name, const std::string& why) {
  ResultTable table(suite_name, {{"suite", ColumnKind::kText}, {"status", ColumnKind::kText},
                                 {"reason", ColumnKind::kText}});
  table.add_row({suite_name, std::string("skipped"), why});
  SuiteResult result(suite_name, "", std::move(table));
  result.status = "skipped";
  result.reason = why;
  return result;
}

std::string format_result(const SuiteResult& result) {
  if (!result.ran()) {
    return result.suite + ": skipped: " + result.reason + "\n";
  }
  std::string out = result.suite + ": " + result.description + "\n\n" + result.table.format();
  if (!result.notes.empty()) {
    out += "\n";
    for (const auto& note : result.notes) {
      out += note + "\n";
    }
  }
  return out;
}

void to_json(nlohmann::ordered_json& json, const SuiteResult& result) {
  nlohmann::ordered_json summary = nlohmann::ordered_json::object();
  for (const auto& [name, value] : result.summary) {
    summary[name] = cell_json(value);
  }
  json = {{"suite", result.suite},
          {"status", result.status},
          {"reason", result.reason},
          {"description", result.description},
          {"summary", std::move(summary)},
          {"notes", result.notes},
          {"table", result.table}};
}

std::string json_text(const nlohmann::ordered_json& json) {
  return json.dump(/*indent=*/-1, /*indent_char=*/' ', /*ensure_ascii=*/false,
                   nlohmann::ordered_json::error_handler_t::replace);
}

} // namespace dkit::bench

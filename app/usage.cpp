#include "usage.h"

#include <algorithm>
#include <cctype>
#include <limits>

namespace dkit::app {
namespace {

// The optimal string alignment distance: Levenshtein's edits plus swapping two neighbouring letters.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) {
    d[i][0] = i;
  }
  for (size_t j = 0; j <= b.size(); ++j) {
    d[0][j] = j;
  }
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// `message` with cxxopts' typographic quotes (‘ and ’) made plain, as dkit's other messages quote.
std::string plain_quotes(std::string message) {
  for (const std::string quote : {"\u2018", "\u2019"}) {
    for (size_t at = message.find(quote); at != std::string::npos; at = message.find(quote, at + 1)) {
      message.replace(at, quote.size(), "'");
    }
  }
  return message;
}

// The `--name` and `-n` spellings of every option of `options`.
std::vector<std::string> option_spellings(const cxxopts::Options& options) {
  std::vector<std::string> spellings;
  for (const auto& group : options.groups()) {
    for (const auto& option : options.group_help(group).options) {
      if (!option.s.empty()) {
        spellings.push_back("-" + option.s);
      }
      for (const auto& name : option.l) {
        spellings.push_back("--" + name);
      }
    }
  }
  return spellings;
}

} // namespace

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const auto& candidate : candidates) {
    const size_t distance = edit_distance(word, candidate);
    if (distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best_distance <= 2 && 2 * best_distance < word.size() ? best : std::string();
}

void unknown_name(const std::string& kind, const std::string& word, const std::vector<std::string>& known,
                  const std::string& help) {
  const std::string suggestion = closest_match(word, known);
  throw UsageError("unknown " + kind + " '" + word + "'; " +
                   (suggestion.empty() ? "see '" : "did you mean '" + suggestion + "'? See '") + help + "'");
}

cxxopts::ParseResult parse_arguments(cxxopts::Options& options, const Args& args, bool has_set) {
  try {
    cxxopts::ParseResult result = options.parse(static_cast<int>(args.argv.size()), args.argv.data());
    if (result.unmatched().empty()) {
      return result;
    }
    const std::string& word = result.unmatched().front();
    const bool setting = has_set && word.find('=') != std::string::npos && word.front() != '-';
    throw UsageError("unexpected argument '" + word + "' to " + args.program + "; " +
                     (setting ? "did you mean '--set " + word + "'? See '" : "see '") + args.program + " --help'");
  } catch (const cxxopts::exceptions::parsing& e) {
    std::string message = plain_quotes(e.what());
    const size_t begin = message.find('\'');
    const size_t end = message.find('\'', begin + 1);
    if (dynamic_cast<const cxxopts::exceptions::no_such_option*>(&e) != nullptr && end != std::string::npos) {
      const std::string name = message.substr(begin + 1, end - begin - 1);
      unknown_name("option", (name.size() == 1 ? "-" : "--") + name, option_spellings(options),
                   args.program + " --help");
    }
    message[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(message[0])));
    throw UsageError(message + "; see '" + args.program + " --help'");
  }
}

} // namespace dkit::app

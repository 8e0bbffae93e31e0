#pragma once

#include "commands.h"

#include <cxxopts.hpp>

#include <stdexcept>
#include <string>
#include <vector>

namespace dkit::app {

/// A mistake in the command line itself (an unknown verb or suite): `main` prints its one-line message after
/// `dkit: ` and exits with status 2, as for an unknown option.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The one of `candidates` that `word` most likely misspells (at most two insertions, deletions, substitutions or
/// swaps of neighbours away, and fewer than half its letters), or "" when none is that close.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

/// Throws the UsageError for a `kind` (verb, suite) called `word` that is not one of `known`:
/// `unknown KIND 'WORD'; did you mean 'NAME'? See 'HELP'` (no suggestion when none is close).
[[noreturn]] void unknown_name(const std::string& kind, const std::string& word, const std::vector<std::string>& known,
                               const std::string& help);

/// Parses a verb's `args` with its `options` and throws the UsageError for the first argument that no option or
/// operand took (cxxopts leaves those in `unmatched()`): `unexpected argument 'ARG' to dkit VERB; see 'dkit VERB
/// --help'`, or, when the verb has `--set` (`has_set`) and ARG looks like KEY=VALUE, `unexpected argument 'ARG' to
/// dkit VERB; did you mean '--set ARG'? See 'dkit VERB --help'`. An option the verb does not have is
/// `unknown option '--NAME'` with a suggestion as unknown_name() gives one; cxxopts' other parse errors keep their
/// text, with plain quotes and the verb's help named.
cxxopts::ParseResult parse_arguments(cxxopts::Options& options, const Args& args, bool has_set = false);

} // namespace dkit::app

#pragma once

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

/// Throws the UsageError for the first of `extra`, the arguments that no option or operand of `program` (`dkit VERB`)
/// took (cxxopts' `unmatched()`); does nothing when it is empty. The message is `unexpected argument 'ARG' to
/// PROGRAM; see 'PROGRAM --help'`, or, when `program` has `--set` and ARG looks like KEY=VALUE,
/// `unexpected argument 'ARG' to PROGRAM; did you mean '--set ARG'? See 'PROGRAM --help'`.
void reject_extra_arguments(const std::string& program, const std::vector<std::string>& extra, bool has_set = false);

} // namespace dkit::app

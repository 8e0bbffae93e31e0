#pragma once

#include <string>
#include <vector>

namespace dkit::app {

/// The arguments a verb receives: the program name as `dkit VERB`, then everything after the verb.
struct Args {
  /// `dkit VERB`, for usage lines.
  std::string program;
  /// argv-style pointers into the process's arguments, the first one being `program`.
  std::vector<char*> argv;
};

/// `dkit devices [--json]`.
int run_devices(Args args);

/// `dkit train --config FILE [--set KEY=VALUE]... [--out DIR] | --resume DIR`.
int run_train(Args args);

/// `dkit inspect FILE [--json]`.
int run_inspect(Args args);

/// `dkit export --checkpoint FILE --output FILE.pt`.
int run_export(Args args);

/// `dkit predict --checkpoint FILE --input ROWS.csv [--header] [--output OUT.csv] [--device D]`.
int run_predict(Args args);

/// `dkit bench SUITE [--device D] [--json FILE] [--csv FILE] [--repeat N] [--sizes N,...] [--quick]`.
int run_bench(Args args);

} // namespace dkit::app

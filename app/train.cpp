#include "commands.h"
#include "console.h"
#include "usage.h"

#include <dkit/checkpoint/training_checkpoint.h>
#include <dkit/core/error.h>
#include <dkit/core/format.h>
#include <dkit/distributed/launch.h>
#include <dkit/distributed/process_group.h>
#include <dkit/train/config.h>
#include <dkit/train/mlp_task.h>
#include <dkit/train/trainer.h>

#include <cxxopts.hpp>

#include <ctime>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace dkit::app {
namespace {

namespace fs = std::filesystem;

std::string new_run_folder() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::ostringstream name;
  name << "runs/" << std::put_time(&local, "%Y%m%d-%H%M%S");
  std::string folder = name.str();
  for (int i = 2; fs::exists(folder); ++i) {
    folder = name.str() + "-" + std::to_string(i);
  }
  fs::create_directories("runs");
  return folder;
}

// Every --set in the order given, each value whole: a vector option would split `model.hidden=[128,64]` at its comma.
std::vector<std::string> overrides_of(const cxxopts::ParseResult& result) {
  std::vector<std::string> overrides;
  for (const auto& argument : result.arguments()) {
    if (argument.key() == "set") {
      overrides.push_back(argument.value());
    }
  }
  return overrides;
}

std::string key_reference() {
  std::ostringstream out;
  out << "\nconfig keys (type, default):\n";
  for (const auto& key : config_keys()) {
    out << "  " << std::left << std::setw(24) << key.name << std::setw(12) << key.type << key.default_value << "\n"
        << "      " << key.meaning << "\n";
  }
  return out.str();
}

} // namespace

int run_train(Args args) {
  cxxopts::Options options(args.program,
                           "Train an MLP from a YAML config: the data set, model, optimizer, loader and device it "
                           "names. Writes train.log, metrics.csv, summary.json and checkpoints/ into the run folder, "
                           "and a TensorBoard event file with train.tensorboard: true. Under torchrun, or "
                           "with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set, each process trains "
                           "its share of every global batch and rank 0 writes the run folder (docs/distributed.md).");
  options.add_options()("c,config", "YAML config file", cxxopts::value<std::string>())(
      "s,set", "override a config key: KEY=VALUE, VALUE parsed as YAML (repeatable)",
      cxxopts::value<std::string>())(
      "o,out", "run folder (default: a new timestamped folder under runs/)", cxxopts::value<std::string>())(
      "r,resume", "continue the run in this folder from its newest good checkpoint, with the config it saved",
      cxxopts::value<std::string>())(
      "auto-resume",
      "with --config and --out: continue the run in --out from its newest checkpoint when it has one, else start "
      "it; what a job restarted by its launcher (torchrun --max_restarts) needs")(
      "no-progress", "plain log lines even on a terminal")(
      "check-syncs",
      "CUDA: make every synchronisation with the GPU inside a step or a batch hand-over an error, to prove the "
      "loop waits for the GPU only at metric flushes, validation and checkpoints (not with train.precision=fp16)")(
      "keys", "list every config key with its type, default and meaning")("h,help", "show this help");
  const auto result = parse_arguments(options, args, true);
  if (result.count("help") != 0) {
    std::cout << options.help() << key_reference();
    return 0;
  }
  if (result.count("keys") != 0) {
    std::cout << key_reference();
    return 0;
  }
  const std::vector<std::string> overrides = overrides_of(result);
  const std::optional<LaunchEnvironment> launch = launch_environment();
  const bool main_rank = !launch || launch->rank == 0;
  const bool auto_resume = result.count("auto-resume") != 0;
  const bool resume = result.count("resume") != 0;
  DKIT_CHECK(resume || result.count("config") != 0, "dkit train needs --config FILE (or --resume DIR); see --help");
  DKIT_CHECK(!(resume && result.count("config") != 0),
             "--config and --resume exclude each other: a resumed run uses the config its checkpoint saved (change "
             "keys with --set)");
  DKIT_CHECK(!auto_resume || (result.count("config") != 0 && result.count("out") != 0),
             "--auto-resume needs --config FILE and --out DIR: the run starts from the config, and continues from "
             "DIR's newest checkpoint when restarted");

  std::string out_dir;
  std::shared_ptr<const ResumePoint> point;
  TrainConfig config;
  if (auto_resume) {
    out_dir = result["out"].as<std::string>();
    if (std::optional<ResumePoint> found = try_resume_run(out_dir, overrides)) {
      point = std::make_shared<const ResumePoint>(std::move(*found));
    }
  } else if (resume) {
    out_dir = result["resume"].as<std::string>();
    DKIT_CHECK(result.count("out") == 0 || result["out"].as<std::string>() == out_dir,
               "--out and --resume name different folders: a resumed run continues in its own folder");
    point = std::make_shared<const ResumePoint>(resume_run(out_dir, overrides));
  }
  if (point) {
    DKIT_CHECK(!point->checkpoint->model.is_none(), "cannot continue ", point->source,
               " with dkit train: it is not a checkpoint of dkit's MLP but of a module a program of its own trained "
               "(it has no 'model' entry); continue it with that program");
    if (main_rank) {
      warn_skipped_checkpoints(point->skipped);
      std::cerr << "dkit: resuming from " << printable(point->source) << "\n";
    }
    config = point->config;
  } else {
    config = load_config(result["config"].as<std::string>(), overrides);
    // Only rank 0 writes into the run folder, so only it needs one.
    out_dir = result.count("out") != 0 ? result["out"].as<std::string>() : main_rank ? new_run_folder() : "runs";
  }

  const FullTrainConfig full(config);
  TrainerOptions run = trainer_options(full, out_dir);
  // stop_on_signals() also ignores SIGPIPE: a peer that is gone leaves c10d writing to a closed socket, and Gloo and
  // the store expect EPIPE there, as in Python, rather than a process killed by the signal.
  run.resume(point).process_settings(true).stop(stop_on_signals()).check_syncs(result.count("check-syncs") != 0);
  TrainConsole console(/*bar=*/result.count("no-progress") == 0);
  if (main_rank) {
    console.attach(run);
  }
  const TrainSummary summary = train_from_config(full, std::move(run));
  console.finish();
  if (!main_rank) {
    return summary.stopped_by_signal != 0 ? 128 + summary.stopped_by_signal : 0;
  }
  std::cout << summary_to_json(summary);
  if (summary.stopped_by_signal != 0) {
    std::cerr << "dkit: stopped by signal " << summary.stopped_by_signal << " after step " << summary.steps
              << "; continue with: dkit train --resume " << printable(out_dir) << "\n";
    return 128 + summary.stopped_by_signal;
  }
  return 0;
}

} // namespace dkit::app

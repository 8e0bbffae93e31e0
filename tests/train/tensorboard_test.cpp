#include <dkit/checkpoint/training_checkpoint.h>
#include <dkit/metrics/event_file.h>
#include <dkit/train/trainer.h>

#include "../metrics/event_file_oracle.h"
#include "../process.h"
#include "../support.h"
#include "small_run.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <sstream>

namespace dkit {
namespace {

namespace fs = std::filesystem;
using test::small_run;

// The event files in `dir`, in the order TensorBoard reads them: sorted by name.
std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> fields;
  std::stringstream stream(line);
  for (std::string field; std::getline(stream, field, ',');) {
    fields.push_back(field);
  }
  if (!line.empty() && line.back() == ',') {
    fields.emplace_back();
  }
  return fields;
}

// The scalars the rows of `metrics.csv` stand for, in its order, each value the float of the CSV's number; a
// validation row without a validation part (nan) stands for none. Wall times are left 0.
std::vector<ScalarEvent> scalars_of_csv(const std::string& path) {
  std::ifstream csv(path);
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "step,epoch,loss,accuracy,lr,samples_per_second,val_loss,val_accuracy");
  std::vector<ScalarEvent> scalars;
  const auto add = [&](const std::string& tag, const std::string& text, int64_t step) {
    scalars.push_back({tag, static_cast<float>(std::strtod(text.c_str(), nullptr)), step, 0.0});
  };
  while (std::getline(csv, line)) {
    const std::vector<std::string> f = split(line);
    EXPECT_EQ(f.size(), 8u) << line;
    const int64_t step = std::stoll(f[0]);
    if (!f[2].empty()) {
      add("train/loss", f[2], step);
      add("train/accuracy", f[3], step);
      add("train/lr", f[4], step);
      add("train/samples_per_second", f[5], step);
    } else if (f[7] != "nan") {
      add("val/loss", f[6], step);
      add("val/accuracy", f[7], step);
    }
  }
  return scalars;
}

// Whether `actual` are the scalars of `expected` (tags, steps and float values; wall times not compared), and the
// wall times never go back.
void expect_scalars(const std::vector<ScalarEvent>& actual, const std::vector<ScalarEvent>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    ScalarEvent timeless = actual[i];
    timeless.wall_time = 0;
    EXPECT_TRUE(test::same_scalar(timeless, expected[i]))
        << i << ": " << actual[i].tag << " " << actual[i].step << " " << actual[i].value << ", metrics.csv has "
        << expected[i].tag << " " << expected[i].step << " " << expected[i].value;
    if (i > 0) {
      EXPECT_GE(actual[i].wall_time, actual[i - 1].wall_time) << i;
    }
  }
}

std::vector<int64_t> steps_of(const std::vector<ScalarEvent>& scalars, const std::string& tag) {
  std::vector<int64_t> steps;
  for (const auto& scalar : scalars) {
    if (scalar.tag == tag) {
      steps.push_back(scalar.step);
    }
  }
  return steps;
}

// The points TensorBoard's Python event loader keeps of `files`, read in order: a SessionLog START at step s drops
// the points it read before at step s and later (plugin_event_accumulator's _Purge). Each file's START comes
// before its scalars, as RunFolder writes them.
std::vector<ScalarEvent> tensorboard_view(const std::vector<std::string>& files) {
  std::vector<ScalarEvent> kept;
  for (const auto& file : files) {
    const EventFileContents contents = read_event_file(file);
    for (const int64_t restart : contents.restarts) {
      kept.erase(std::remove_if(kept.begin(), kept.end(), [&](const ScalarEvent& s) { return s.step >= restart; }),
                 kept.end());
    }
    kept.insert(kept.end(), contents.scalars.begin(), contents.scalars.end());
  }
  return kept;
}

class TensorboardTest : public test::SeedingFixture {
 protected:
  TrainSummary train(const FullTrainConfig& config, const std::string& dir,
                     std::optional<TrainingCheckpoint> resume = std::nullopt) {
    TrainerOptions options(dir);
    options.process_settings(true);
    if (resume) {
      options.resume(std::make_shared<const ResumePoint>(resume_point(std::move(*resume), "test")));
    }
    return test::train_config(config, std::move(options));
  }

  test::TempDir tmp_;
};

TEST_F(TensorboardTest, EventFileHoldsTheRowsOfMetricsCsv) {
  const std::string run = tmp_.file("run");
  train(small_run({"train.tensorboard=true"}), run);
  const auto files = event_files(run);
  ASSERT_EQ(files.size(), 1u);
  const EventFileContents contents = read_event_file(files[0]);
  EXPECT_EQ(contents.file_version, "brain.Event:2");
  EXPECT_TRUE(contents.restarts.empty()) << "a new run marks no restart";
  expect_scalars(contents.scalars, scalars_of_csv(run + "/metrics.csv"));
  const std::vector<int64_t> flushes = {5, 10, 15, 20, 25, 30};
  for (const char* tag : {"train/loss", "train/accuracy", "train/lr", "train/samples_per_second"}) {
    EXPECT_EQ(steps_of(contents.scalars, tag), flushes) << tag;
  }
  const std::vector<int64_t> epoch_ends = {10, 20, 30};
  EXPECT_EQ(steps_of(contents.scalars, "val/loss"), epoch_ends);
  EXPECT_EQ(steps_of(contents.scalars, "val/accuracy"), epoch_ends);
  EXPECT_NE(test::read_file(run + "/train.log").find("] TensorBoard event file " + files[0] + "\n"),
            std::string::npos);
}

TEST_F(TensorboardTest, EventsAddNoHostSync) {
  const TrainSummary off = train(small_run(), tmp_.file("off"));
  const TrainSummary on = train(small_run({"train.tensorboard=true"}), tmp_.file("on"));
  EXPECT_TRUE(event_files(tmp_.file("off")).empty()) << "train.tensorboard is off by default";
  EXPECT_EQ(event_files(tmp_.file("on")).size(), 1u);
  EXPECT_EQ(on.host_syncs, off.host_syncs);
  EXPECT_EQ(on.host_syncs, 6 + 3) << "30 steps flushed every 5, and one validation per epoch";
}

TEST_F(TensorboardTest, ARunWithoutAValidationPartWritesNoValidationScalars) {
  const std::string run = tmp_.file("run");
  train(small_run({"train.tensorboard=true", "data.val_fraction=0"}), run);
  const auto files = event_files(run);
  ASSERT_EQ(files.size(), 1u);
  const EventFileContents contents = read_event_file(files[0]);
  std::set<std::string> tags;
  for (const auto& scalar : contents.scalars) {
    tags.insert(scalar.tag);
  }
  EXPECT_EQ(tags, (std::set<std::string>{"train/accuracy", "train/loss", "train/lr", "train/samples_per_second"}));
  expect_scalars(contents.scalars, scalars_of_csv(run + "/metrics.csv"));
}

TEST_F(TensorboardTest, AResumedRunAddsAFileWhoseRestartDropsWhatCameAfterTheCheckpoint) {
  const std::string run = tmp_.file("run");
  const std::vector<std::string> keys = {"train.tensorboard=true", "train.checkpoint_every=7"};
  auto first = keys;
  first.push_back("train.max_steps=17");
  train(small_run(first), run);
  ASSERT_EQ(event_files(run).size(), 1u);
  const std::string first_file = event_files(run)[0];
  const std::string first_bytes = test::read_file(first_file);
  const EventFileContents stopped = read_event_file(first_file);
  ASSERT_FALSE(steps_of(stopped.scalars, "train/loss").empty());
  EXPECT_EQ(steps_of(stopped.scalars, "train/loss").back(), 17);

  train(small_run(keys), run, load_training_checkpoint(run + "/checkpoints/step-000014.pt"));
  const auto files = event_files(run);
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0], first_file);
  EXPECT_EQ(test::read_file(first_file), first_bytes) << "the stopped run's file is left as it was";
  const EventFileContents resumed = read_event_file(files[1]);
  EXPECT_EQ(resumed.file_version, "brain.Event:2");
  EXPECT_EQ(resumed.restarts, std::vector<int64_t>{15}) << "the first step after the checkpoint at 14";
  ASSERT_FALSE(resumed.scalars.empty());
  EXPECT_GT(resumed.scalars.front().step, 14);
  EXPECT_EQ(steps_of(resumed.scalars, "train/loss").back(), 30);

  const std::vector<ScalarEvent> view = tensorboard_view(files);
  for (const char* tag : {"train/loss", "train/samples_per_second", "val/accuracy"}) {
    const std::vector<int64_t> steps = steps_of(view, tag);
    EXPECT_TRUE(std::adjacent_find(steps.begin(), steps.end(), std::greater_equal<>()) == steps.end())
        << tag << ": after the restart every step comes once, in order";
  }
  const std::vector<int64_t> loss_steps = steps_of(view, "train/loss");
  EXPECT_EQ(std::count(loss_steps.begin(), loss_steps.end(), 14), 1) << "the flush before the checkpoint stays";
  EXPECT_EQ(std::count(loss_steps.begin(), loss_steps.end(), 17), 0) << "the stopped run's step 17 is dropped";
}

TEST_F(TensorboardTest, PythonProtobufReadsTheRunsEventFile) {
  DKIT_SKIP_WITHOUT_EVENT_ORACLE();
  const std::string run = tmp_.file("run");
  train(small_run({"train.tensorboard=true"}), run);
  const auto files = event_files(run);
  ASSERT_EQ(files.size(), 1u);
  const EventFileContents mine = read_event_file(files[0]);
  const test::OracleReading theirs = test::read_with_python(tmp_.file("oracle.py"), files[0]);
  EXPECT_EQ(theirs.differing_records, 0);
  EXPECT_EQ(theirs.contents.records, mine.records);
  EXPECT_EQ(theirs.contents.file_version, "brain.Event:2");
  ASSERT_EQ(theirs.contents.scalars.size(), mine.scalars.size());
  for (size_t i = 0; i < mine.scalars.size(); ++i) {
    EXPECT_TRUE(test::same_scalar(theirs.contents.scalars[i], mine.scalars[i])) << i;
  }
  expect_scalars(theirs.contents.scalars, scalars_of_csv(run + "/metrics.csv"));
}

#ifdef DKIT_APP_PATH

/// The same through the `dkit` command.
class TensorboardCliTest : public test::SeedingFixture {
 protected:
  TensorboardCliTest() {
    std::ofstream(config_) << "device: cpu\nthreads: 1\n"
                              "data: {source: synthetic, samples: 200, features: 8, classes: 3}\n"
                              "model: {hidden: [16]}\n"
                              "train: {epochs: 3, batch_size: 16, log_every: 5, lr: 0.01, checkpoint_every: 7}\n";
  }

  // Runs `dkit train` with `arguments` after the verb; its stdout (the summary JSON), failing the test when it
  // fails.
  std::string dkit_train(const std::vector<std::string>& arguments, const std::string& name) {
    std::vector<std::string> argv = {DKIT_APP_PATH, "train"};
    argv.insert(argv.end(), arguments.begin(), arguments.end());
    argv.push_back("--no-progress");
    test::Process process(argv, tmp_.file(name));
    EXPECT_EQ(process.wait(), 0) << process.err();
    return process.out();
  }

  static int64_t host_syncs(const std::string& summary_json) {
    std::smatch match;
    EXPECT_TRUE(std::regex_search(summary_json, match, std::regex("\"host_syncs\":([0-9]+)"))) << summary_json;
    return match.empty() ? -1 : std::stoll(match[1].str());
  }

  test::TempDir tmp_;
  std::string config_ = tmp_.file("config.yaml");
};

TEST_F(TensorboardCliTest, DkitTrainWritesTheRowsOfMetricsCsvWithoutAnotherHostSync) {
  const std::string on = tmp_.file("on");
  const std::string with_events =
      dkit_train({"--config", config_, "--set", "train.tensorboard=true", "--out", on}, "on");
  const std::string without = dkit_train({"--config", config_, "--out", tmp_.file("off")}, "off");
  EXPECT_EQ(host_syncs(with_events), host_syncs(without));
  EXPECT_TRUE(event_files(tmp_.file("off")).empty());
  const auto files = event_files(on);
  ASSERT_EQ(files.size(), 1u);
  const EventFileContents contents = read_event_file(files[0]);
  EXPECT_EQ(contents.file_version, "brain.Event:2");
  expect_scalars(contents.scalars, scalars_of_csv(on + "/metrics.csv"));
  EXPECT_EQ(steps_of(contents.scalars, "val/accuracy"), (std::vector<int64_t>{10, 20, 30}));
  if (test::python_has_event_oracle()) {
    const test::OracleReading theirs = test::read_with_python(tmp_.file("oracle.py"), files[0]);
    EXPECT_EQ(theirs.differing_records, 0);
    expect_scalars(theirs.contents.scalars, scalars_of_csv(on + "/metrics.csv"));
  }
}

TEST_F(TensorboardCliTest, DkitTrainResumeAddsAFileThatMarksTheRestart) {
  const std::string run = tmp_.file("run");
  dkit_train({"--config", config_, "--set", "train.tensorboard=true", "--set", "train.max_steps=17", "--out", run},
             "first");
  ASSERT_EQ(event_files(run).size(), 1u);
  dkit_train({"--resume", run, "--set", "train.max_steps=0"}, "resumed");
  const auto files = event_files(run);
  ASSERT_EQ(files.size(), 2u);
  const EventFileContents resumed = read_event_file(files[1]);
  EXPECT_EQ(resumed.restarts, std::vector<int64_t>{18}) << "resumed from last.pt at step 17";
  ASSERT_FALSE(resumed.scalars.empty());
  EXPECT_EQ(steps_of(resumed.scalars, "train/loss").back(), 30);
  std::vector<ScalarEvent> both = read_event_file(files[0]).scalars;
  both.insert(both.end(), resumed.scalars.begin(), resumed.scalars.end());
  expect_scalars(both, scalars_of_csv(run + "/metrics.csv"));
}

#endif

} // namespace
} // namespace dkit

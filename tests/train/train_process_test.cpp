#include <dkit/checkpoint/safetensors.h>
#include <dkit/checkpoint/training_checkpoint.h>
#include <dkit/device/device.h>

#include "../process.h"
#include "../support.h"

#include <nlohmann/json.hpp>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/mount.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <regex>
#include <sstream>

#ifdef DKIT_APP_PATH

namespace dkit {
namespace {

namespace fs = std::filesystem;
using test::Process;
using test::run_process;

// The steps of the checkpoints a run's train.log says were written: save() had returned for each of them.
std::vector<int64_t> logged_checkpoint_steps(const std::string& run) {
  std::vector<int64_t> steps;
  const std::string log = test::read_file(run + "/train.log");
  const std::regex line("\\] checkpoint [^\\n]*step-0*([0-9]+)\\.pt\\n");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator(); ++it) {
    steps.push_back(std::stoll((*it)[1].str()));
  }
  return steps;
}

// The steps of the training rows of a run's metrics.csv (the rows whose validation columns are empty), in order.
std::vector<int64_t> logged_train_steps(const std::string& run) {
  std::istringstream csv(test::read_file(run + "/metrics.csv"));
  std::vector<int64_t> steps;
  std::string line;
  std::getline(csv, line);
  while (std::getline(csv, line)) {
    if (!line.empty() && line.back() == ',') {
      steps.push_back(std::stoll(line.substr(0, line.find(','))));
    }
  }
  return steps;
}

// The last line of `text` (without its newline).
std::string last_line(const std::string& text) {
  const size_t end = text.size() > 0 && text.back() == '\n' ? text.size() - 1 : text.size();
  const size_t start = text.rfind('\n', end == 0 ? 0 : end - 1);
  return text.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1));
}

// The temporary files a save in progress leaves when its process is killed.
int temporary_files(const std::string& folder) {
  int count = 0;
  std::error_code ec;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    count += it->path().filename().string().find(".tmp") != std::string::npos ? 1 : 0;
  }
  return count;
}

// A tmpfs mounted on a fresh folder for the test's lifetime, where the test may mount one (as root, or with
// CAP_SYS_ADMIN); otherwise mounted() is false and error() says why.
class TmpfsMount {
 public:
  TmpfsMount(const std::string& folder, const std::string& options, unsigned long flags = 0) : folder_(folder) {
    fs::create_directories(folder);
    if (::mount("tmpfs", folder.c_str(), "tmpfs", flags, options.c_str()) == 0) {
      mounted_ = true;
    } else {
      error_ = std::strerror(errno);
    }
  }
  ~TmpfsMount() {
    if (mounted_) {
      ::umount2(folder_.c_str(), MNT_DETACH);
    }
  }
  TmpfsMount(const TmpfsMount&) = delete;
  TmpfsMount& operator=(const TmpfsMount&) = delete;

  bool mounted() const {
    return mounted_;
  }
  const std::string& error() const {
    return error_;
  }

 private:
  std::string folder_;
  bool mounted_ = false;
  std::string error_;
};

/// Runs the real `dkit` command in child processes, kills it, and resumes it.
class TrainProcessTest : public test::SeedingFixture {
 protected:
  TrainProcessTest() {
    config_ = tmp_.file("config.yaml");
    std::ofstream(config_) << "device: cpu\nthreads: 1\nseed: 5\n"
                              "data: {source: synthetic, samples: 4000, features: 32, classes: 4}\n"
                              "model: {hidden: [128, 128], dropout: 0.1}\n"
                              "train: {epochs: 8, batch_size: 32, log_every: 1, checkpoint_every: 25}\n";
  }

  std::vector<std::string> train(const std::string& out) const {
    return {DKIT_APP_PATH, "train", "--config", config_, "--out", out, "--no-progress"};
  }

  static std::vector<std::string> resume(const std::string& out) {
    return {DKIT_APP_PATH, "train", "--resume", out, "--no-progress"};
  }

  static StateDict weights(const std::string& run) {
    return load_training_checkpoint(run + "/checkpoints/last.pt").model_state_dict;
  }

  static bool bitwise_equal(const StateDict& a, const StateDict& b) {
    if (a.keys() != b.keys()) {
      return false;
    }
    for (const auto& item : a) {
      if (!torch::equal(item.value(), b[item.key()])) {
        return false;
      }
    }
    return true;
  }

  /// Trains without interruption into `reference`; the number of steps the run takes.
  int64_t train_reference() {
    Process reference(train(tmp_.file("reference")), tmp_.file("reference"), {}, test::ErrTo::kPipe);
    int64_t total = 0;
    while (const auto line = reference.next_err_line()) {
      if (const auto progress = test::logged_step(*line)) {
        total = progress->second;
      }
    }
    EXPECT_EQ(reference.wait(), 0) << reference.err();
    EXPECT_GT(total, 0) << "the reference run printed no step line:\n" << reference.err();
    return total;
  }

  /// A config file in the test's folder: `yaml`, plus the lines every run here shares.
  std::string write_config(const std::string& name, const std::string& yaml) const {
    const std::string path = tmp_.file(name);
    std::ofstream(path) << "device: cpu\nthreads: 1\nseed: 3\n" << yaml;
    return path;
  }

  static std::vector<std::string> train_with(const std::string& config, const std::string& out,
                                             const std::vector<std::string>& sets = {}) {
    std::vector<std::string> argv = {DKIT_APP_PATH, "train", "--config", config, "--out", out, "--no-progress"};
    for (const auto& set : sets) {
      argv.insert(argv.end(), {"--set", set});
    }
    return argv;
  }

  static std::vector<std::string> resume_with(const std::string& out, const std::vector<std::string>& sets) {
    std::vector<std::string> argv = resume(out);
    for (const auto& set : sets) {
      argv.insert(argv.end(), {"--set", set});
    }
    return argv;
  }

  /// Runs `argv` to its end and checks its exit status; the process, for its output.
  std::unique_ptr<Process> run(const std::vector<std::string>& argv, const std::string& name, int expected) {
    auto process = std::make_unique<Process>(argv, tmp_.file(name));
    EXPECT_EQ(process->wait(), expected) << name << ":\n" << process->err();
    return process;
  }

  test::TempDir tmp_;
  std::string config_;
};

// kill -9 at random steps, each chosen before the run starts and read off the run's own progress lines: the run logs
// every step to a one-page stderr pipe, so it is never more than about 80 steps (a page of lines) past the line the test acted on.
// Two kills come before the first checkpoint (step 25), ten after it and at least 200 steps before the end, so those
// ten land mid-run whatever the machine's load. Every run, resumed or started again, ends bitwise equal to the
// uninterrupted one.
TEST_F(TrainProcessTest, KilledAtRandomMomentsThenResumedEndsBitwiseEqual) {
  const int64_t total = train_reference();
  const StateDict expected = weights(tmp_.file("reference"));
  ASSERT_GT(total, 400) << "the run is too short to kill mid-run with a margin of 200 steps";
  std::mt19937 generator(11);
  std::uniform_int_distribution<int64_t> early(1, 20);
  std::uniform_int_distribution<int64_t> later(30, total - 200);
  int mid_run_kills = 0;
  std::vector<int64_t> every_step(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) {
    every_step[static_cast<size_t>(i)] = i + 1;
  }
  for (int round = 0; round < 12; ++round) {
    const int64_t target = round < 2 ? early(generator) : later(generator);
    const std::string run = tmp_.file("run" + std::to_string(round));
    {
      Process victim(train(run), run, {}, test::ErrTo::kPipe);
      ASSERT_TRUE(test::read_until_step(victim, target))
          << "round " << round << ": the run ended before step " << target << ":\n" << victim.err();
      victim.signal(SIGKILL);
      ASSERT_EQ(victim.wait(), 128 + SIGKILL) << "round " << round << ": the run ended before the kill";
    }
    const bool has_checkpoint = fs::exists(run + "/checkpoints/last.pt");
    if (target > 25) {
      EXPECT_TRUE(has_checkpoint) << "round " << round << ": killed after step " << target
                                  << " but no checkpoint was written";
    }
    mid_run_kills += has_checkpoint ? 1 : 0;
    Process again(has_checkpoint ? resume(run) : train(run), run + "-again");
    ASSERT_EQ(again.wait(), 0) << again.err();
    EXPECT_TRUE(bitwise_equal(weights(run), expected)) << "round " << round << ": resumed weights differ";
    EXPECT_EQ(logged_train_steps(run), every_step) << "round " << round << ": metrics.csv holds each step once";
  }
  EXPECT_GE(mid_run_kills, 10) << "every kill after step 25 lands between a checkpoint and the end";
}

TEST_F(TrainProcessTest, SigtermWritesACheckpointExitsWith143AndResumesExactly) {
  const int64_t total = train_reference();
  const std::string run = tmp_.file("run");
  Process victim(train(run), run, {}, test::ErrTo::kPipe);
  ASSERT_TRUE(test::read_until_step(victim, 75)) << "the run ended before it could be signalled:\n" << victim.err();
  victim.signal(SIGTERM);
  EXPECT_EQ(victim.wait(), 143);
  const std::string err = victim.err();
  EXPECT_NE(err.find("dkit: stopped by signal 15 after step "), std::string::npos) << err;
  EXPECT_NE(err.find("; continue with: dkit train --resume " + run), std::string::npos) << err;
  EXPECT_LT(load_training_checkpoint(run + "/checkpoints/last.pt").step, total) << "the signal came after the end";
  Process again(resume(run), run + "-again");
  ASSERT_EQ(again.wait(), 0) << again.err();
  EXPECT_TRUE(bitwise_equal(weights(run), weights(tmp_.file("reference"))));
}


// The names created in a folder or renamed into it, read from an inotify watch.
class FolderWatch {
 public:
  explicit FolderWatch(const std::string& folder) : fd_(::inotify_init1(IN_CLOEXEC)) {
    if (fd_ < 0 || ::inotify_add_watch(fd_, folder.c_str(), IN_CREATE | IN_MOVED_TO) < 0) {
      error_ = std::strerror(errno);
    }
  }
  ~FolderWatch() {
    if (fd_ >= 0) {
      ::close(fd_);
    }
  }
  FolderWatch(const FolderWatch&) = delete;
  FolderWatch& operator=(const FolderWatch&) = delete;

  const std::string& error() const {
    return error_;
  }

  /// Forgets the names created so far.
  void drain() {
    pending_.clear();
    alignas(inotify_event) char buffer[4096];
    for (pollfd ready{fd_, POLLIN, 0}; ::poll(&ready, 1, 0) > 0;) {
      if (::read(fd_, buffer, sizeof(buffer)) <= 0) {
        break;
      }
    }
  }

  /// Waits for the next name created in the folder or renamed into it while `alive()` holds; nothing once it no longer does.
  template <typename Alive>
  std::optional<std::string> next(Alive alive) {
    while (pending_.empty()) {
      pollfd ready{fd_, POLLIN, 0};
      // The poll's period only bounds how often `alive` is asked; nothing is decided from it.
      if (::poll(&ready, 1, 100) <= 0) {
        if (!alive()) {
          return std::nullopt;
        }
        continue;
      }
      alignas(inotify_event) char buffer[4096];
      const ssize_t n = ::read(fd_, buffer, sizeof(buffer));
      for (ssize_t offset = 0; offset < n;) {
        const auto* event = reinterpret_cast<const inotify_event*>(buffer + offset);
        if (event->len > 0) {
          pending_.emplace_back(event->name);
        }
        offset += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
      }
    }
    std::string name = pending_.front();
    pending_.erase(pending_.begin());
    return name;
  }

 private:
  int fd_;
  std::string error_;
  std::vector<std::string> pending_;
};

// kill -9 inside checkpoint writes: every save of this run writes about 16 MB (a 1.3M-parameter model and its Adam
// state) to a temporary file after a step of a few milliseconds. Each round waits for the process's first completed
// save (its line in train.log), lets it create a random number of temporary files more (an inotify watch
// tells), stops it with SIGSTOP at the next one, and kills it there if a
// temporary file is still in the folder (the save is under way); otherwise it lets it go on to the next save. So
// every kill lands inside a save, however busy the machine. After each kill, last.pt must read, and be the newest
// complete checkpoint: at least as new as every step file and as every save that train.log recorded as done. The
// same run folder is resumed and killed again, round after round.
TEST_F(TrainProcessTest, KilledDuringCheckpointWritesLastIsAlwaysTheNewestCompleteOne) {
  const std::string config = write_config(
      "big.yaml", "data: {source: synthetic, samples: 600, features: 256, classes: 8}\n"
                  "model: {hidden: [1024, 1024]}\n"
                  "train: {epochs: 200, batch_size: 8, log_every: 1000, checkpoint_every: 1, keep_checkpoints: 2}\n");
  const std::string run = tmp_.file("run");
  const std::string folder = run + "/checkpoints";
  fs::create_directories(folder);
  FolderWatch watch(folder);
  ASSERT_EQ(watch.error(), "") << "cannot watch " << folder;
  std::mt19937 generator(7);
  std::uniform_int_distribution<int> saves_first(0, 3);
  constexpr int kRounds = 8;
  int64_t newest = -1;
  int stops_between_saves = 0;
  for (int round = 0; round < kRounds; ++round) {
    const bool resuming = fs::exists(folder + "/last.pt");
    const size_t saves_before = logged_checkpoint_steps(run).size();
    watch.drain();
    Process victim(resuming ? resume(run) : train_with(config, run), tmp_.file("round" + std::to_string(round)));
    const auto alive = [&] { return !victim.finished(); };
    // Each save's files follow the train.log line of the one before, so the line is there once an event shows.
    while (logged_checkpoint_steps(run).size() <= saves_before) {
      ASSERT_TRUE(watch.next(alive).has_value()) << "round " << round << ": the run ended before its first save:\n"
                                                 << victim.err();
    }
    for (int skip = saves_first(generator); skip >= 0;) {
      const auto name = watch.next(alive);
      ASSERT_TRUE(name.has_value()) << "round " << round << ": the run ended before it was killed:\n"
                                    << victim.err();
      if (name->find(".tmp") == std::string::npos || skip-- > 0) {
        continue;
      }
      victim.stop();
      if (temporary_files(folder) > 0) {
        break;
      }
      ++stops_between_saves;
      skip = 0;
      victim.resume();
    }
    victim.signal(SIGKILL);
    EXPECT_EQ(victim.wait(), 128 + SIGKILL);

    TrainingCheckpoint last;
    std::string error;
    ASSERT_TRUE(try_load_training_checkpoint(folder + "/last.pt", cpu(), last, error))
        << "round " << round << ": last.pt is unreadable: " << error;
    for (const auto& file : CheckpointFolder(run).step_files()) {
      TrainingCheckpoint step;
      EXPECT_TRUE(try_load_training_checkpoint(file, cpu(), step, error)) << "round " << round << ": " << error;
      EXPECT_LE(step.step, last.step) << "round " << round << ": " << file << " is newer than last.pt";
    }
    const auto logged = logged_checkpoint_steps(run);
    ASSERT_FALSE(logged.empty());
    EXPECT_LE(logged.back(), last.step)
        << "round " << round << ": a save train.log recorded as done is newer than last.pt";
    EXPECT_GE(last.step, newest) << "round " << round << ": last.pt went back in time";
    newest = last.step;
  }
  std::cout << "[          ] " << kRounds << " kills inside a save (" << stops_between_saves
            << " stops came after a save had ended and were let go on), last.pt at step " << newest << "\n";
}

// A full disk during a save, on a tmpfs just large enough for three checkpoints: the fourth save fails with a
// clear error, and the third checkpoint is left whole. Needs a tmpfs mount (root or CAP_SYS_ADMIN); the next test
// covers the same failure with a file size limit where mounting is not allowed.
TEST_F(TrainProcessTest, DiskFullDuringASaveIsAClearErrorAndKeepsThePreviousCheckpoint) {
  const std::string config = write_config(
      "disk.yaml", "data: {source: synthetic, samples: 200, features: 64, classes: 4}\nmodel: {hidden: [256]}\n"
                   "train: {epochs: 50, batch_size: 16, checkpoint_every: 1, keep_checkpoints: 0}\n");
  run(train_with(config, tmp_.file("probe"), {"train.max_steps=1"}), "probe", 0);
  const auto checkpoint_bytes = fs::file_size(tmp_.file("probe/checkpoints/last.pt"));
  // Three checkpoints, half of a fourth, and room for the logs and the config.
  const auto size = 3 * checkpoint_bytes + checkpoint_bytes / 2 + 64 * 1024;
  const TmpfsMount disk(tmp_.file("disk"), "size=" + std::to_string(size));
  if (!disk.mounted()) {
    GTEST_SKIP() << "cannot mount a tmpfs here (" << disk.error() << ")";
  }
  const std::string run_dir = tmp_.file("disk/run");
  const auto process = run(train_with(config, run_dir), "disk", 1);
  EXPECT_EQ(last_line(process->err()), "dkit: error: cannot write " + run_dir +
                                          "/checkpoints/last.pt: No space left on device (the existing file is "
                                          "unchanged)");
  EXPECT_EQ(logged_checkpoint_steps(run_dir), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(load_training_checkpoint(run_dir + "/checkpoints/last.pt").step, 3);
  EXPECT_EQ(CheckpointFolder(run_dir).step_files().size(), 3u);
  EXPECT_EQ(temporary_files(run_dir + "/checkpoints"), 0);
}

// The same failure where a tmpfs cannot be mounted: a resumed run whose files may not grow past half a
// checkpoint (RLIMIT_FSIZE, set by the shell, with SIGXFSZ ignored so that write() fails with EFBIG instead of
// killing the process).
TEST_F(TrainProcessTest, AFileSizeLimitDuringASaveIsAClearErrorAndKeepsThePreviousCheckpoint) {
  const std::string config = write_config(
      "limit.yaml", "data: {source: synthetic, samples: 200, features: 64, classes: 4}\nmodel: {hidden: [256]}\n"
                    "train: {epochs: 50, batch_size: 16, checkpoint_every: 2, max_steps: 4}\n");
  const std::string run_dir = tmp_.file("run");
  run(train_with(config, run_dir), "first", 0);
  const std::string last = run_dir + "/checkpoints/last.pt";
  const std::string before = test::read_file(last);
  const auto blocks = std::to_string(before.size() / 2 / 512);
  std::string command = "trap '' XFSZ; ulimit -f " + blocks + "; exec";
  for (const auto& arg : resume_with(run_dir, {"train.max_steps=8"})) {
    command += " '" + arg + "'";
  }
  const auto process = run({"/bin/sh", "-c", command}, "limited", 1);
  EXPECT_EQ(last_line(process->err()),
            "dkit: error: cannot write " + last + ": File too large (the existing file is unchanged)");
  EXPECT_EQ(test::read_file(last), before);
  EXPECT_EQ(temporary_files(run_dir + "/checkpoints"), 0);
}

// An --out that cannot be written is an error before anything is trained: a missing parent, a file as the
// parent, and a read-only folder. The read-only case needs a read-only mount (root ignores permission bits), or,
// for another user, a folder without write permission.
TEST_F(TrainProcessTest, AnUnwritableOutIsAnErrorBeforeTraining) {
  const std::string config = write_config(
      "small.yaml", "data: {source: synthetic, samples: 100, features: 4, classes: 2}\nmodel: {hidden: [4]}\n");
  const auto expect_refused = [&](const std::string& out, const std::string& reason) {
    const auto process = run(train_with(config, out), "out", 1);
    EXPECT_EQ(process->err(), "dkit: error: cannot create the run folder '" + out + "': " + reason + "\n");
    EXPECT_EQ(process->out(), "");
    EXPECT_FALSE(fs::exists(out + "/checkpoints/last.pt"));
  };
  expect_refused(tmp_.file("no/such/run"), "its parent '" + tmp_.file("no/such") + "' does not exist");
  std::ofstream(tmp_.file("a-file")) << "x";
  expect_refused(tmp_.file("a-file/run"), "its parent '" + tmp_.file("a-file") + "' is not a folder");

  const TmpfsMount read_only(tmp_.file("ro"), "size=64k", MS_RDONLY);
  if (read_only.mounted()) {
    expect_refused(tmp_.file("ro/run"), "Read-only file system");
    expect_refused(tmp_.file("ro"), "Read-only file system");
  } else if (::geteuid() != 0) {
    fs::permissions(tmp_.file("ro"), fs::perms::owner_read | fs::perms::owner_exec);
    expect_refused(tmp_.file("ro/run"), "Permission denied");
    fs::permissions(tmp_.file("ro"), fs::perms::owner_all);
  } else {
    GTEST_SKIP() << "root, and cannot mount a read-only tmpfs here (" << read_only.error()
                 << "): no way to make a folder read-only";
  }
}

// A device that is not there is refused like a config error, before the run folder exists: a typo in --set device
// leaves no folder behind.
TEST_F(TrainProcessTest, AnUnavailableDeviceIsRefusedBeforeTheRunFolderIsCreated) {
  const std::string config = write_config(
      "tiny.yaml", "data: {source: synthetic, samples: 100, features: 4, classes: 2}\nmodel: {hidden: [4]}\n");
  const std::string out = tmp_.file("run");
  const auto refused = run(train_with(config, out, {"device=cuda:7"}), "device", 1);
  const std::string err = refused->err();
  EXPECT_EQ(err.rfind("dkit: error: device 'cuda:7' is not available: ", 0), 0u) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_FALSE(fs::exists(out));
}

// Text dkit did not write itself reaches the terminal with its control characters as \xNN: a file name in the
// error line, the run folder's name in the log lines, a tensor's key in `dkit inspect`'s table.
TEST_F(TrainProcessTest, ControlCharactersFromFileNamesAndFilesAreShownEscaped) {
  const std::string missing = tmp_.file("a\x1b[2Jb\r.yaml");
  const auto refused = run({DKIT_APP_PATH, "train", "--config", missing, "--no-progress"}, "missing", 1);
  EXPECT_EQ(refused->err(),
            "dkit: error: cannot read config file '" + tmp_.file("a\\x1b[2Jb\\x0d.yaml") + "': no such file\n");

  const std::string config = write_config(
      "tiny.yaml", "data: {source: synthetic, samples: 100, features: 4, classes: 2}\nmodel: {hidden: [4]}\n");
  const auto trained = run(train_with(config, tmp_.file("run\tone"), {"train.max_steps=1"}), "tab", 0);
  EXPECT_NE(trained->err().find("run folder " + tmp_.file("run\\x09one")), std::string::npos) << trained->err();
  EXPECT_EQ(trained->err().find('\t'), std::string::npos) << trained->err();
  const auto exported = run({DKIT_APP_PATH, "export", "--checkpoint", tmp_.file("run\tone/checkpoints/last.pt"),
                             "--output", tmp_.file("model\t.pt")},
                            "export", 0);
  EXPECT_EQ(exported->out(),
            "wrote " + tmp_.file("model\\x09.pt") + ": 4 parameter tensors and input_mean, input_std\n");

  StateDict tensors;
  tensors.insert("w\x1b]0;title\x07", torch::zeros({2, 3}));
  const std::string file = tmp_.file("keys.safetensors");
  write_safetensors(file, tensors, {{"note", "a\x1b[2J\x7f"}});
  const auto inspected = run({DKIT_APP_PATH, "inspect", file}, "inspect", 0);
  EXPECT_EQ(inspected->out(), "format: safetensors\nmetadata: {\"note\":\"a\\u001b[2J\\u007f\"}\ntensors: 1\n"
                              "name               shape   dtype\n"
                              "w\\x1b]0;title\\x07  [2, 3]  float32\n");
  const auto as_json = run({DKIT_APP_PATH, "inspect", "--json", file}, "inspect-json", 0);
  EXPECT_EQ(nlohmann::json::parse(as_json->out())["metadata"]["note"], "a\x1b[2J\x7f");
}

// A CSV file with a header row trains with data.header, and predict (with --header), export and inspect take the run
// folder for its newest readable checkpoint, naming the file they read and the newer ones they skipped.
TEST_F(TrainProcessTest, AHeaderRowTrainsAndARunFolderStandsForItsNewestCheckpoint) {
  std::string rows = "width,height,label\n";
  for (int i = 0; i < 40; ++i) {
    rows += std::to_string(i % 7) + "," + std::to_string(i % 5) + "," + std::to_string(i % 2) + "\n";
  }
  test::write_bytes(tmp_.file("named.csv"), rows);
  const std::string config = write_config(
      "named.yaml", "data: {path: named.csv, header: true}\nmodel: {hidden: [4]}\n"
                    "train: {batch_size: 8, checkpoint_every: 1, max_steps: 2}\n");
  const std::string run_dir = tmp_.file("run");
  run(train_with(config, run_dir), "train", 0);
  const auto refused = run(train_with(config, tmp_.file("plain"), {"data.header=false"}), "no-header", 1);
  EXPECT_EQ(refused->err(), "dkit: error: " + tmp_.file("named.csv") + ":1: column 1: 'width' is not a number\n");

  const std::string folder = run_dir + "/checkpoints";
  test::write_bytes(tmp_.file("input.csv"), "width,height\n3,4\n");
  const auto predict = [&](const std::string& checkpoint) {
    return std::vector<std::string>{DKIT_APP_PATH, "predict", "--input", tmp_.file("input.csv"), "--header",
                                    "--device", "cpu", "--checkpoint", checkpoint};
  };
  const auto by_file = run(predict(folder + "/last.pt"), "predict-file", 0);
  EXPECT_EQ(by_file->err(), "");
  const auto by_folder = run(predict(run_dir), "predict-folder", 0);
  const std::string logits = by_folder->out();
  EXPECT_EQ(logits, by_file->out());
  EXPECT_EQ(std::count(logits.begin(), logits.end(), ','), 1) << logits;
  EXPECT_EQ(std::count(logits.begin(), logits.end(), '\n'), 1) << logits;
  EXPECT_EQ(by_folder->err(), "dkit: reading " + folder + "/last.pt\n");
  const auto exported =
      run({DKIT_APP_PATH, "export", "--checkpoint", run_dir, "--output", tmp_.file("model.pt")}, "export", 0);
  EXPECT_EQ(exported->err(), "dkit: reading " + folder + "/last.pt\n");
  const auto inspected = run({DKIT_APP_PATH, "inspect", run_dir}, "inspect", 0);
  EXPECT_EQ(inspected->out().rfind("format: dkit_checkpoint (state dict under 'model_state_dict')", 0), 0u)
      << inspected->out();

  // --limit applies to the folder's scan too: a file beyond it is skipped unread, not read whole to be found.
  const std::vector<std::string> newest_first = {folder + "/last.pt", folder + "/step-000002.pt",
                                                 folder + "/step-000001.pt"};
  uintmax_t smallest = fs::file_size(newest_first.front());
  for (const std::string& file : newest_first) {
    smallest = std::min(smallest, fs::file_size(file));
  }
  const std::string limit = std::to_string(smallest - 1);
  std::string reasons;
  for (const std::string& file : newest_first) {
    reasons += (reasons.empty() ? "" : "; ") + file + ": the file is " + std::to_string(fs::file_size(file)) +
               " bytes, more than the limit of " + limit + " (max_file_bytes)";
  }
  const auto limited =
      run({DKIT_APP_PATH, "inspect", run_dir, "--limit", "max_file_bytes=" + limit}, "inspect-limited", 1);
  EXPECT_EQ(limited->err(), "dkit: error: no readable checkpoint in " + folder + ": " + reasons + "\n");

  // last.pt and step-000002.pt are one file (a hard link) where the file system allows; cut both short.
  for (const std::string name : {"last.pt", "step-000002.pt"}) {
    fs::resize_file(folder + "/" + name, fs::file_size(folder + "/" + name) / 2);
  }
  const auto fell_back = run(predict(run_dir), "predict-fallback", 0);
  const std::string cut = ": truncated or corrupt zip archive: no end of central directory record (the file may "
                          "have been cut short)\n";
  EXPECT_EQ(fell_back->err(), "dkit: warning: skipped an unreadable checkpoint: " + folder + "/last.pt" + cut +
                                  "dkit: warning: skipped an unreadable checkpoint: " + folder + "/step-000002.pt" +
                                  cut + "dkit: reading " + folder + "/step-000001.pt\n");

  const std::string other = tmp_.file("other");
  fs::create_directories(other);
  const auto empty = run({DKIT_APP_PATH, "inspect", other}, "empty", 1);
  EXPECT_EQ(empty->err(), "dkit: error: " + other + ": is a directory with no readable checkpoint in '" + other +
                              "/checkpoints'; give a checkpoint file or a run folder\n");
}

// --resume when the newest checkpoint is corrupt (cut short, as a full disk or a bad copy leaves it): dkit says
// which files it skipped and why, resumes from the newest good one, and finishes the run.
TEST_F(TrainProcessTest, ResumeSkipsCorruptNewestCheckpointsAndSaysSo) {
  const std::string config = write_config(
      "resume.yaml", "data: {source: synthetic, samples: 200, features: 8, classes: 3}\nmodel: {hidden: [16]}\n"
                     "train: {epochs: 20, batch_size: 16, checkpoint_every: 2, max_steps: 6}\n");
  const std::string run_dir = tmp_.file("run");
  run(train_with(config, run_dir), "first", 0);
  const std::string folder = run_dir + "/checkpoints";
  // last.pt and step-000006.pt are one file (a hard link) where the file system allows; cut both short.
  for (const std::string name : {"last.pt", "step-000006.pt"}) {
    fs::resize_file(folder + "/" + name, fs::file_size(folder + "/" + name) / 2);
  }
  const auto process = run(resume_with(run_dir, {"train.max_steps=10"}), "resumed", 0);
  const std::string cut = ": truncated or corrupt zip archive: no end of central directory record (the file may "
                          "have been cut short)\n";
  const std::string said = "dkit: warning: skipped an unreadable checkpoint: " + folder + "/last.pt" + cut +
                           "dkit: warning: skipped an unreadable checkpoint: " + folder + "/step-000006.pt" + cut +
                           "dkit: resuming from " + folder + "/step-000004.pt\n";
  EXPECT_EQ(process->err().substr(0, said.size()), said);
  EXPECT_NE(test::read_file(run_dir + "/train.log").find("resumed from " + folder + "/step-000004.pt at step 4"),
            std::string::npos);
  EXPECT_EQ(load_training_checkpoint(folder + "/last.pt").step, 10);
}

// --auto-resume, the command a launcher reruns after a failure: the first time it starts the run from the config,
// later it continues from the run folder's newest checkpoint (with the config saved there, and --set on top).
TEST_F(TrainProcessTest, AutoResumeStartsARunThenContinuesIt) {
  const std::string config = write_config(
      "auto.yaml", "data: {source: synthetic, samples: 200, features: 8, classes: 3}\nmodel: {hidden: [16]}\n"
                   "train: {epochs: 20, batch_size: 16, checkpoint_every: 2, max_steps: 4}\n");
  const std::string run_dir = tmp_.file("run");
  auto with_auto = [&](std::vector<std::string> argv) {
    argv.push_back("--auto-resume");
    return argv;
  };
  const auto started = run(with_auto(train_with(config, run_dir)), "started", 0);
  EXPECT_EQ(started->err().find("dkit: resuming from"), std::string::npos) << started->err();
  EXPECT_EQ(load_training_checkpoint(run_dir + "/checkpoints/last.pt").step, 4);
  const auto continued = run(with_auto(train_with(config, run_dir, {"train.max_steps=6"})), "continued", 0);
  EXPECT_EQ(continued->err().rfind("dkit: resuming from " + run_dir + "/checkpoints/", 0), 0u) << continued->err();
  EXPECT_NE(test::read_file(run_dir + "/train.log").find("resumed from "), std::string::npos);
  EXPECT_EQ(load_training_checkpoint(run_dir + "/checkpoints/last.pt").step, 6);
  const auto no_out = run({DKIT_APP_PATH, "train", "--config", config, "--auto-resume"}, "no-out", 1);
  EXPECT_EQ(no_out->err(), "dkit: error: --auto-resume needs --config FILE and --out DIR: the run starts from the "
                           "config, and continues from DIR's newest checkpoint when restarted\n");
}

// A data set that changed between a run and its resume: the checksum saved in the checkpoint no longer matches,
// and resuming is refused with a message rather than continuing on other data.
TEST_F(TrainProcessTest, ResumeRefusesDataThatChangedSinceTheCheckpoint) {
  const std::string csv = tmp_.file("data.csv");
  std::ifstream digits(std::string(DKIT_SOURCE_DIR) + "/data/digits.csv");
  std::string rows;
  std::string line;
  for (int i = 0; i < 200 && std::getline(digits, line); ++i) {
    rows += line + "\n";
  }
  std::ofstream(csv) << rows;
  const std::string config = write_config(
      "data.yaml", "data: {source: csv, path: " + csv + "}\nmodel: {hidden: [16]}\n"
                   "train: {epochs: 5, batch_size: 16, max_steps: 3}\n");
  const std::string run_dir = tmp_.file("run");
  run(train_with(config, run_dir), "first", 0);
  const std::string last = run_dir + "/checkpoints/last.pt";
  const std::string before = test::read_file(last);
  rows[rows.find(",") - 1] = '9';  // one pixel of the first sample
  std::ofstream(csv) << rows;
  const auto process = run(resume_with(run_dir, {"train.max_steps=6"}), "resumed", 1);
  const std::regex refusal("dkit: resuming from " + last + "\ndkit: error: cannot resume from " + last +
                           ": the training data changed since it was written \\(checksum fnv1a64:[0-9a-f]{16}, now "
                           "fnv1a64:[0-9a-f]{16}\\); start a new run instead\n");
  EXPECT_TRUE(std::regex_match(process->err(), refusal)) << process->err();
  EXPECT_EQ(test::read_file(last), before);
}

} // namespace
} // namespace dkit

#endif

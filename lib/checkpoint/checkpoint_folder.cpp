#include <dkit/checkpoint/training_checkpoint.h>

#include <dkit/core/error.h>

#include <torch/torch.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace dkit {
namespace {

namespace fs = std::filesystem;

int64_t step_of(const fs::path& file) {
  const std::string name = file.filename().string();
  if (name.size() < 9 || name.compare(0, 5, "step-") != 0 || name.compare(name.size() - 3, 3, ".pt") != 0) {
    return -1;
  }
  const std::string digits = name.substr(5, name.size() - 8);
  if (digits.empty() || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) {
    return -1;
  }
  return std::stoll(digits);
}

void sync_folder(const std::string& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DKIT_CHECK(fd >= 0 && ::fsync(fd) == 0, "cannot sync folder ", folder, ": ", std::strerror(errno));
  ::close(fd);
}

} // namespace

CheckpointFolder::CheckpointFolder(const std::string& run_dir, CheckpointFolderOptions options)
    : path_((fs::path(run_dir) / "checkpoints").string()), options_(options) {
  DKIT_CHECK(options_.keep() >= 0, "CheckpointFolder keep must be 0 (keep all) or more, got ", options_.keep());
}

std::string CheckpointFolder::save(const TrainingCheckpoint& checkpoint) {
  std::error_code error;
  fs::create_directories(path_, error);
  DKIT_CHECK(!error, "cannot create the checkpoint folder ", path_, ": ", error.message());
  for (fs::directory_iterator it(path_, error), end; !error && it != end; it.increment(error)) {
    if (it->path().filename().string().find(".pt.tmp") != std::string::npos) {
      std::error_code ignored;
      fs::remove(it->path(), ignored);
    }
  }
  char name[40];
  std::snprintf(name, sizeof(name), "step-%06lld.pt", static_cast<long long>(checkpoint.step));
  const std::string step_path = (fs::path(path_) / name).string();
  const std::string last_path = (fs::path(path_) / "last.pt").string();
  save_training_checkpoint(last_path, checkpoint);
  const std::string link_path = step_path + ".tmp.link";
  ::unlink(link_path.c_str());
  if (::link(last_path.c_str(), link_path.c_str()) == 0) {
    DKIT_CHECK(::rename(link_path.c_str(), step_path.c_str()) == 0, "cannot write ", step_path, ": ",
               std::strerror(errno));
    sync_folder(path_);
  } else {
    save_training_checkpoint(step_path, checkpoint);
  }
  if (options_.keep() > 0) {
    const auto files = step_files();
    for (size_t i = static_cast<size_t>(options_.keep()); i < files.size(); ++i) {
      fs::remove(files[i], error);
    }
  }
  return step_path;
}

std::string CheckpointFolder::keep_as(const std::string& path, const std::string& name) const {
  const std::string kept = (fs::path(path_) / name).string();
  const std::string temporary = kept + ".tmp.link";
  ::unlink(temporary.c_str());
  if (::link(path.c_str(), temporary.c_str()) != 0) {
    std::error_code error;
    fs::copy_file(path, temporary, fs::copy_options::overwrite_existing, error);
    DKIT_CHECK(!error, "cannot copy ", path, " to ", kept, ": ", error.message());
  }
  DKIT_CHECK(::rename(temporary.c_str(), kept.c_str()) == 0, "cannot write ", kept, ": ", std::strerror(errno));
  sync_folder(path_);
  return kept;
}

std::vector<std::string> CheckpointFolder::step_files() const {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code error;
  for (fs::directory_iterator it(path_, error), end; !error && it != end; it.increment(error)) {
    const int64_t step = step_of(it->path());
    if (step >= 0 && it->is_regular_file()) {
      found.emplace_back(step, it->path().string());
    }
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> files;
  for (auto& item : found) {
    files.push_back(std::move(item.second));
  }
  return files;
}

std::optional<FoundCheckpoint> CheckpointFolder::load_newest(const c10::Device& map_location) const {
  return load_newest(ReadOptions().map_location(map_location));
}

std::optional<FoundCheckpoint> CheckpointFolder::load_newest(const ReadOptions& options) const {
  const std::string last_path = (fs::path(path_) / "last.pt").string();
  const auto files = step_files();
  const bool have_last = fs::exists(last_path);
  if (!have_last && files.empty()) {
    return std::nullopt;
  }
  FoundCheckpoint found;
  std::string error;
  TrainingCheckpoint last;
  const bool last_ok = have_last && try_load_training_checkpoint(last_path, options, last, error);
  if (have_last && !last_ok) {
    found.skipped.push_back(error);
  }
  for (const auto& file : files) {
    if (last_ok && step_of(file) <= last.step) {
      break;
    }
    if (try_load_training_checkpoint(file, options, found.checkpoint, error)) {
      found.path = file;
      return found;
    }
    found.skipped.push_back(error);
  }
  if (last_ok) {
    found.checkpoint = std::move(last);
    found.path = last_path;
    return found;
  }
  std::string reasons;
  for (const auto& reason : found.skipped) {
    reasons += (reasons.empty() ? "" : "; ") + reason;
  }
  throw Error(detail::concat("no readable checkpoint in ", path_, ": ", reasons));
}

} // namespace dkit

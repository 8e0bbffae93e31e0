#include <dkit/train/trainer.h>

#include <dkit/checkpoint/training_checkpoint.h>
#include <dkit/core/error.h>

namespace dkit {

ResumePoint resume_point(TrainingCheckpoint checkpoint, const std::string& source,
                         const std::vector<std::string>& overrides, const std::string& base_dir) {
  ResumePoint point;
  point.config = parse_config(checkpoint.config, "the config saved in " + source, base_dir);
  const auto batch_size = point.config.values.find("train.batch_size");
  point.saved_batch_size = batch_size != point.config.values.end() ? std::get<int64_t>(batch_size->second)
                                                                   : TrainerOptions("").batch_size();
  const TrainConfig changes = parse_config("", "--set", base_dir, overrides);
  for (const auto& [key, value] : changes.values) {
    point.config.values[key] = value;
    point.config.origins[key] = changes.origins.at(key);
  }
  point.source = source;
  point.checkpoint = std::make_shared<const TrainingCheckpoint>(std::move(checkpoint));
  return point;
}

std::optional<ResumePoint> try_resume_run(const std::string& run_dir, const std::vector<std::string>& overrides) {
  auto found = CheckpointFolder(run_dir).load_newest();
  if (!found) {
    return std::nullopt;
  }
  ResumePoint point = resume_point(std::move(found->checkpoint), found->path, overrides, run_dir);
  point.skipped = std::move(found->skipped);
  return point;
}

ResumePoint resume_run(const std::string& run_dir, const std::vector<std::string>& overrides) {
  std::optional<ResumePoint> point = try_resume_run(run_dir, overrides);
  DKIT_CHECK(point.has_value(), "cannot resume '", run_dir, "': no readable checkpoint in '",
             CheckpointFolder(run_dir).path(), "'");
  return std::move(*point);
}

} // namespace dkit

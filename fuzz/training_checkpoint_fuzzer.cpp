// Fuzzes what dkit does with a training checkpoint it reads: training_checkpoint_from(), then what
// `dkit predict`/`export` do (mlp_from() and a prediction) and what `dkit train --resume` does (parse the saved
// config, load the weights, the optimizer state and the generator states). Inputs are whole archives or bare
// data.pkl pickles (see read_root()). Seeds: fuzz/corpus/training_checkpoint.
#include "fuzz.h"

#include <dkit/checkpoint/training_checkpoint.h>
#include <dkit/model/mlp_file.h>
#include <dkit/train/config.h>

namespace {

void resume_like_the_trainer(const dkit::TrainingCheckpoint& checkpoint) {
  const dkit::FullTrainConfig config(dkit::parse_config(checkpoint.config, "the saved config", "."));
  (void)config;
  dkit::Mlp net(dkit::mlp_options_from(checkpoint, "fuzz.pt"));
  dkit::load_state_dict(*net, checkpoint.model_state_dict);
  const auto params = net->parameters();
  const std::unique_ptr<torch::optim::Optimizer> optimizers[] = {
      std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9)),
      std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.1)),
      std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.1)),
  };
  for (const auto& optimizer : optimizers) {
    try {
      dkit::load_optimizer_state_dict(*optimizer, checkpoint.optimizer_state_dict, "fuzz.pt");
    } catch (const dkit::Error&) {
    }
  }
  const dkit::RngState saved = dkit::capture_rng_state();
  try {
    dkit::restore_rng_state(checkpoint.rng);
  } catch (const dkit::Error&) {
  } catch (const c10::Error&) {
  }
  dkit::restore_rng_state(saved);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return dkit::fuzz::run_one(data, size, [](std::string_view bytes) {
    const dkit::PickleValue root = dkit::fuzz::read_root(bytes);
    const dkit::TrainingCheckpoint checkpoint = dkit::training_checkpoint_from(root, "fuzz.pt");
    try {
      const dkit::LoadedMlp model = dkit::mlp_from(root, "fuzz.pt");
      const auto logits = model.predict(torch::ones({2, model.net->options.in_features()}));
      (void)logits;
    } catch (const dkit::Error&) {
    }
    resume_like_the_trainer(checkpoint);
  });
}

#include <dkit/checkpoint/training_checkpoint.h>

#include <dkit/device/device.h>
#include <dkit/model/mlp_file.h>

#include "../support.h"
#include "python.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

namespace dkit {
namespace {

using test::error_message;
using test::fixture;
namespace fs = std::filesystem;

enum class Kind { kSGD, kAdam, kAdamAmsgrad, kAdamW, kRmsprop, kAdagrad };

std::string kind_name(Kind kind) {
  switch (kind) {
    case Kind::kSGD: return "SGD";
    case Kind::kAdam: return "Adam";
    case Kind::kAdamAmsgrad: return "AdamAmsgrad";
    case Kind::kAdamW: return "AdamW";
    case Kind::kRmsprop: return "RMSprop";
    case Kind::kAdagrad: return "Adagrad";
  }
  return "";
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Kind kind, const std::vector<torch::Tensor>& params) {
  switch (kind) {
    case Kind::kSGD:
      return std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(0.05).momentum(0.9).dampening(0.1).weight_decay(1e-4));
    case Kind::kAdam: return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
    case Kind::kAdamAmsgrad:
      return std::make_unique<torch::optim::Adam>(params,
                                                  torch::optim::AdamOptions(1e-2).amsgrad(true).weight_decay(1e-3));
    case Kind::kAdamW:
      return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-2).weight_decay(0.05));
    case Kind::kRmsprop:
      return std::make_unique<torch::optim::RMSprop>(
          params, torch::optim::RMSpropOptions(1e-2).momentum(0.9).centered(true).weight_decay(1e-4));
    case Kind::kAdagrad:
      return std::make_unique<torch::optim::Adagrad>(
          params, torch::optim::AdagradOptions(1e-1).lr_decay(1e-3).initial_accumulator_value(0.1));
  }
  return nullptr;
}

const MlpOptions kModel = MlpOptions(4, {16}, 3).dropout(0.25);

// Steps of training on random batches drawn from the CPU generator, with dropout: every source of randomness
// in a real run.
void train(Mlp& net, torch::optim::Optimizer& optimizer, int steps) {
  net->train();
  for (int i = 0; i < steps; ++i) {
    const auto x = torch::randn({8, 4});
    const auto y = torch::randint(0, 3, {8});
    optimizer.zero_grad();
    torch::nn::functional::cross_entropy(net->forward(x), y).backward();
    optimizer.step();
  }
}

TrainingCheckpoint snapshot(Mlp& net, const torch::optim::Optimizer& optimizer, int64_t step) {
  TrainingCheckpoint checkpoint;
  checkpoint.model_state_dict = module_state_dict(*net);
  checkpoint.model = mlp_description(net->options);
  checkpoint.optimizer_state_dict = optimizer_state_dict(optimizer);
  checkpoint.step = step;
  checkpoint.epoch = step / 3;
  checkpoint.epoch_step = step % 3;
  checkpoint.rng = capture_rng_state();
  checkpoint.config = "model:\n  hidden: [16]\n";
  checkpoint.data_checksum = "sha256:abc";
  return checkpoint;
}

void expect_same_optimizer_state(const torch::optim::Optimizer& a, const torch::optim::Optimizer& b) {
  const PickleValue sa = optimizer_state_dict(a);
  const PickleValue sb = optimizer_state_dict(b);
  const auto& groups_a = sa.find("param_groups")->items();
  const auto& groups_b = sb.find("param_groups")->items();
  ASSERT_EQ(groups_a.size(), groups_b.size());
  for (size_t g = 0; g < groups_a.size(); ++g) {
    for (const auto& [key, value] : groups_a[g].entries()) {
      const PickleValue* other = groups_b[g].find(key.to_string());
      ASSERT_NE(other, nullptr) << key.to_string();
      if (value.is_double()) {
        EXPECT_EQ(value.to_double(), other->to_double()) << key.to_string();
      }
    }
  }
  const auto& state_a = sa.find("state")->entries();
  ASSERT_EQ(state_a.size(), sb.find("state")->entries().size());
  for (const auto& [index, entry] : state_a) {
    const PickleValue* other = sb.find("state")->find(index.to_int());
    ASSERT_NE(other, nullptr);
    for (const auto& [name, value] : entry.entries()) {
      const PickleValue& mine = *other->find(name.to_string());
      if (value.is_int()) {
        EXPECT_EQ(value.to_int(), mine.to_int()) << "parameter " << index.to_int() << " " << name.to_string();
        continue;
      }
      EXPECT_TRUE(torch::equal(value.to_tensor(), mine.to_tensor()))
          << "parameter " << index.to_int() << " " << name.to_string();
    }
  }
}

class TrainingCheckpointTest : public test::SeedingFixture, public ::testing::WithParamInterface<Kind> {
 protected:
  test::TempDir dir_;
};

TEST_P(TrainingCheckpointTest, OptimizerStateRoundTripsBitwise) {
  Mlp net(kModel);
  auto optimizer = make_optimizer(GetParam(), net->parameters());
  train(net, *optimizer, 5);
  save_training_checkpoint(dir_.file("c.pt"), snapshot(net, *optimizer, 5));

  Mlp fresh(kModel);
  auto restored = make_optimizer(GetParam(), fresh->parameters());
  const TrainingCheckpoint loaded = load_training_checkpoint(dir_.file("c.pt"));
  load_state_dict(*fresh, loaded.model_state_dict);
  load_optimizer_state_dict(*restored, loaded.optimizer_state_dict, dir_.file("c.pt"));
  expect_same_optimizer_state(*optimizer, *restored);
  if (GetParam() != Kind::kSGD) {
    const PickleValue saved = optimizer_state_dict(*restored);
    const PickleValue& state = *saved.find("state")->find(int64_t{0});
    const PickleValue& step = *state.find("step");
    EXPECT_EQ(step.is_int() ? static_cast<float>(step.to_int()) : step.to_tensor().item<float>(), 5.0f);
    EXPECT_EQ(state.find("max_exp_avg_sq") != nullptr, GetParam() == Kind::kAdamAmsgrad);
  }
}

TEST_P(TrainingCheckpointTest, ContinuingAfterRestoreMatchesNotStoppingBitwise) {
  torch::manual_seed(1);
  Mlp straight(kModel);
  auto straight_optimizer = make_optimizer(GetParam(), straight->parameters());
  train(straight, *straight_optimizer, 10);

  torch::manual_seed(1);
  Mlp first(kModel);
  auto first_optimizer = make_optimizer(GetParam(), first->parameters());
  train(first, *first_optimizer, 4);
  save_training_checkpoint(dir_.file("c.pt"), snapshot(first, *first_optimizer, 4));

  torch::manual_seed(12345);
  Mlp resumed(kModel);
  auto resumed_optimizer = make_optimizer(GetParam(), resumed->parameters());
  const TrainingCheckpoint loaded = load_training_checkpoint(dir_.file("c.pt"));
  load_state_dict(*resumed, loaded.model_state_dict);
  load_optimizer_state_dict(*resumed_optimizer, loaded.optimizer_state_dict);
  restore_rng_state(loaded.rng);
  train(resumed, *resumed_optimizer, 6);

  const auto expected = straight->named_parameters();
  for (const auto& item : resumed->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), expected[item.key()])) << kind_name(GetParam()) << " " << item.key();
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, TrainingCheckpointTest,
                         ::testing::Values(Kind::kSGD, Kind::kAdam, Kind::kAdamAmsgrad, Kind::kAdamW, Kind::kRmsprop,
                                           Kind::kAdagrad),
                         [](const auto& param_info) { return kind_name(param_info.param); });

class TrainingCheckpointFileTest : public test::SeedingFixture {
 protected:
  test::TempDir dir_;
};

TEST_F(TrainingCheckpointFileTest, SavesAndLoadsEveryField) {
  Mlp net(MlpOptions(4, {8, 6}, 3).activation(Activation::kGELU).dropout(0.1));
  auto optimizer = make_optimizer(Kind::kAdam, net->parameters());
  train(net, *optimizer, 2);
  TrainingCheckpoint checkpoint = snapshot(net, *optimizer, 7);
  checkpoint.input_mean = torch::randn({4});
  checkpoint.input_std = torch::rand({4}) + 1;
  save_training_checkpoint(dir_.file("c.pt"), checkpoint);
  const TrainingCheckpoint loaded = load_training_checkpoint(dir_.file("c.pt"));
  EXPECT_EQ(loaded.model_state_dict.keys(), checkpoint.model_state_dict.keys());
  const MlpOptions shape = mlp_options_from(loaded, "c.pt");
  EXPECT_EQ(shape.in_features(), 4);
  EXPECT_EQ(shape.hidden(), (std::vector<int64_t>{8, 6}));
  EXPECT_EQ(shape.out_features(), 3);
  EXPECT_EQ(shape.activation(), Activation::kGELU);
  EXPECT_EQ(shape.dropout(), 0.1);
  EXPECT_TRUE(shape.bias());
  EXPECT_TRUE(torch::equal(loaded.input_mean, checkpoint.input_mean));
  EXPECT_TRUE(torch::equal(loaded.input_std, checkpoint.input_std));
  EXPECT_EQ(loaded.step, 7);
  EXPECT_EQ(loaded.epoch, 2);
  EXPECT_EQ(loaded.epoch_step, 1);
  EXPECT_TRUE(torch::equal(loaded.rng.cpu, checkpoint.rng.cpu));
  EXPECT_EQ(loaded.rng.cuda.size(), checkpoint.rng.cuda.size());
  EXPECT_EQ(loaded.config, checkpoint.config);
  EXPECT_EQ(loaded.data_checksum, "sha256:abc");
  const LoadedMlp model = load_mlp(dir_.file("c.pt"));
  EXPECT_EQ(model.net->options.activation(), Activation::kGELU);
  const auto x = torch::randn({5, 4});
  net->eval();
  EXPECT_TRUE(torch::equal(model.predict(x), net->forward((x - checkpoint.input_mean) / checkpoint.input_std)));
}

TEST_F(TrainingCheckpointFileTest, PythonReadsTheCheckpointAndItsOptimizerState) {
  DKIT_SKIP_WITHOUT_PYTHON_TORCH();
  Mlp net(MlpOptions(4, {8}, 3));
  auto optimizer = make_optimizer(Kind::kAdam, net->parameters());
  train(net, *optimizer, 3);
  save_training_checkpoint(dir_.file("c.pt"), snapshot(net, *optimizer, 3));
  const auto x = torch::randn({8, 4});
  const auto y = torch::randint(0, 3, {8});
  write_torch_file(dir_.file("batch.pt"), PickleValue::dict({{"x", x}, {"y", y}}));
  const auto result = test::run_python(dir_.file("check.py"), R"(import sys, collections, torch
ck = torch.load(sys.argv[1])
assert list(ck) == ["dkit_checkpoint", "model_state_dict", "model", "optimizer_state_dict", "step", "epoch",
                    "epoch_step", "rng", "config", "data_checksum", "world_size"], list(ck)
assert ck["world_size"] == 1
assert type(ck["model_state_dict"]) is collections.OrderedDict
assert ck["model"] == {"in_features": 4, "hidden": [8], "out_features": 3, "activation": "relu", "dropout": 0.0}
assert ck["rng"]["cpu"].dtype == torch.uint8
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
net.load_state_dict(ck["model_state_dict"])
opt = torch.optim.Adam(net.parameters())
opt.load_state_dict(ck["optimizer_state_dict"])
assert opt.state_dict()["param_groups"][0]["lr"] == 0.01
assert float(opt.state_dict()["state"][0]["step"]) == 3.0
batch = torch.load(sys.argv[2])
opt.zero_grad()
torch.nn.functional.cross_entropy(net(batch["x"]), batch["y"]).backward()
opt.step()
torch.save(net.state_dict(), sys.argv[3])
print("ok")
)",
                                        dir_.file("c.pt") + " " + dir_.file("batch.pt") + " " + dir_.file("after.pt"));
  ASSERT_EQ(result.status, 0) << result.output;
  optimizer->zero_grad();
  torch::nn::functional::cross_entropy(net->forward(x), y).backward();
  optimizer->step();
  const StateDict python = read_state_dict(dir_.file("after.pt"));
  for (const auto& item : module_state_dict(*net)) {
    EXPECT_TRUE(torch::allclose(item.value(), python[item.key()], 1e-6, 1e-6)) << item.key();
  }
}

// RMSprop's and Adagrad's state in PyTorch's layout: Python's optimizer loads it and its next step is LibTorch's.
TEST_F(TrainingCheckpointFileTest, PythonContinuesRmspropAndAdagradState) {
  DKIT_SKIP_WITHOUT_PYTHON_TORCH();
  const std::vector<std::pair<Kind, std::string>> cases = {
      {Kind::kRmsprop, "torch.optim.RMSprop(net.parameters())"},
      {Kind::kAdagrad, "torch.optim.Adagrad(net.parameters())"}};
  for (const auto& [kind, python_optimizer] : cases) {
    SCOPED_TRACE(kind_name(kind));
    Mlp net(MlpOptions(4, {8}, 3));
    auto optimizer = make_optimizer(kind, net->parameters());
    train(net, *optimizer, 3);
    save_training_checkpoint(dir_.file("c.pt"), snapshot(net, *optimizer, 3));
    const auto x = torch::randn({8, 4});
    const auto y = torch::randint(0, 3, {8});
    write_torch_file(dir_.file("batch.pt"), PickleValue::dict({{"x", x}, {"y", y}}));
    const auto result = test::run_python(dir_.file("check.py"), R"(import sys, torch
ck = torch.load(sys.argv[1])
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
net.load_state_dict(ck["model_state_dict"])
opt = )" + python_optimizer + R"(
opt.load_state_dict(ck["optimizer_state_dict"])
assert float(opt.state_dict()["state"][0]["step"]) == 3.0
batch = torch.load(sys.argv[2])
opt.zero_grad()
torch.nn.functional.cross_entropy(net(batch["x"]), batch["y"]).backward()
opt.step()
torch.save(net.state_dict(), sys.argv[3])
print("ok")
)",
                                          dir_.file("c.pt") + " " + dir_.file("batch.pt") + " " + dir_.file("after.pt"));
    ASSERT_EQ(result.status, 0) << result.output;
    optimizer->zero_grad();
    torch::nn::functional::cross_entropy(net->forward(x), y).backward();
    optimizer->step();
    const StateDict python = read_state_dict(dir_.file("after.pt"));
    for (const auto& item : module_state_dict(*net)) {
      EXPECT_TRUE(torch::allclose(item.value(), python[item.key()], 1e-6, 1e-6)) << item.key();
    }
  }
}

// A LibTorch scheduler's position, restored with the optimizer's learning rate, continues its schedule exactly.
TEST_F(TrainingCheckpointFileTest, AStepLrSchedulerContinuesWhereItStopped) {
  Mlp net(MlpOptions(4, {3}, 3));
  torch::optim::SGD straight(net->parameters(), torch::optim::SGDOptions(1.0));
  torch::optim::StepLR straight_schedule(straight, /*step_size=*/3, /*gamma=*/0.5);
  load_scheduler_state_dict(straight_schedule, PickleValue::dict({{"step_count", int64_t{0}}}));
  std::vector<double> expected;
  PickleValue optimizer_state;
  PickleValue schedule_state;
  for (int i = 0; i < 10; ++i) {
    if (i == 4) {
      optimizer_state = optimizer_state_dict(straight);
      schedule_state = scheduler_state_dict(straight_schedule);
    }
    straight_schedule.step();
    expected.push_back(straight.param_groups()[0].options().get_lr());
  }
  EXPECT_EQ(schedule_state.find("step_count")->to_int(), 4);
  torch::optim::SGD resumed(net->parameters(), torch::optim::SGDOptions(1.0));
  torch::optim::StepLR resumed_schedule(resumed, /*step_size=*/3, /*gamma=*/0.5);
  load_optimizer_state_dict(resumed, optimizer_state, "c.pt");
  load_scheduler_state_dict(resumed_schedule, schedule_state, "c.pt");
  for (int i = 4; i < 10; ++i) {
    resumed_schedule.step();
    EXPECT_EQ(resumed.param_groups()[0].options().get_lr(), expected[static_cast<size_t>(i)]) << "step " << i;
  }
  EXPECT_EQ(error_message([&] {
              load_scheduler_state_dict(resumed_schedule, PickleValue::dict({{"step_count", int64_t{-1}}}), "c.pt");
            }),
            "c.pt: the scheduler state: 'step_count' is -1, expected a count of steps");
}

TEST_F(TrainingCheckpointFileTest, LoadsPythonAdamState) {
  const std::string path = fixture("general_checkpoint.pt");
  const PickleValue root = read_torch_file(path).root;
  Mlp net = mlp_from_state_dict(state_dict_from(root, path));
  torch::optim::Adam optimizer(net->parameters(), torch::optim::AdamOptions(1.0));
  load_optimizer_state_dict(optimizer, *root.find("optimizer_state_dict"), path);
  const PickleValue state = optimizer_state_dict(optimizer);
  EXPECT_EQ(state.find("param_groups")->items()[0].find("lr")->to_double(), 0.01);
  const PickleValue& saved = *root.find("optimizer_state_dict")->find("state")->find(int64_t{2});
  const PickleValue& restored = *state.find("state")->find(int64_t{2});
  EXPECT_EQ(restored.find("step")->to_tensor().item<float>(), 2.0f);
  EXPECT_TRUE(torch::equal(restored.find("exp_avg")->to_tensor(), saved.find("exp_avg")->to_tensor()));
  EXPECT_TRUE(torch::equal(restored.find("exp_avg_sq")->to_tensor(), saved.find("exp_avg_sq")->to_tensor()));
}

TEST_F(TrainingCheckpointFileTest, ExplainsOptimizerStateThatDoesNotFit) {
  Mlp net(MlpOptions(4, {3}, 3));
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  train(net, sgd, 1);
  const PickleValue sgd_state = optimizer_state_dict(sgd);
  torch::optim::Adam adam(net->parameters());
  EXPECT_EQ(error_message([&] { load_optimizer_state_dict(adam, sgd_state, "x.pt"); }),
            "x.pt: it holds the state of a torch.optim.SGD, but the optimizer is a torch::optim::Adam; resume with the "
            "optimizer it was saved with");
  Mlp wider(MlpOptions(4, {5}, 3));
  torch::optim::SGD wider_sgd(wider->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  EXPECT_EQ(error_message([&] { load_optimizer_state_dict(wider_sgd, sgd_state, "x.pt"); }),
            "x.pt: state of parameter 0: 'momentum_buffer' has shape [3, 4] but its parameter has shape [5, 4]");
  Mlp deeper(MlpOptions(4, {3, 3}, 3));
  torch::optim::SGD deeper_sgd(deeper->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  EXPECT_EQ(error_message([&] { load_optimizer_state_dict(deeper_sgd, sgd_state, "x.pt"); }),
            "x.pt: parameter group 0 has 4 parameters in the saved state, 6 in the optimizer");
  torch::optim::LBFGS lbfgs(net->parameters());
  EXPECT_EQ(error_message([&] { optimizer_state_dict(lbfgs); }),
            "optimizer state can be saved and restored for torch::optim::SGD, Adam, AdamW, RMSprop and Adagrad only");
}

TEST_F(TrainingCheckpointFileTest, ExplainsAFileThatIsNotATrainingCheckpoint) {
  const std::string path = fixture("state_dict.pt");
  EXPECT_EQ(error_message([&] { load_training_checkpoint(path); }),
            path + ": not a dkit training checkpoint (it has no 'dkit_checkpoint' entry)");
  const std::string newer = dir_.file("newer.pt");
  write_torch_file(newer, PickleValue::dict({{"dkit_checkpoint", 2}}));
  EXPECT_EQ(error_message([&] { load_training_checkpoint(newer); }),
            newer + ": checkpoint format 2, this dkit reads format 1 (written by another dkit version?)");
}

// A hostile 'model' entry must not make dkit build (allocate) a network larger than the weights the file holds:
// before the check, predict and export built an Mlp of [1099511627776, 4] and ran out of memory.
TEST_F(TrainingCheckpointFileTest, RefusesAModelEntryThatDoesNotDescribeItsWeights) {
  Mlp net(kModel);
  auto optimizer = make_optimizer(Kind::kSGD, net->parameters());
  const std::string path = dir_.file("c.pt");
  save_training_checkpoint(path, snapshot(net, *optimizer, 1));
  PickleValue root = read_torch_file(path).root;
  root.set("model", PickleValue::dict({{"in_features", 4},
                                       {"hidden", PickleValue::list({int64_t{1} << 40})},
                                       {"out_features", 3},
                                       {"activation", "relu"},
                                       {"dropout", 0.0}}));
  write_torch_file(path, root);
  EXPECT_EQ(error_message([&] { load_mlp(path); }),
            path + ": 'model' describes 0.weight as [1099511627776, 4] but 'model_state_dict' holds [16, 4]");
  root.set("model", PickleValue::dict({{"in_features", 4},
                                       {"hidden", PickleValue::list({16, 16})},
                                       {"out_features", 3},
                                       {"activation", "relu"},
                                       {"dropout", 0.0}}));
  write_torch_file(path, root);
  EXPECT_EQ(error_message([&] { mlp_options_from(load_training_checkpoint(path), path); }),
            path + ": 'model' describes 2.weight as [16, 16] but 'model_state_dict' holds [3, 16]");
}

// An expanded view (stride 0 over one stored value) may claim any shape; a layer built from it would allocate
// what the file never held.
TEST_F(TrainingCheckpointFileTest, RefusesAnExpandedViewAsALayersWeight) {
  const std::string path = dir_.file("expanded.pt");
  write_torch_file(path, PickleValue::ordered_dict({{"0.weight", torch::zeros({1}).expand({1 << 20, 1 << 20})},
                                                    {"0.bias", torch::zeros({1}).expand({1 << 20})}}));
  EXPECT_EQ(error_message([&] { load_mlp(path); }),
            path + ": '0.weight' has shape [1048576, 1048576] but its storage holds 1 values: an expanded view "
                   "cannot be a layer's weight");
}

TEST_F(TrainingCheckpointFileTest, RestoresTheCpuGenerator) {
  torch::randn({3});
  const RngState state = capture_rng_state();
  const auto first = torch::randn({7});
  const auto dropped = torch::dropout(torch::ones({64}), 0.5, true);
  restore_rng_state(state);
  EXPECT_TRUE(torch::equal(torch::randn({7}), first));
  EXPECT_TRUE(torch::equal(torch::dropout(torch::ones({64}), 0.5, true), dropped));
  RngState bad;
  bad.cpu = torch::zeros({10}, torch::kByte);
  EXPECT_EQ(error_message([&] { restore_rng_state(bad); }),
            "cannot restore the CPU random generator: its saved state is 10 uint8 values, expected " +
                std::to_string(state.cpu.numel()) + " uint8");
}

// LibTorch 1.13 accepts a CPU generator state with left = next = 624 and then draws from memory past its state
// array; a checkpoint's state is checked before it reaches LibTorch.
TEST_F(TrainingCheckpointFileTest, RefusesAnInconsistentCpuGeneratorState) {
  RngState state = capture_rng_state();
  const RngState before = state;
  state.cpu = state.cpu.clone();
  auto* bytes = state.cpu.data_ptr<uint8_t>();
  const int32_t left = 624;
  const uint64_t next = 624;
  std::memcpy(bytes + 8, &left, sizeof(left));
  std::memcpy(bytes + 16, &next, sizeof(next));
  EXPECT_EQ(error_message([&] { restore_rng_state(state); }),
            "cannot restore the CPU random generator: its saved state is inconsistent (left 624, next 624)");
  EXPECT_TRUE(torch::equal(capture_rng_state().cpu, before.cpu)) << "the generator changed";
}

TEST_F(TrainingCheckpointFileTest, RestoresTheCudaGenerators_CUDA) {
  const RngState state = capture_rng_state();
  ASSERT_EQ(state.cuda.size(), static_cast<size_t>(num_gpus()));
  const auto first = torch::randn({7}, torch::Device(torch::kCUDA, 0));
  restore_rng_state(state);
  EXPECT_TRUE(torch::equal(torch::randn({7}, torch::Device(torch::kCUDA, 0)), first));
}

TEST_F(TrainingCheckpointFileTest, SavesOnTheGpuAndResumesOnTheCpu_CUDA) {
  Mlp net(kModel);
  place_module(net, gpu(0));
  auto optimizer = make_optimizer(Kind::kAdam, net->parameters());
  net->train();
  for (int i = 0; i < 3; ++i) {
    optimizer->zero_grad();
    net->forward(torch::randn({8, 4}, torch::Device(torch::kCUDA, 0))).sum().backward();
    optimizer->step();
  }
  save_training_checkpoint(dir_.file("gpu.pt"), snapshot(net, *optimizer, 3));
  const TrainingCheckpoint loaded = load_training_checkpoint(dir_.file("gpu.pt"), cpu());
  Mlp on_cpu(kModel);
  auto cpu_optimizer = make_optimizer(Kind::kAdam, on_cpu->parameters());
  load_state_dict(*on_cpu, loaded.model_state_dict);
  load_optimizer_state_dict(*cpu_optimizer, loaded.optimizer_state_dict);
  EXPECT_EQ(on_cpu->layers()[0]->weight.device(), cpu());
  EXPECT_TRUE(torch::equal(on_cpu->layers()[0]->weight, net->layers()[0]->weight.cpu()));
  Mlp back_on_gpu(kModel);
  place_module(back_on_gpu, gpu(0));
  load_state_dict(*back_on_gpu, loaded.model_state_dict);
  EXPECT_TRUE(torch::equal(back_on_gpu->layers()[0]->weight, net->layers()[0]->weight));
}

class CheckpointFolderTest : public test::SeedingFixture {
 protected:
  TrainingCheckpoint checkpoint(int64_t step) {
    TrainingCheckpoint c = snapshot(net_, *optimizer_, step);
    return c;
  }

  test::TempDir dir_;
  Mlp net_{kModel};
  std::unique_ptr<torch::optim::Optimizer> optimizer_ = make_optimizer(Kind::kAdam, net_->parameters());
};

TEST_F(CheckpointFolderTest, KeepsTheNewestStepFilesAndLast) {
  CheckpointFolder folder(dir_.path().string(), CheckpointFolderOptions().keep(2));
  for (int64_t step = 1; step <= 5; ++step) {
    EXPECT_EQ(folder.save(checkpoint(step)), folder.path() + "/step-00000" + std::to_string(step) + ".pt");
  }
  EXPECT_EQ(folder.step_files(),
            (std::vector<std::string>{folder.path() + "/step-000005.pt", folder.path() + "/step-000004.pt"}));
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder.path())) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"last.pt", "step-000004.pt", "step-000005.pt"}));
  const auto found = folder.load_newest();
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->checkpoint.step, 5);
  EXPECT_EQ(found->path, folder.path() + "/last.pt");
  EXPECT_TRUE(found->skipped.empty());
}

TEST_F(CheckpointFolderTest, FallsBackWhenTheNewestIsCorruptAndSaysSo) {
  CheckpointFolder folder(dir_.path().string());
  for (int64_t step = 1; step <= 3; ++step) {
    folder.save(checkpoint(step));
  }
  const std::string last = folder.path() + "/last.pt";
  fs::remove(last);
  std::ofstream(last) << "not a checkpoint";
  auto found = folder.load_newest();
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->checkpoint.step, 3);
  EXPECT_EQ(found->path, folder.path() + "/step-000003.pt");
  EXPECT_EQ(found->skipped, std::vector<std::string>{last + ": not a PyTorch file: it starts with bytes 6e 6f 74 20, "
                                                            "neither a torch.save zip archive nor PyTorch's legacy "
                                                            "format"});
  const std::string step3 = folder.path() + "/step-000003.pt";
  fs::resize_file(step3, fs::file_size(step3) / 2);
  found = folder.load_newest();
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->checkpoint.step, 2);
  ASSERT_EQ(found->skipped.size(), 2u);
  EXPECT_EQ(found->skipped[1], step3 + ": truncated or corrupt zip archive: no end of central directory record (the "
                                       "file may have been cut short)");
}

TEST_F(CheckpointFolderTest, PrefersAStepFileNewerThanLast) {
  CheckpointFolder folder(dir_.path().string());
  folder.save(checkpoint(1));
  save_training_checkpoint(folder.path() + "/step-000002.pt", checkpoint(2));
  const auto found = folder.load_newest();
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->checkpoint.step, 2);
  EXPECT_EQ(found->path, folder.path() + "/step-000002.pt");
}

// The read limits apply to every file the search reads: one beyond them is skipped (and said), unread.
TEST_F(CheckpointFolderTest, SkipsAFileBeyondTheReadLimits) {
  CheckpointFolder folder(dir_.path().string());
  folder.save(checkpoint(1));
  const std::string newer = folder.path() + "/step-000002.pt";
  TrainingCheckpoint bigger = checkpoint(2);
  bigger.model_state_dict.insert("extra", torch::zeros({4096}));
  save_training_checkpoint(newer, bigger);
  const auto limit = static_cast<int64_t>(fs::file_size(folder.path() + "/last.pt"));
  ASSERT_GT(static_cast<int64_t>(fs::file_size(newer)), limit);
  const auto found = folder.load_newest(ReadOptions().limits(ReadLimits().max_file_bytes(limit)));
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->checkpoint.step, 1);
  EXPECT_EQ(found->path, folder.path() + "/last.pt");
  ASSERT_EQ(found->skipped.size(), 1u);
  EXPECT_EQ(found->skipped[0], newer + ": the file is " + std::to_string(fs::file_size(newer)) +
                                   " bytes, more than the limit of " + std::to_string(limit) + " (max_file_bytes)");
  EXPECT_EQ(folder.load_newest()->checkpoint.step, 2);
}

TEST_F(CheckpointFolderTest, ReportsWhenNothingIsReadable) {
  CheckpointFolder folder(dir_.path().string());
  EXPECT_FALSE(folder.load_newest().has_value());
  fs::create_directories(folder.path());
  std::ofstream(folder.path() + "/last.pt") << "";
  EXPECT_EQ(error_message([&] { folder.load_newest(); }),
            "no readable checkpoint in " + folder.path() + ": " + folder.path() + "/last.pt: the file is empty");
}

TEST_F(CheckpointFolderTest, AWriterKilledAtAnyMomentLeavesOnlyWholeFiles) {
  CheckpointFolder folder(dir_.path().string(), CheckpointFolderOptions().keep(2));
  folder.save(checkpoint(0));
  std::mt19937 generator(3);
  for (int trial = 0; trial < 8; ++trial) {
    const TrainingCheckpoint base = checkpoint(0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      TrainingCheckpoint c = base;
      for (int64_t step = 1;; ++step) {
        c.step = step;
        folder.save(c);
      }
    }
    ::usleep(2000 + generator() % 30000);
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    const auto found = folder.load_newest();
    ASSERT_TRUE(found.has_value());
    EXPECT_TRUE(found->skipped.empty()) << found->skipped.front();
    for (const auto& file : folder.step_files()) {
      TrainingCheckpoint loaded;
      std::string error;
      EXPECT_TRUE(try_load_training_checkpoint(file, cpu(), loaded, error)) << error;
    }
  }
  folder.save(checkpoint(1000));
  for (const auto& entry : fs::directory_iterator(folder.path())) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
  }
}

} // namespace
} // namespace dkit

#include <dkit/checkpoint/state_dict.h>

#include <dkit/checkpoint/training_checkpoint.h>
#include <dkit/device/device.h>
#include <dkit/model/mlp_file.h>

#include "../support.h"
#include "python.h"

#include <fstream>
#include <sstream>

namespace dkit {
namespace {

using test::error_message;
using test::fixture;
using test::read_rows;

const std::vector<std::string> kSequentialKeys = {"0.weight", "0.bias", "2.weight", "2.bias"};

class StateDictTest : public test::SeedingFixture {
 protected:
  test::TempDir dir_;
};

TEST_F(StateDictTest, FindsAPlainStateDict) {
  const StateDict state_dict = read_state_dict(fixture("state_dict.pt"));
  EXPECT_EQ(state_dict.keys(), kSequentialKeys);
}

TEST_F(StateDictTest, FindsTheStateDictOfAGeneralCheckpoint) {
  const PickleValue root = read_torch_file(fixture("general_checkpoint.pt")).root;
  std::string key;
  ASSERT_TRUE(try_find_state_dict(root, key));
  EXPECT_EQ(key, "model_state_dict");
  EXPECT_EQ(state_dict_from(root, "general_checkpoint.pt").keys(), kSequentialKeys);
}

TEST_F(StateDictTest, FindsAStateDictUnderStateDict) {
  EXPECT_EQ(read_state_dict(fixture("nested_state_dict.pt")).keys(), kSequentialKeys);
}

TEST_F(StateDictTest, FindsAStateDictUnderModel) {
  EXPECT_EQ(read_state_dict(fixture("nested_model.pt")).keys(), kSequentialKeys);
}

TEST_F(StateDictTest, StripsDataParallelPrefix) {
  const StateDict state_dict = read_state_dict(fixture("data_parallel.pt"));
  EXPECT_EQ(state_dict.keys(), kSequentialKeys);
  EXPECT_TRUE(torch::equal(state_dict["0.weight"], read_state_dict(fixture("state_dict.pt"))["0.weight"]));
  EXPECT_EQ(read_state_dict(fixture("data_parallel.pt"), {}, StateDictOptions().strip_wrapper_prefixes(false)).keys()[0],
            "module.0.weight");
}

TEST_F(StateDictTest, StripsTorchCompilePrefix) {
  EXPECT_EQ(read_state_dict(fixture("compiled.pt")).keys(), kSequentialKeys);
}

TEST_F(StateDictTest, AppliesRenames) {
  const StateDict state_dict = read_state_dict(fixture("seed_model.pt"), {},
                                               StateDictOptions().renames({{"hidden.", "0."}, {"output.", "2."}}));
  EXPECT_EQ(state_dict.keys(), kSequentialKeys);
  const std::string path = fixture("state_dict.pt");
  EXPECT_EQ(error_message([&] { read_state_dict(path, {}, StateDictOptions().renames({{"0.", "2."}})); }),
            path + ": two tensors are named '2.weight' once prefixes are stripped and renamed");
}

TEST_F(StateDictTest, ExplainsAFileWithoutAStateDict) {
  const std::string path = dir_.file("no_state_dict.pt");
  write_torch_file(path, PickleValue::dict({{"epoch", 3}, {"weights", PickleValue::list({torch::zeros({1})})}}));
  EXPECT_EQ(error_message([&] { read_state_dict(path); }),
            path + ": no state dict found: expected a dict of tensors, or one under 'model_state_dict', 'state_dict' "
                   "or 'model'; the file holds a dict with keys 'epoch', 'weights'");
}

TEST_F(StateDictTest, LoadsIntoAModuleAndReportsPyTorchStyle) {
  Mlp net(MlpOptions(4, {3}, 2));
  const StateDict state_dict = read_state_dict(fixture("state_dict.pt"));
  const auto result = load_state_dict(*net, state_dict);
  EXPECT_TRUE(result.missing_keys.empty());
  EXPECT_TRUE(result.unexpected_keys.empty());
  EXPECT_TRUE(torch::equal(net->layers()[1]->bias, state_dict["2.bias"]));

  StateDict partial = state_dict;
  partial.erase("2.bias");
  partial.insert("3.weight", torch::zeros({1}));
  EXPECT_EQ(error_message([&] { load_state_dict(*net, partial, LoadStateDictOptions().source("x.pt")); }),
            "Error(s) in loading state_dict for Mlp from x.pt: Missing key(s) in state_dict: \"2.bias\". Unexpected "
            "key(s) in state_dict: \"3.weight\".");
  const auto relaxed = load_state_dict(*net, partial, LoadStateDictOptions().strict(false));
  EXPECT_EQ(relaxed.missing_keys, std::vector<std::string>{"2.bias"});
  EXPECT_EQ(relaxed.unexpected_keys, std::vector<std::string>{"3.weight"});
}

TEST_F(StateDictTest, ReportsSizeMismatchesAndCopiesNothing) {
  Mlp net(MlpOptions(4, {5}, 2));
  const auto before = net->layers()[1]->bias.clone();
  EXPECT_EQ(error_message([&] { load_state_dict(*net, read_state_dict(fixture("state_dict.pt"))); }),
            "Error(s) in loading state_dict for Mlp: size mismatch for 0.weight: copying a param with shape [3, 4] "
            "from checkpoint, the shape in current model is [5, 4]. size mismatch for 0.bias: copying a param with "
            "shape [3] from checkpoint, the shape in current model is [5]. size mismatch for 2.weight: copying a "
            "param with shape [2, 3] from checkpoint, the shape in current model is [2, 5].");
  EXPECT_TRUE(torch::equal(net->layers()[1]->bias, before));
}

TEST_F(StateDictTest, ReportsADtypeThatCannotConvert) {
  Mlp net(MlpOptions(4, {3}, 2));
  StateDict state_dict = read_state_dict(fixture("state_dict.pt"));
  state_dict["0.bias"] = torch::zeros({3}, torch::kLong);
  EXPECT_EQ(error_message([&] { load_state_dict(*net, state_dict); }),
            "Error(s) in loading state_dict for Mlp: dtype mismatch for 0.bias: copying a param of dtype int64 from "
            "checkpoint, the dtype in current model is float32.");
}

TEST_F(StateDictTest, ConvertsFloat16Bfloat16AndFloat64ToTheModelsDtype) {
  const StateDict reference = read_state_dict(fixture("state_dict.pt"));
  for (const auto& [name, tolerance] : std::vector<std::pair<std::string, double>>{
           {"dtype_float16.pt", 1e-3}, {"dtype_bfloat16.pt", 1e-2}, {"dtype_float64.pt", 1e-7}}) {
    Mlp net(MlpOptions(4, {3}, 2));
    load_state_dict(*net, read_state_dict(fixture(name)));
    EXPECT_EQ(net->layers()[0]->weight.scalar_type(), torch::kFloat) << name;
    EXPECT_TRUE(torch::allclose(net->layers()[0]->weight, reference["0.weight"], tolerance, tolerance)) << name;
  }
}

TEST_F(StateDictTest, LoadsOntoTheModulesDevice_CUDA) {
  Mlp net(MlpOptions(4, {3}, 2));
  place_module(net, gpu(0));
  load_state_dict(*net, read_state_dict(fixture("cuda_tagged.pt")));
  EXPECT_EQ(net->layers()[0]->weight.device(), gpu(0));
  EXPECT_TRUE(torch::equal(net->layers()[0]->weight.cpu(), read_state_dict(fixture("state_dict.pt"))["0.weight"]));
}

TEST_F(StateDictTest, BuildsAnMlpFromASequentialStateDict) {
  Mlp net = mlp_from_state_dict(read_state_dict(fixture("state_dict.pt")));
  EXPECT_EQ(net->options.in_features(), 4);
  EXPECT_EQ(net->options.hidden(), std::vector<int64_t>{3});
  EXPECT_EQ(net->options.out_features(), 2);
  net->eval();
  const auto expected = read_rows(fixture("state_dict_logits.csv"));
  EXPECT_TRUE(torch::allclose(net->forward(read_rows(fixture("mlp_input.csv"))), expected, 1e-6, 1e-6));
}

TEST_F(StateDictTest, BuildsAnMlpFromTheSeedsHiddenOutputModel) {
  Mlp net = mlp_from_state_dict(read_state_dict(fixture("seed_model.pt")));
  EXPECT_EQ(net->options.hidden(), std::vector<int64_t>{5});
  EXPECT_EQ(net->options.out_features(), 3);
  const auto expected = read_rows(fixture("seed_model_logits.csv"));
  EXPECT_TRUE(torch::allclose(net->forward(read_rows(fixture("mlp_input.csv"))), expected, 1e-6, 1e-6));
}

TEST_F(StateDictTest, ExplainsLayersThatDoNotChain) {
  const std::string path = fixture("non_chaining.pt");
  EXPECT_EQ(error_message([&] { mlp_from_state_dict(read_state_dict(path), MlpFromStateDictOptions().source(path)); }),
            path + ": layers '0.weight' [3, 4] and '2.weight' [2, 5] do not chain: the first gives 3 features, the "
                   "second takes 5");
}

TEST_F(StateDictTest, ExplainsTensorsThatAreNotPartOfAnMlp) {
  StateDict state_dict = read_state_dict(fixture("state_dict.pt"));
  state_dict.insert("bn.running_mean", torch::zeros({3}));
  EXPECT_EQ(error_message([&] { mlp_from_state_dict(state_dict); }),
            "state dict: tensor 'bn.running_mean' of shape [3] is not part of an MLP: only 2-D weights and the biases "
            "named like them are read");
  StateDict no_weights("key");
  no_weights.insert("bias", torch::zeros({3}));
  EXPECT_EQ(error_message([&] { mlp_from_state_dict(no_weights); }),
            "state dict: no 2-D weights in the state dict, so no Linear layers to build an MLP from");
  StateDict mixed = read_state_dict(fixture("state_dict.pt"));
  mixed.erase("2.bias");
  EXPECT_EQ(error_message([&] { mlp_from_state_dict(mixed); }),
            "state dict: some Linear layers have a bias and others do not; dkit::Mlp needs all or none");
  StateDict wrong_bias = read_state_dict(fixture("state_dict.pt"));
  wrong_bias["2.bias"] = torch::zeros({5});
  EXPECT_EQ(error_message([&] { mlp_from_state_dict(wrong_bias); }),
            "state dict: bias '2.bias' has shape [5] but its weight '2.weight' has shape [2, 3], so the bias should "
            "have shape [2]");
}

TEST_F(StateDictTest, SetsTheActivation) {
  Mlp net = mlp_from_state_dict(read_state_dict(fixture("state_dict.pt")),
                                MlpFromStateDictOptions().activation(Activation::kTanh));
  EXPECT_EQ(net->options.activation(), Activation::kTanh);
}

TEST_F(StateDictTest, ExportRoundTripsThroughPythonLoadStateDict) {
  DKIT_SKIP_WITHOUT_PYTHON_TORCH();
  LoadedMlp model;
  model.net = Mlp(MlpOptions(6, {16, 8}, 3));
  model.input_mean = torch::randn({6});
  model.input_std = torch::rand({6}) + 0.5;
  const auto inputs = torch::randn({10, 6}, torch::kDouble).to(torch::kFloat);
  std::ofstream(dir_.file("inputs.csv")) << [&] {
    std::ostringstream out;
    out.precision(9);
    for (int64_t r = 0; r < inputs.size(0); ++r) {
      for (int64_t c = 0; c < inputs.size(1); ++c) {
        out << (c == 0 ? "" : ",") << inputs[r][c].item<float>();
      }
      out << "\n";
    }
    return out.str();
  }();
  export_mlp(dir_.file("model.pt"), model);
  const auto result = test::run_python(dir_.file("check.py"), R"(import sys, torch
sd = torch.load(sys.argv[1], weights_only=True)
assert type(sd) is dict, type(sd)
mean, std = sd.pop("input_mean"), sd.pop("input_std")
net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
net.load_state_dict(sd)
x = torch.tensor([[float(v) for v in line.split(",")] for line in open(sys.argv[2])], dtype=torch.float32)
with torch.no_grad():
    y = net((x - mean) / std)
with open(sys.argv[3], "w") as out:
    for row in y.tolist():
        out.write(",".join(repr(v) for v in row) + "\n")
)",
                                        dir_.file("model.pt") + " " + dir_.file("inputs.csv") + " " +
                                            dir_.file("outputs.csv"));
  ASSERT_EQ(result.status, 0) << result.output;
  const auto python = read_rows(dir_.file("outputs.csv"));
  const auto read_inputs = read_rows(dir_.file("inputs.csv"));
  EXPECT_TRUE(torch::equal(read_inputs, inputs));
  EXPECT_TRUE(torch::allclose(model.predict(inputs), python, 1e-6, 1e-6))
      << model.predict(inputs) << "\n" << python;
}

TEST_F(StateDictTest, ModuleStateDictHasSequentialNames) {
  Mlp net(MlpOptions(4, {3}, 2));
  const StateDict state_dict = module_state_dict(*net);
  EXPECT_EQ(state_dict.keys(), kSequentialKeys);
  EXPECT_FALSE(state_dict["0.weight"].requires_grad());
  EXPECT_EQ(state_dict["0.weight"].data_ptr(), net->layers()[0]->weight.data_ptr());
}

} // namespace
} // namespace dkit

#include <dkit/checkpoint/state_dict.h>

#include <dkit/checkpoint/torch_file.h>
#include <dkit/model/mlp.h>

#include "../support.h"
#include "python.h"

namespace dkit {
namespace {

using test::error_message;
using test::fixture;

// The network of make_fixtures.py's SmallCnn, written in LibTorch: the same submodule names give the same keys.
struct SmallCnnImpl : torch::nn::Module {
  explicit SmallCnnImpl(bool classifier_bias = true)
      : features(register_module(
            "features", torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1)),
                                              torch::nn::BatchNorm2d(4), torch::nn::ReLU(),
                                              torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2))))),
        classifier(register_module("classifier",
                                   torch::nn::Linear(torch::nn::LinearOptions(4 * 4 * 4, 3).bias(classifier_bias)))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    return classifier->forward(features->forward(x).flatten(1));
  }

  torch::nn::Sequential features;
  torch::nn::Linear classifier;
};
TORCH_MODULE(SmallCnn);

// The inputs make_fixtures.py fed the trained SmallCnn and the outputs it gave in eval mode.
struct CnnIo {
  torch::Tensor inputs;
  torch::Tensor outputs;
};

CnnIo cnn_io() {
  const PickleValue root = read_torch_file(fixture("small_cnn_io.pt")).root;
  return {root.find("inputs")->to_tensor(), root.find("outputs")->to_tensor()};
}

torch::Tensor eval_forward(SmallCnn& net, const torch::Tensor& inputs) {
  net->eval();
  torch::NoGradGuard no_grad;
  return net->forward(inputs.to(net->classifier->weight.device())).cpu();
}

// Python's SmallCnn (as make_fixtures.py defines it) loading the state dict that `load` reads from argv[1] strictly
// and checking its outputs against the fixture's.
std::string python_loads_strictly(const std::string& load) {
  return R"(import collections, sys, torch
class SmallCnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.MaxPool2d(2))
        self.classifier = torch.nn.Linear(4 * 4 * 4, 3)
    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))
)" + load + R"(assert state_dict["features.1.num_batches_tracked"].dtype == torch.int64
assert int(state_dict["features.1.num_batches_tracked"]) == 20
net = SmallCnn()
result = net.load_state_dict(state_dict, strict=True)
assert not result.missing_keys and not result.unexpected_keys
net.eval()
io = torch.load(sys.argv[2])
with torch.no_grad():
    outputs = net(io["inputs"])
difference = (outputs - io["outputs"]).abs().max().item()
assert difference <= 1e-5, difference
print("ok")
)";
}

// A torch.save file's state dict: PyTorch 2.6 and later read it with torch.load's default (weights_only=True); 1.13
// is asked for weights_only=True, which it does not default to.
constexpr const char* kTorchLoad = R"(major, minor = (int(p) for p in torch.__version__.split(".")[:2])
if (major, minor) >= (2, 6):
    state_dict = torch.load(sys.argv[1])
else:
    state_dict = torch.load(sys.argv[1], weights_only=True)
assert type(state_dict) is collections.OrderedDict, type(state_dict)
)";

// A safetensors file's tensors, as Python's safetensors reads them.
constexpr const char* kSafetensorsLoad = R"(from safetensors.torch import load_file
state_dict = load_file(sys.argv[1])
)";

class ModuleIoTest : public test::SeedingFixture {
 protected:
  test::TempDir dir_;
};

TEST_F(ModuleIoTest, LoadsACnnTrainedInPythonAndGivesItsOutputs) {
  SmallCnn net;
  const LoadStateDictResult result = load_state_dict(*net, fixture("small_cnn.pt"));
  EXPECT_TRUE(result.missing_keys.empty());
  EXPECT_TRUE(result.unexpected_keys.empty());
  const auto& batch_norm = *net->features[1]->as<torch::nn::BatchNorm2d>();
  EXPECT_EQ(batch_norm.num_batches_tracked.scalar_type(), torch::kLong);
  EXPECT_EQ(batch_norm.num_batches_tracked.item<int64_t>(), 20);
  EXPECT_FALSE(torch::equal(batch_norm.running_var, torch::ones({4}))) << "the running statistics were not loaded";
  const CnnIo io = cnn_io();
  const torch::Tensor outputs = eval_forward(net, io.inputs);
  EXPECT_TRUE(torch::allclose(outputs, io.outputs, /*rtol=*/1e-5, /*atol=*/1e-6))
      << "largest difference " << (outputs - io.outputs).abs().max().item<float>();
}

TEST_F(ModuleIoTest, SavesACnnThatPythonLoadsStrictly) {
  DKIT_SKIP_WITHOUT_PYTHON_TORCH();
  SmallCnn net;
  load_state_dict(*net, fixture("small_cnn.pt"));
  save_state_dict(*net, dir_.file("cnn.pt"));
  const auto result = test::run_python(dir_.file("check.py"), python_loads_strictly(kTorchLoad),
                                       dir_.file("cnn.pt") + " " + fixture("small_cnn_io.pt"));
  EXPECT_EQ(result.status, 0) << result.output;
  EXPECT_EQ(result.output, "ok\n");
}

TEST_F(ModuleIoTest, RoundTripsEveryParameterAndBuffer) {
  SmallCnn trained;
  load_state_dict(*trained, fixture("small_cnn.pt"));
  for (const std::string name : {"cnn.pth", "cnn.safetensors"}) {
    save_state_dict(*trained, dir_.file(name));
    SmallCnn fresh;
    load_state_dict(*fresh, dir_.file(name));
    const StateDict expected = module_state_dict(*trained);
    const StateDict loaded = module_state_dict(*fresh);
    ASSERT_EQ(loaded.keys(), expected.keys()) << name;
    for (const auto& item : expected) {
      EXPECT_EQ(loaded[item.key()].scalar_type(), item.value().scalar_type()) << name << " " << item.key();
      EXPECT_TRUE(torch::equal(loaded[item.key()], item.value())) << name << " " << item.key();
    }
  }
  EXPECT_EQ(test::read_file(dir_.file("cnn.safetensors")).substr(8, 1), "{");
}

// Python's safetensors reading a module dkit saved as safetensors into Python's SmallCnn, strictly.
TEST_F(ModuleIoTest, SavesACnnAsSafetensorsThatPythonLoadsStrictly) {
  DKIT_SKIP_WITHOUT_PYTHON_SAFETENSORS();
  SmallCnn net;
  load_state_dict(*net, fixture("small_cnn.pt"));
  save_state_dict(*net, dir_.file("cnn.safetensors"));
  const auto result = test::run_python(dir_.file("check.py"), python_loads_strictly(kSafetensorsLoad),
                                       dir_.file("cnn.safetensors") + " " + fixture("small_cnn_io.pt"));
  EXPECT_EQ(result.status, 0) << result.output;
  EXPECT_EQ(result.output, "ok\n");
}

TEST_F(ModuleIoTest, StripsWrapperPrefixesFromAFile) {
  Mlp net(MlpOptions(4, {3}, 2));
  load_state_dict(*net, fixture("data_parallel.pt"));
  EXPECT_TRUE(torch::equal(net->layers().front()->weight, read_state_dict(fixture("state_dict.pt"))["0.weight"]));
  const std::string message = error_message([&] {
    load_state_dict(*net, fixture("data_parallel.pt"),
                    LoadFileOptions().keys(StateDictOptions().strip_wrapper_prefixes(false)));
  });
  EXPECT_EQ(message, "Error(s) in loading state_dict for Mlp from " + fixture("data_parallel.pt") +
                         ": Missing key(s) in state_dict: \"0.weight\", \"0.bias\", \"2.weight\", \"2.bias\". "
                         "Unexpected key(s) in state_dict: \"module.0.weight\", \"module.0.bias\", "
                         "\"module.2.weight\", \"module.2.bias\".");
}

TEST_F(ModuleIoTest, NamesTheFileAndTheKeysThatDoNotMatch) {
  SmallCnn without_bias(/*classifier_bias=*/false);
  const std::string path = fixture("small_cnn.pt");
  EXPECT_EQ(error_message([&] { load_state_dict(*without_bias, path); }),
            "Error(s) in loading state_dict for SmallCnn from " + path +
                ": Unexpected key(s) in state_dict: \"classifier.bias\".");
  const LoadStateDictResult result = load_state_dict(*without_bias, path, LoadFileOptions().strict(false));
  EXPECT_TRUE(result.missing_keys.empty());
  EXPECT_EQ(result.unexpected_keys, std::vector<std::string>{"classifier.bias"});
}

TEST_F(ModuleIoTest, NamesAMissingFile) {
  SmallCnn net;
  const std::string path = dir_.file("absent.pt");
  EXPECT_EQ(error_message([&] { load_state_dict(*net, path); }), path + ": cannot open: No such file or directory");
}

TEST_F(ModuleIoTest, LoadsAndSavesACnnOnTheGpu_CUDA) {
  SmallCnn net;
  net->to(torch::kCUDA);
  load_state_dict(*net, fixture("small_cnn.pt"), LoadFileOptions().read(ReadOptions().map_location(torch::kCUDA)));
  EXPECT_TRUE(net->classifier->weight.is_cuda());
  const CnnIo io = cnn_io();
  EXPECT_TRUE(torch::allclose(eval_forward(net, io.inputs), io.outputs, /*rtol=*/1e-4, /*atol=*/1e-5));
  save_state_dict(*net, dir_.file("from_gpu.pt"));
  for (const auto& item : read_state_dict(dir_.file("from_gpu.pt"))) {
    EXPECT_TRUE(item.value().device().is_cpu()) << item.key();
  }
  if (test::python_has_torch()) {
    const auto result = test::run_python(dir_.file("check.py"), python_loads_strictly(kTorchLoad),
                                         dir_.file("from_gpu.pt") + " " + fixture("small_cnn_io.pt"));
    EXPECT_EQ(result.status, 0) << result.output;
  }
}

} // namespace
} // namespace dkit

#include <dkit/model/mlp.h>

#include <dkit/device/device.h>

#include "../support.h"

#include <fstream>
#include <sstream>

namespace dkit {
namespace {

using test::error_message;

class MlpTest : public test::SeedingFixture {};

TEST_F(MlpTest, ParameterNamesMatchPythonSequential) {
  Mlp net(MlpOptions(/*in=*/20, /*hidden=*/{256, 128}, /*out=*/10));
  std::ifstream keys(test::fixture("sequential_keys.txt"));
  ASSERT_TRUE(keys) << "missing fixture sequential_keys.txt";
  const auto params = net->named_parameters();
  std::string line;
  size_t checked = 0;
  while (std::getline(keys, line)) {
    if (line.empty() || line[0] == '#') {
      continue;
    }
    std::istringstream fields(line);
    std::string name;
    fields >> name;
    std::vector<int64_t> shape;
    for (int64_t d = 0; fields >> d;) {
      shape.push_back(d);
    }
    const torch::Tensor* param = params.find(name);
    ASSERT_NE(param, nullptr) << "dkit::Mlp has no parameter " << name;
    EXPECT_EQ(param->sizes().vec(), shape) << name;
    ++checked;
  }
  EXPECT_EQ(checked, 6u);
  EXPECT_EQ(params.size(), checked);
}

TEST_F(MlpTest, ForwardComputesLinearActivationChain) {
  for (const Activation activation : {Activation::kReLU, Activation::kGELU, Activation::kTanh}) {
    Mlp net(MlpOptions(5, {7}, 3).activation(activation));
    const auto x = torch::randn({4, 5});
    const auto& l0 = net->layers()[0];
    const auto& l1 = net->layers()[1];
    auto h = torch::addmm(l0->bias, x, l0->weight.t());
    h = activation == Activation::kReLU ? torch::relu(h) : activation == Activation::kGELU ? torch::gelu(h) : torch::tanh(h);
    const auto expected = torch::addmm(l1->bias, h, l1->weight.t());
    EXPECT_TRUE(torch::allclose(net->forward(x), expected, 1e-6, 1e-6)) << to_string(activation);
  }
}

TEST_F(MlpTest, NoHiddenLayersIsASingleLinear) {
  Mlp net(MlpOptions(6, {}, 2).bias(false));
  ASSERT_EQ(net->layers().size(), 1u);
  EXPECT_EQ(net->named_parameters().keys(), std::vector<std::string>{"0.weight"});
  const auto x = torch::randn({3, 6});
  EXPECT_TRUE(torch::allclose(net->forward(x), x.matmul(net->layers()[0]->weight.t())));
}

TEST_F(MlpTest, DropoutActsOnlyInTraining) {
  Mlp net(MlpOptions(8, {512}, 4).dropout(0.5));
  const auto x = torch::randn({16, 8});
  net->eval();
  const auto a = net->forward(x);
  EXPECT_TRUE(torch::equal(a, net->forward(x)));
  net->train();
  EXPECT_FALSE(torch::allclose(net->forward(x), a));
  EXPECT_EQ(net->named_parameters().size(), 4u);
}

TEST_F(MlpTest, CloneIsADeepCopyWithTheSameNames) {
  Mlp net(MlpOptions(4, {8, 8}, 2));
  auto copy = std::dynamic_pointer_cast<MlpImpl>(net->clone());
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->named_parameters().keys(), net->named_parameters().keys());
  const auto x = torch::randn({3, 4});
  EXPECT_TRUE(torch::equal(copy->forward(x), net->forward(x)));
  EXPECT_NE(copy->layers()[0]->weight.data_ptr(), net->layers()[0]->weight.data_ptr());
}

TEST_F(MlpTest, PrettyPrintsItsShape) {
  Mlp net(MlpOptions(64, {256, 256}, 10).activation(Activation::kGELU));
  std::ostringstream out;
  out << *net;
  EXPECT_EQ(out.str(),
            "dkit::Mlp(in=64, hidden=[256, 256], out=10, activation=gelu, dropout=0)(\n"
            "  (0): torch::nn::Linear(in_features=64, out_features=256, bias=true)\n"
            "  (2): torch::nn::Linear(in_features=256, out_features=256, bias=true)\n"
            "  (4): torch::nn::Linear(in_features=256, out_features=10, bias=true)\n)");
}

TEST_F(MlpTest, RejectsBadOptions) {
  EXPECT_EQ(error_message([] { Mlp(MlpOptions(0, {4}, 2)); }), "Mlp in_features must be positive, got 0");
  EXPECT_EQ(error_message([] { Mlp(MlpOptions(3, {4, -1}, 2)); }), "Mlp hidden size 1 must be positive, got -1");
  EXPECT_EQ(error_message([] { Mlp(MlpOptions(3, {4}, 0)); }), "Mlp out_features must be positive, got 0");
  EXPECT_EQ(error_message([] { Mlp(MlpOptions(3, {4}, 2).dropout(1.0)); }), "Mlp dropout must be in [0, 1), got 1");
}

TEST_F(MlpTest, ParsesActivationNames) {
  EXPECT_EQ(parse_activation("relu"), Activation::kReLU);
  EXPECT_EQ(parse_activation("gelu"), Activation::kGELU);
  EXPECT_EQ(parse_activation("tanh"), Activation::kTanh);
  EXPECT_EQ(error_message([] { parse_activation("sigmoid"); }),
            "unknown activation 'sigmoid': expected relu, gelu or tanh");
}

TEST_F(MlpTest, RejectsInputOfTheWrongShape) {
  Mlp net(MlpOptions(4, {8}, 2));
  EXPECT_EQ(error_message([&] { net->forward(torch::randn({3, 5})); }), "Mlp expects input of shape [N, 4], got [3, 5]");
}

TEST_F(MlpTest, RejectsInputOnAnotherDevice) {
  Mlp net(MlpOptions(4, {8}, 2));
  EXPECT_EQ(error_message([&] { net->forward(torch::empty({3, 4}, torch::Device(torch::kMeta))); }),
            "expected all tensors on the same device, got input on meta, 0.weight on cpu");
}

TEST_F(MlpTest, PlacesOnTheDeviceTryGpuPicks) {
  Mlp net(MlpOptions(4, {8}, 2));
  place_module(net, try_gpu());
  for (const auto& p : net->parameters()) {
    EXPECT_EQ(p.device(), try_gpu());
  }
}

TEST_F(MlpTest, RunsOnGpu_CUDA) {
  Mlp net(MlpOptions(20, {256}, 10));
  const auto x = torch::randn({32, 20});
  const auto on_cpu = net->forward(x);
  place_module(net, gpu(0));
  const auto on_gpu = net->forward(to_device(x, gpu(0)));
  EXPECT_EQ(on_gpu.device(), gpu(0));
  EXPECT_TRUE(torch::allclose(on_gpu.cpu(), on_cpu, 1e-4, 1e-5));
}

} // namespace
} // namespace dkit

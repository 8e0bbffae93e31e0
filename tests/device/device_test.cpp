#include <dkit/device/device.h>

#include <dkit/config.h>
#include <dkit/device/report.h>

#include "../support.h"

#include <ATen/Parallel.h>

#include <sched.h>

namespace dkit {
namespace {

using test::error_message;

class DeviceTest : public test::SeedingFixture {};

TEST_F(DeviceTest, CpuAndGpuNameTheirDevices) {
  EXPECT_EQ(cpu(), torch::Device(torch::kCPU));
  EXPECT_EQ(gpu(), torch::Device("cuda:0"));
  EXPECT_EQ(gpu(3), torch::Device("cuda:3"));
  EXPECT_EQ(gpu(3).str(), "cuda:3");
}

TEST_F(DeviceTest, WithIndexGivesBareCudaTheFirstGpuAndLeavesOtherDevices) {
  EXPECT_EQ(with_index(Device(c10::DeviceType::CUDA)), gpu(0));
  EXPECT_EQ(with_index(gpu(3)), gpu(3));
  EXPECT_EQ(with_index(cpu()), cpu());
  EXPECT_EQ(with_index(Device("cuda")).str(), "cuda:0");
}

TEST_F(DeviceTest, SetCpuThreadsSetsLibTorchsThreads) {
  const int previous = at::get_num_threads();
  set_cpu_threads(previous == 1 ? 2 : 1);
  const int set = at::get_num_threads();
  at::set_num_threads(previous);
  EXPECT_EQ(set, previous == 1 ? 2 : 1);
  EXPECT_EQ(error_message([] { set_cpu_threads(0); }), "CPU threads must be in [1, 2147483647], got 0");
}

TEST_F(DeviceTest, NumGpusMatchesLibTorch) {
  EXPECT_EQ(num_gpus(), static_cast<int64_t>(torch::cuda::device_count()));
  if (!DKIT_WITH_CUDA) {
    EXPECT_EQ(num_gpus(), 0);
  }
}

TEST_F(DeviceTest, CpuCountIsTheAffinityMask) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(cpu_count(), CPU_COUNT(&set));
  EXPECT_GE(cpu_count(), 1);
}

TEST_F(DeviceTest, TryGpuFallsBackToCpuForMissingIndex) {
  EXPECT_EQ(try_gpu(num_gpus()), cpu());
  EXPECT_EQ(try_gpu(-1), cpu());
  EXPECT_EQ(try_gpu(0), num_gpus() > 0 ? gpu(0) : cpu());
}

TEST_F(DeviceTest, TryAllGpusIsNeverEmpty) {
  const auto devices = try_all_gpus();
  ASSERT_FALSE(devices.empty());
  if (num_gpus() == 0) {
    EXPECT_EQ(devices, std::vector<Device>{cpu()});
  } else {
    ASSERT_EQ(static_cast<int64_t>(devices.size()), num_gpus());
    for (size_t i = 0; i < devices.size(); ++i) {
      EXPECT_EQ(devices[i], gpu(static_cast<int64_t>(i)));
    }
  }
}

TEST_F(DeviceTest, ParsesEverySpelling) {
  EXPECT_EQ(parse_device("cpu"), cpu());
  EXPECT_EQ(parse_device("auto"), try_gpu(0));
  Device device = cpu();
  ASSERT_TRUE(try_parse_device("cuda", device));
  EXPECT_EQ(device, gpu(0));
  ASSERT_TRUE(try_parse_device("cuda:12", device));
  EXPECT_EQ(device, gpu(12));
}

TEST_F(DeviceTest, RejectsMalformedDeviceStrings) {
  for (const char* text : {"gpu", "CPU", "cuda:", "cuda:x", "cuda:-1", "cuda:1x", "cuda0", " cpu", ""}) {
    Device device = cpu();
    EXPECT_FALSE(try_parse_device(text, device)) << text;
    EXPECT_EQ(error_message([&] { parse_device(text); }),
              std::string("invalid device '") + text + "': expected auto, cpu, cuda or cuda:N");
  }
}

TEST_F(DeviceTest, AbsentGpuIsAnErrorListingTheDevicesThatExist) {
  const std::string absent = "cuda:" + std::to_string(num_gpus());
  const std::string message = error_message([&] { parse_device(absent); });
  if (num_gpus() == 0) {
    EXPECT_EQ(message, "device '" + absent + "' is not available: " + cuda_unavailable_reason() +
                           "; available devices: cpu");
  } else {
    EXPECT_EQ(message, "device '" + absent + "' is not available: this process can use " +
                           std::to_string(num_gpus()) + (num_gpus() == 1 ? " GPU" : " GPUs") +
                           "; available devices: " + available_devices());
  }
}

TEST_F(DeviceTest, AbsentGpuErrorOnCpuOnlyBuildSaysWhy) {
  if (DKIT_WITH_CUDA) {
    GTEST_SKIP() << "this build has CUDA";
  }
  EXPECT_EQ(error_message([] { parse_device("cuda"); }),
            "device 'cuda' is not available: this LibTorch was built without CUDA (CPU-only, like Debian's "
            "libtorch-dev); rebuild dkit against a CUDA LibTorch, e.g. -DCMAKE_PREFIX_PATH=$(python3 -c 'import "
            "torch;print(torch.utils.cmake_prefix_path)'); available devices: cpu");
}

TEST_F(DeviceTest, AvailableDevicesAlwaysStartsWithCpu) {
  EXPECT_EQ(available_devices().rfind("cpu", 0), 0u);
  EXPECT_TRUE(is_available(cpu()));
  EXPECT_FALSE(is_available(gpu(num_gpus())));
}

TEST_F(DeviceTest, ToDeviceReturnsTheSameTensorWhenAlreadyThere) {
  const auto z = torch::randn({4, 4});
  const auto same = to_device(z, cpu());
  EXPECT_TRUE(same.is_same(z));
  EXPECT_EQ(same.data_ptr(), z.data_ptr());
}

TEST_F(DeviceTest, ToDeviceCopiesAcrossDevices) {
  const auto z = torch::randn({2, 3});
  const auto meta = to_device(z, torch::Device(torch::kMeta));
  EXPECT_EQ(meta.device().type(), torch::kMeta);
  EXPECT_EQ(meta.sizes(), z.sizes());
}

TEST_F(DeviceTest, CheckSameDeviceNamesEachTensor) {
  const auto x = torch::randn({2, 2});
  const auto w = torch::randn({2, 2});
  EXPECT_NO_THROW(check_same_device({{"input", x}, {"weight", w}}));
  const auto m = torch::empty({2, 2}, torch::Device(torch::kMeta));
  EXPECT_EQ(error_message([&] { check_same_device({{"input", x}, {"weight", w}, {"bias", m}}); }),
            "expected all tensors on the same device, got input on cpu, weight on cpu, bias on meta");
}

TEST_F(DeviceTest, PlaceModuleMovesParametersAndBuffers) {
  torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4));
  place_module(*net, cpu());
  for (const auto& p : net->parameters()) {
    EXPECT_EQ(p.device(), cpu());
  }
  for (const auto& b : net->buffers()) {
    EXPECT_EQ(b.device(), cpu());
  }
}

TEST_F(DeviceTest, PlaceModuleOnAbsentGpuIsAnError) {
  torch::nn::Linear net(3, 4);
  const std::string absent = gpu(num_gpus()).str();
  EXPECT_EQ(error_message([&] { place_module(net, gpu(num_gpus())); }),
            "cannot place module on '" + absent + "': not available; available devices: " + available_devices());
}

TEST_F(DeviceTest, CpuMemoryStatsTrackResidentMemory) {
  const auto before = memory_stats(cpu());
  EXPECT_GT(before.allocated_bytes, 0);
  auto big = torch::ones({64, 1024, 1024}, torch::kUInt8);
  const auto after = memory_stats(cpu());
  EXPECT_GE(after.allocated_bytes, before.allocated_bytes + 60 * 1024 * 1024);
  EXPECT_GE(after.peak_allocated_bytes, after.allocated_bytes);
  EXPECT_NO_THROW(release_cached_memory());
  EXPECT_NO_THROW(reset_peak_memory_stats(cpu()));
}

TEST_F(DeviceTest, MemoryStatsOfAbsentGpuIsAnError) {
  const std::string absent = gpu(num_gpus()).str();
  EXPECT_EQ(error_message([&] { memory_stats(gpu(num_gpus())); }),
            "no memory statistics for '" + absent + "': not available; available devices: " +
                available_devices());
}

TEST_F(DeviceTest, ToDeviceSameTensor_CUDA) {
  const auto z = torch::randn({4, 4}, torch::Device("cuda:0"));
  EXPECT_TRUE(to_device(z, gpu(0)).is_same(z));
  EXPECT_TRUE(to_device(z, torch::Device(torch::kCUDA)).is_same(z));
  const auto host = to_device(z, cpu());
  EXPECT_FALSE(host.is_same(z));
  EXPECT_TRUE(torch::equal(host, z.cpu()));
}

TEST_F(DeviceTest, CheckSameDeviceAcrossCpuAndGpu_CUDA) {
  const auto x = torch::randn({2, 2});
  const auto w = torch::randn({2, 2}, torch::Device("cuda:0"));
  EXPECT_EQ(error_message([&] { check_same_device({{"input", x}, {"weight", w}}); }),
            "expected all tensors on the same device, got input on cpu, weight on cuda:0");
}

TEST_F(DeviceTest, PlaceModuleOnGpu_CUDA) {
  torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4));
  place_module(*net, gpu(0));
  for (const auto& p : net->parameters()) {
    EXPECT_EQ(p.device(), gpu(0));
  }
  for (const auto& b : net->buffers()) {
    EXPECT_EQ(b.device(), gpu(0));
  }
}

TEST_F(DeviceTest, GpuMemoryStatsAndRelease_CUDA) {
  release_cached_memory();
  reset_peak_memory_stats(gpu(0));
  const auto before = memory_stats(gpu(0));
  {
    auto block = torch::empty({64 * 1024 * 1024}, torch::TensorOptions().dtype(torch::kUInt8).device("cuda:0"));
    const auto during = memory_stats(gpu(0));
    EXPECT_GE(during.allocated_bytes, before.allocated_bytes + 64 * 1024 * 1024);
    EXPECT_GE(during.peak_allocated_bytes, during.allocated_bytes);
  }
  const auto cached = memory_stats(gpu(0));
  EXPECT_GE(cached.reserved_bytes, before.reserved_bytes + 64 * 1024 * 1024);
  release_cached_memory();
  EXPECT_LT(memory_stats(gpu(0)).reserved_bytes, cached.reserved_bytes);
}

} // namespace
} // namespace dkit

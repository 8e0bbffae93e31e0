#include <dkit/device/report.h>

#include <dkit/config.h>

#include <torch/version.h>

#include "../support.h"

#include <fstream>
#include <map>
#include <string>

namespace dkit {
namespace {

TEST(CudaProbeTest, ClassifiesEveryCase) {
  CudaProbe probe;
  EXPECT_EQ(classify_cuda(probe), CudaStatus::kNotBuilt);
  probe.built_with_cuda = true;
  EXPECT_EQ(classify_cuda(probe), CudaStatus::kNotLinked);
  probe.cuda_backend_loaded = true;
  EXPECT_EQ(classify_cuda(probe), CudaStatus::kNoDevice);
  probe.device_count = 2;
  EXPECT_EQ(classify_cuda(probe), CudaStatus::kAvailable);
  EXPECT_EQ(explain_cuda(probe), "");
}

TEST(CudaProbeTest, ExplainsAMissingLinkOfLibtorchCuda) {
  CudaProbe probe;
  probe.built_with_cuda = true;
  EXPECT_EQ(explain_cuda(probe),
            "dkit was built against a CUDA LibTorch but libtorch_cuda.so is not loaded: the linker dropped it "
            "(--as-needed); link the program with -Wl,--no-as-needed,-ltorch_cuda -Wl,--as-needed");
}

TEST(CudaProbeTest, ExplainsHiddenDevices) {
  CudaProbe probe;
  probe.built_with_cuda = true;
  probe.cuda_backend_loaded = true;
  probe.visible_devices = "";
  EXPECT_EQ(explain_cuda(probe), "LibTorch has CUDA, but CUDA_VISIBLE_DEVICES='' hides every GPU");
  probe.visible_devices = "-1";
  EXPECT_EQ(explain_cuda(probe), "LibTorch has CUDA, but CUDA_VISIBLE_DEVICES='-1' hides every GPU");
}

TEST(CudaProbeTest, ExplainsAMissingDriver) {
  CudaProbe probe;
  probe.built_with_cuda = true;
  probe.cuda_backend_loaded = true;
  probe.runtime_error = "CUDA driver version is insufficient for CUDA runtime version";
  EXPECT_EQ(explain_cuda(probe),
            "LibTorch has CUDA, but no GPU is visible (CUDA runtime: CUDA driver version is insufficient for CUDA "
            "runtime version): is the NVIDIA driver installed, and was the container started with --gpus all?");
}

TEST(CudaProbeTest, ProbeOfThisProcessAgreesWithTheBuild) {
  const CudaProbe probe = probe_cuda();
  EXPECT_EQ(probe.built_with_cuda, DKIT_WITH_CUDA == 1);
  EXPECT_EQ(probe.device_count, num_gpus());
  EXPECT_EQ(cuda_unavailable_reason().empty(), num_gpus() > 0);
}

TEST(BlasTest, IdentifiesOpenBlasThroughDebianAlternatives) {
  const std::vector<LoadedLibrary> libraries = {
      {"/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6"},
      {"/lib/x86_64-linux-gnu/libblas.so.3", "/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3"},
  };
  const BlasInfo info = identify_blas(libraries, "", false);
  EXPECT_EQ(info.name, "OpenBLAS");
  EXPECT_EQ(info.path, "/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3");
  EXPECT_FALSE(info.is_reference);
}

TEST(BlasTest, IdentifiesTheReferenceBlas) {
  const std::vector<LoadedLibrary> libraries = {
      {"/lib/x86_64-linux-gnu/libblas.so.3", "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3"},
  };
  const BlasInfo info = identify_blas(libraries, "", false);
  EXPECT_EQ(info.name, "reference BLAS");
  EXPECT_TRUE(info.is_reference);
}

TEST(BlasTest, OpenBlasConfigWinsAndMklIsTheFallback) {
  const std::vector<LoadedLibrary> libraries = {{"/opt/lib/libblas.so.3", "/opt/lib/libblas.so.3"}};
  const BlasInfo openblas = identify_blas(libraries, "OpenBLAS 0.3.21 DYNAMIC_ARCH", false);
  EXPECT_EQ(openblas.name, "OpenBLAS");
  EXPECT_EQ(openblas.detail, "OpenBLAS 0.3.21 DYNAMIC_ARCH");
  EXPECT_EQ(identify_blas({}, "", true).name, "MKL");
  EXPECT_EQ(identify_blas({}, "", false).name, "unknown");
}

TEST(BlasTest, WarnsAboutTheReferenceBlasAndOversubscription) {
  BlasInfo reference;
  reference.name = "reference BLAS";
  reference.path = "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3";
  reference.is_reference = true;
  const auto warnings = performance_warnings(reference, 2, 2, /*cpu_avx512=*/false);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0],
            "the reference BLAS (/usr/lib/x86_64-linux-gnu/blas/libblas.so.3) is loaded: CPU matrix products run "
            "about 10x slower; install OpenBLAS with 'apt-get install libopenblas0-openmp'");

  BlasInfo pthreads;
  pthreads.name = "OpenBLAS";
  pthreads.threading = "pthreads";
  pthreads.threads = 8;
  const auto oversubscribed = performance_warnings(pthreads, 8, 4, /*cpu_avx512=*/false);
  ASSERT_EQ(oversubscribed.size(), 2u);
  EXPECT_EQ(oversubscribed[0],
            "OpenBLAS runs its own 8 pthreads beside LibTorch's 8 OpenMP threads, which oversubscribes the CPU; "
            "install libopenblas0-openmp or set OPENBLAS_NUM_THREADS=1");
  EXPECT_EQ(oversubscribed[1],
            "LibTorch uses 8 threads but this process may run on 4 CPUs; set OMP_NUM_THREADS=4");

  BlasInfo openmp;
  openmp.name = "OpenBLAS";
  openmp.threading = "OpenMP";
  openmp.threads = 2;
  EXPECT_TRUE(performance_warnings(openmp, 2, 2, /*cpu_avx512=*/false).empty());
  const auto underused = performance_warnings(openmp, 1, 2, /*cpu_avx512=*/false);
  ASSERT_EQ(underused.size(), 1u);
  EXPECT_EQ(underused[0], "LibTorch uses 1 of the 2 CPUs this process may run on; set OMP_NUM_THREADS=2 to use them all");
}

// OPENBLAS_CORETYPE=Haswell (as this project's machines set it) makes OpenBLAS run its AVX2 kernels on an AVX-512
// CPU; an OpenBLAS older than the CPU may pick them itself, and a DYNAMIC_ARCH build runs its AVX-512 ones when told.
TEST(BlasTest, WarnsWhenOpenBlasRunsKernelsNarrowerThanTheCpu) {
  BlasInfo haswell;
  haswell.name = "OpenBLAS";
  haswell.threading = "OpenMP";
  haswell.threads = 2;
  haswell.detail = "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY USE_OPENMP Haswell MAX_THREADS=64";
  haswell.core = "Haswell";
  const auto warnings = performance_warnings(haswell, 2, 2, /*cpu_avx512=*/true);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0],
            "OpenBLAS picked its Haswell kernels for this CPU, which has AVX-512 (an OpenBLAS older than the CPU does "
            "not know it); set OPENBLAS_CORETYPE=SkylakeX to run its AVX-512 kernels");
  BlasInfo told = haswell;
  told.core_from_environment = "Haswell";
  const auto told_warnings = performance_warnings(told, 2, 2, /*cpu_avx512=*/true);
  ASSERT_EQ(told_warnings.size(), 1u);
  EXPECT_EQ(told_warnings[0],
            "OPENBLAS_CORETYPE=Haswell in the environment makes OpenBLAS run its Haswell kernels on this CPU, which "
            "has AVX-512: matrix products run slower than with its AVX-512 kernels; unset it unless you need those "
            "kernels");
  EXPECT_TRUE(performance_warnings(haswell, 2, 2, /*cpu_avx512=*/false).empty());
  BlasInfo skylakex = haswell;
  skylakex.core = "SkylakeX";
  EXPECT_TRUE(performance_warnings(skylakex, 2, 2, /*cpu_avx512=*/true).empty());
  BlasInfo one_core = haswell;
  one_core.detail = "OpenBLAS 0.3.21 NO_LAPACKE USE_OPENMP Haswell MAX_THREADS=64";
  EXPECT_TRUE(performance_warnings(one_core, 2, 2, /*cpu_avx512=*/true).empty())
      << "without DYNAMIC_ARCH, OPENBLAS_CORETYPE changes nothing";
}

// The kernel's view of the CPU, /proc/cpuinfo's flags, against dkit's CPUID reading.
TEST(DeviceReportTest, Float16ArithmeticIsWhatCpuinfoListsAsAvx512Fp16OrAmxFp16) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string flags;
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("flags", 0) == 0) {
      flags = line.substr(line.find(':') + 1) + " ";
      break;
    }
  }
  if (flags.empty()) {
    GTEST_SKIP() << "no flags line in /proc/cpuinfo";
  }
  const bool listed = flags.find(" avx512_fp16 ") != std::string::npos || flags.find(" amx_fp16 ") != std::string::npos;
  EXPECT_EQ(cpu_has_float16_arithmetic(), listed) << flags;
}

TEST(DeviceReportTest, DescribesThisProcess) {
  const DeviceReport report = device_report();
  EXPECT_EQ(report.dkit_version, DKIT_VERSION);
  EXPECT_EQ(report.torch_version, TORCH_VERSION);
  EXPECT_EQ(report.cuda_status == CudaStatus::kAvailable, num_gpus() > 0);
  EXPECT_EQ(static_cast<int64_t>(report.gpus.size()), num_gpus());
  EXPECT_EQ(report.cpu_threads, at::get_num_threads());
  EXPECT_GT(report.cpus_available, 0);
  EXPECT_FALSE(report.blas.name.empty());
  EXPECT_EQ(report.cpu_avx512, cpu_has_avx512());
  if (report.blas.name == "OpenBLAS") {
    EXPECT_NE(report.blas.detail.find(report.blas.core), std::string::npos)
        << "openblas_get_config() names the kernels openblas_get_corename() does";
  }
  ASSERT_FALSE(report.capabilities.empty());
  EXPECT_EQ(report.capabilities[0].name, "cuda");
}

TEST(DeviceReportTest, ListsWhatTheBuildOffersForSeveralProcessesAndGpus) {
  const DeviceReport report = device_report();
  std::map<std::string, Capability> found;
  for (const auto& capability : report.capabilities) {
    found[capability.name] = capability;
  }
  ASSERT_EQ(found.count("gloo"), 1u);
  ASSERT_EQ(found.count("nccl"), 1u);
  ASSERT_EQ(found.count("data_parallel"), 1u);
  ASSERT_EQ(found.count("openmp"), 1u);
  EXPECT_EQ(found["openmp"].available, DKIT_WITH_OPENMP == 1);
  EXPECT_EQ(found["gloo"].available, DKIT_WITH_GLOO == 1);
  EXPECT_EQ(found["nccl"].available, DKIT_WITH_NCCL == 1);
  EXPECT_EQ(found["data_parallel"].available, DKIT_WITH_DATA_PARALLEL == 1);
  for (const auto& [name, capability] : found) {
    EXPECT_FALSE(capability.note.empty()) << name;
  }
  const std::string text = format_report(report);
  EXPECT_NE(text.find(std::string("gloo ") + (DKIT_WITH_GLOO ? "yes" : "no")), std::string::npos) << text;
  EXPECT_NE(text.find(std::string("data_parallel ") + (DKIT_WITH_DATA_PARALLEL ? "yes" : "no")), std::string::npos)
      << text;
}

TEST(DeviceReportTest, TextReportSaysWhyCudaIsUnavailable) {
  const DeviceReport report = device_report();
  const std::string text = format_report(report);
  EXPECT_NE(text.find("LibTorch " + report.torch_version), std::string::npos);
  EXPECT_NE(text.find("BLAS   " + report.blas.name), std::string::npos);
  if (num_gpus() == 0) {
    EXPECT_NE(text.find("CUDA   not available: " + report.cuda_reason), std::string::npos);
  }
}

TEST(DeviceReportTest, JsonReportCarriesTheSameFacts) {
  DeviceReport report;
  report.dkit_version = "9.9.9";
  report.torch_version = "1.13.0";
  report.cuda_status = CudaStatus::kNoDevice;
  report.cuda_reason = "none";
  report.blas.name = "OpenBLAS";
  report.blas.core = "Haswell";
  report.cpu_avx512 = true;
  report.capabilities.push_back({"cuda", true, ""});
  GpuInfo gpu_info;
  gpu_info.index = 0;
  gpu_info.name = "Test GPU";
  gpu_info.major = 9;
  report.gpus.push_back(gpu_info);
  report.warnings.push_back("careful");
  const std::string json = report_to_json(report);
  EXPECT_NE(json.find(R"("cuda_status":"no_device")"), std::string::npos);
  EXPECT_NE(json.find(R"("capabilities":{"cuda":true})"), std::string::npos);
  EXPECT_NE(json.find(R"("name":"Test GPU","compute_capability":"9.0")"), std::string::npos);
  EXPECT_NE(json.find(R"("warnings":["careful"])"), std::string::npos);
  EXPECT_NE(json.find(R"("avx512":true)"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("core":"Haswell")"), std::string::npos) << json;
}

TEST(DeviceReportTest, JsonReportEscapesTextAndReplacesBytesThatAreNotUtf8) {
  DeviceReport report;
  report.blas.path = "/opt/\xff/libblas.so";
  report.warnings.push_back("a\"b\\c\nd\t\x01");
  const std::string json = report_to_json(report);
  EXPECT_NE(json.find("\"path\":\"/opt/\xEF\xBF\xBD/libblas.so\""), std::string::npos) << json;
  EXPECT_NE(json.find(R"("warnings":["a\"b\\c\nd\t\u0001"])"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("capabilities":{},"gpus":[])"), std::string::npos) << json;
}

TEST(DeviceReportTest, LinesOfOtherModulesFollowTheCapabilitiesAndBecomeJsonObjects) {
  DeviceReport report;
  report.capabilities.push_back({"cuda", false, ""});
  report.extras.push_back({"Optim", "fused_updates", "fused CPU updates", {{"sgd", "fma"}, {"adam", "none"}}});
  report.warnings.push_back("careful");
  const std::string text = format_report(report);
  EXPECT_NE(text.find("Build  cuda no\nOptim  fused CPU updates\n\nwarning: careful\n"), std::string::npos) << text;
  const std::string json = report_to_json(report);
  EXPECT_NE(json.find(R"("gpus":[],"fused_updates":{"sgd":"fma","adam":"none"},"warnings":["careful"]})"),
            std::string::npos)
      << json;
}

TEST(DeviceReportTest, ListsGpus_CUDA) {
  const DeviceReport report = device_report();
  ASSERT_EQ(static_cast<int64_t>(report.gpus.size()), num_gpus());
  EXPECT_FALSE(report.cuda_version.empty());
  for (const auto& gpu_info : report.gpus) {
    EXPECT_FALSE(gpu_info.name.empty());
    EXPECT_GT(gpu_info.multiprocessors, 0);
    EXPECT_GT(gpu_info.total_memory, 0);
    EXPECT_LE(gpu_info.free_memory, gpu_info.total_memory);
  }
}

} // namespace
} // namespace dkit

#include <dkit/device/report.h>

#include <dkit/config.h>
#include <dkit/core/compat.h>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <dlfcn.h>
#include <link.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

#include <climits>
#include <cstdlib>
#include <iomanip>
#include <sstream>

#if DKIT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace dkit {
namespace {

std::string resolve(const std::string& path) {
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf) == nullptr) {
    return path;
  }
  return buf;
}

std::string basename_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string format_version(long version) {
  if (version <= 0) {
    return "";
  }
  if (version >= 1000) {
    return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
  }
  return std::to_string(version);
}

std::string format_cudnn_version(long version) {
  if (version <= 0) {
    return "";
  }
  const long major = version >= 10000 ? version / 10000 : version / 1000;
  const long rest = version >= 10000 ? version % 10000 : version % 1000;
  return std::to_string(major) + "." + std::to_string(rest / 100) + "." + std::to_string(rest % 100);
}

template <typename Fn>
Fn find_symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

std::string mib(int64_t bytes) {
  std::ostringstream out;
  out << bytes / (1024 * 1024) << " MiB";
  return out.str();
}

std::vector<Capability> build_capabilities() {
  std::vector<Capability> capabilities;
  capabilities.push_back({"cuda", DKIT_WITH_CUDA == 1,
                          DKIT_WITH_CUDA ? "built against a CUDA LibTorch" : "built against a CPU-only LibTorch"});
  capabilities.push_back({"gloo", DKIT_WITH_GLOO == 1,
                          DKIT_WITH_GLOO ? "c10d's Gloo backend: multi-process training on the CPU (torchrun)"
                                         : "this LibTorch has no c10d Gloo backend, or Gloo's headers were missing"});
  capabilities.push_back({"nccl", DKIT_WITH_NCCL == 1,
                          DKIT_WITH_NCCL ? "c10d's NCCL backend: multi-process training on GPUs (torchrun)"
                          : DKIT_WITH_CUDA
                              ? "this LibTorch has no c10d NCCL backend, or nccl.h was missing"
                              : "needs a CUDA LibTorch"});
  capabilities.push_back({"openmp", DKIT_WITH_OPENMP == 1,
                          DKIT_WITH_OPENMP ? "dkit's own kernels (the fused optimizers' updates) run on LibTorch's intra-op "
                                             "threads"
                                           : "dkit's own kernels run on one thread: LibTorch does not use OpenMP, "
                                             "the compiler is not GCC, or DKIT_OPENMP is OFF"});
  capabilities.push_back({"data_parallel", data_parallel_available(),
                          data_parallel_available()
                              ? "torch::nn::parallel::data_parallel: one process on several GPUs (dist.data_parallel)"
                              : data_parallel_unavailable_reason()});
  return capabilities;
}

} // namespace

CudaProbe probe_cuda() {
  CudaProbe probe;
  probe.built_with_cuda = DKIT_WITH_CUDA == 1;
  probe.cuda_backend_loaded = at::hasCUDA();
  probe.device_count = static_cast<int64_t>(torch::cuda::device_count());
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    probe.visible_devices = visible;
  }
#if DKIT_WITH_CUDA
  if (probe.device_count == 0) {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      probe.runtime_error = cudaGetErrorString(status);
      (void)cudaGetLastError();
    }
  }
#endif
  return probe;
}

CudaStatus classify_cuda(const CudaProbe& probe) {
  if (!probe.built_with_cuda) {
    return CudaStatus::kNotBuilt;
  }
  if (!probe.cuda_backend_loaded) {
    return CudaStatus::kNotLinked;
  }
  if (probe.device_count == 0) {
    return CudaStatus::kNoDevice;
  }
  return CudaStatus::kAvailable;
}

std::string explain_cuda(const CudaProbe& probe) {
  switch (classify_cuda(probe)) {
    case CudaStatus::kAvailable:
      return "";
    case CudaStatus::kNotBuilt:
      return "this LibTorch was built without CUDA (CPU-only, like Debian's libtorch-dev); rebuild dkit against a "
             "CUDA LibTorch, e.g. -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')";
    case CudaStatus::kNotLinked:
      return "dkit was built against a CUDA LibTorch but libtorch_cuda.so is not loaded: the linker dropped it "
             "(--as-needed); link the program with -Wl,--no-as-needed,-ltorch_cuda -Wl,--as-needed";
    case CudaStatus::kNoDevice:
      break;
  }
  if (probe.visible_devices && (probe.visible_devices->empty() || *probe.visible_devices == "-1")) {
    return "LibTorch has CUDA, but CUDA_VISIBLE_DEVICES='" + *probe.visible_devices + "' hides every GPU";
  }
  std::string reason = "LibTorch has CUDA, but no GPU is visible";
  if (!probe.runtime_error.empty()) {
    reason += " (CUDA runtime: " + probe.runtime_error + ")";
  }
  if (probe.visible_devices) {
    reason += "; CUDA_VISIBLE_DEVICES='" + *probe.visible_devices + "'";
  }
  return reason + ": is the NVIDIA driver installed, and was the container started with --gpus all?";
}

std::string cuda_unavailable_reason() {
  return explain_cuda(probe_cuda());
}

std::vector<LoadedLibrary> loaded_libraries() {
  std::vector<LoadedLibrary> libraries;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* out = static_cast<std::vector<LoadedLibrary>*>(data);
        if (info->dlpi_name != nullptr && info->dlpi_name[0] != '\0') {
          out->push_back({info->dlpi_name, resolve(info->dlpi_name)});
        }
        return 0;
      },
      &libraries);
  return libraries;
}

BlasInfo identify_blas(const std::vector<LoadedLibrary>& libraries, const std::string& openblas_config,
                       bool has_mkl) {
  BlasInfo info;
  info.name = "unknown";
  for (const auto& library : libraries) {
    const std::string file = basename_of(library.resolved);
    const std::string name = basename_of(library.path);
    if (starts_with(name, "libblas.so") || starts_with(file, "libopenblas") || starts_with(file, "libblis") ||
        starts_with(file, "libmkl_rt") || starts_with(file, "libmkl_core")) {
      info.path = library.resolved;
      if (contains(library.resolved, "openblas") || !openblas_config.empty()) {
        info.name = "OpenBLAS";
      } else if (starts_with(file, "libblis") || contains(library.resolved, "/blis")) {
        info.name = "BLIS";
      } else if (starts_with(file, "libmkl")) {
        info.name = "MKL";
      } else if (contains(library.resolved, "/blas/libblas.so")) {
        info.name = "reference BLAS";
        info.is_reference = true;
      }
      if (starts_with(name, "libblas.so")) {
        break;
      }
    }
  }
  if (!openblas_config.empty()) {
    info.name = "OpenBLAS";
    info.is_reference = false;
    info.detail = openblas_config;
  }
  if (info.name == "unknown" && has_mkl) {
    info.name = "MKL";
    info.path = "linked into LibTorch";
  }
  return info;
}

BlasInfo blas_info() {
  using ConfigFn = char* (*)();
  using IntFn = int (*)();
  const auto config = find_symbol<ConfigFn>("openblas_get_config");
  BlasInfo info = identify_blas(loaded_libraries(), config != nullptr ? config() : "", at::hasMKL());
  if (info.name == "OpenBLAS") {
    if (const auto parallel = find_symbol<IntFn>("openblas_get_parallel")) {
      static const char* const kModes[] = {"sequential", "pthreads", "OpenMP"};
      const int mode = parallel();
      info.threading = mode >= 0 && mode <= 2 ? kModes[mode] : "unknown";
    }
    if (const auto threads = find_symbol<IntFn>("openblas_get_num_threads")) {
      info.threads = threads();
    }
    if (const auto core = find_symbol<ConfigFn>("openblas_get_corename")) {
      info.core = core();
    }
    if (const char* coretype = std::getenv("OPENBLAS_CORETYPE")) {
      info.core_from_environment = coretype;
    }
  } else if (info.name == "MKL") {
    info.threading = at::hasOpenMP() ? "OpenMP" : "unknown";
  } else if (info.is_reference) {
    info.threading = "sequential";
    info.threads = 1;
  }
  return info;
}

std::vector<std::string> performance_warnings(const BlasInfo& blas, int torch_threads, int cpus_available,
                                              bool cpu_avx512) {
  std::vector<std::string> warnings;
  if (blas.is_reference) {
    warnings.push_back("the reference BLAS (" + blas.path +
                       ") is loaded: CPU matrix products run about 10x slower; install OpenBLAS with "
                       "'apt-get install libopenblas0-openmp'");
  }
  if (blas.threading == "pthreads" && torch_threads > 1 && blas.threads > 1) {
    warnings.push_back("OpenBLAS runs its own " + std::to_string(blas.threads) + " pthreads beside LibTorch's " +
                       std::to_string(torch_threads) +
                       " OpenMP threads, which oversubscribes the CPU; install libopenblas0-openmp or set "
                       "OPENBLAS_NUM_THREADS=1");
  }
  const bool avx512_core = blas.core == "SkylakeX" || blas.core == "Cooperlake" || blas.core == "SapphireRapids";
  if (cpu_avx512 && blas.name == "OpenBLAS" && !blas.core.empty() && !avx512_core &&
      contains(blas.detail, "DYNAMIC_ARCH")) {
    if (!blas.core_from_environment.empty()) {
      warnings.push_back("OPENBLAS_CORETYPE=" + blas.core_from_environment + " in the environment makes OpenBLAS run its " +
                         blas.core + " kernels on this CPU, which has AVX-512: matrix products run slower than with its "
                         "AVX-512 kernels; unset it unless you need those kernels");
    } else {
      warnings.push_back("OpenBLAS picked its " + blas.core +
                         " kernels for this CPU, which has AVX-512 (an OpenBLAS older than the CPU does not know it); "
                         "set OPENBLAS_CORETYPE=SkylakeX to run its AVX-512 kernels");
    }
  }
  if (cpus_available > 0 && torch_threads < cpus_available) {
    warnings.push_back("LibTorch uses " + std::to_string(torch_threads) + " of the " + std::to_string(cpus_available) +
                       " CPUs this process may run on; set OMP_NUM_THREADS=" + std::to_string(cpus_available) +
                       " to use them all");
  }
  if (cpus_available > 0 && torch_threads > cpus_available) {
    warnings.push_back("LibTorch uses " + std::to_string(torch_threads) + " threads but this process may run on " +
                       std::to_string(cpus_available) + " CPUs; set OMP_NUM_THREADS=" +
                       std::to_string(cpus_available));
  }
  return warnings;
}

bool cpu_has_avx512() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

bool cpu_has_float16_arithmetic() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  unsigned int eax = 0;
  unsigned int ebx = 0;
  unsigned int ecx = 0;
  unsigned int edx = 0;
  if (!cpu_has_avx512() || __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) {
    return false;
  }
  const bool avx512_fp16 = ((edx >> 23) & 1U) != 0;
  if (avx512_fp16) {
    return true;
  }
  if (eax < 1 || __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) == 0) {
    return false;
  }
  return ((eax >> 21) & 1U) != 0;
#else
  return false;
#endif
}

DeviceReport device_report() {
  DeviceReport report;
  report.dkit_version = DKIT_VERSION;
  report.torch_version = TORCH_VERSION;
  const CudaProbe probe = probe_cuda();
  report.cuda_status = classify_cuda(probe);
  report.cuda_reason = explain_cuda(probe);
  if (probe.cuda_backend_loaded) {
    const auto& hooks = at::detail::getCUDAHooks();
    report.cuda_version = format_version(hooks.versionCUDART());
    if (hooks.hasCuDNN()) {
      report.cudnn_version = format_cudnn_version(hooks.versionCuDNN());
    }
  }
  report.cpu_threads = at::get_num_threads();
  report.interop_threads = at::get_num_interop_threads();
  report.cpus_available = cpu_count();
  report.blas = blas_info();
  report.capabilities = build_capabilities();
  report.cpu_avx512 = cpu_has_avx512();
  report.warnings = performance_warnings(report.blas, report.cpu_threads, report.cpus_available, report.cpu_avx512);
#if DKIT_WITH_CUDA
  for (int64_t i = 0; i < probe.device_count; ++i) {
    const cudaDeviceProp* props = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(i));
    GpuInfo gpu_info;
    gpu_info.index = i;
    gpu_info.name = props->name;
    gpu_info.major = props->major;
    gpu_info.minor = props->minor;
    gpu_info.multiprocessors = props->multiProcessorCount;
    gpu_info.total_memory = static_cast<int64_t>(props->totalGlobalMem);
    {
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(i));
      size_t free_bytes = 0;
      size_t total_bytes = 0;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
        gpu_info.free_memory = static_cast<int64_t>(free_bytes);
      } else {
        (void)cudaGetLastError();
      }
    }
    gpu_info.process = memory_stats(gpu(i));
    report.gpus.push_back(gpu_info);
  }
#endif
  return report;
}

const char* to_string(CudaStatus status) {
  switch (status) {
    case CudaStatus::kAvailable: return "available";
    case CudaStatus::kNotBuilt: return "not_built";
    case CudaStatus::kNotLinked: return "not_linked";
    case CudaStatus::kNoDevice: return "no_device";
  }
  return "unknown";
}

std::string format_report(const DeviceReport& report) {
  std::ostringstream out;
  out << "dkit " << report.dkit_version << " on LibTorch " << report.torch_version;
  if (!report.cuda_version.empty()) {
    out << ", CUDA " << report.cuda_version;
  }
  if (!report.cudnn_version.empty()) {
    out << ", cuDNN " << report.cudnn_version;
  }
  out << "\n\n";
  out << "CPU    " << report.cpu_threads << " intra-op threads, " << report.interop_threads
      << " inter-op threads, " << report.cpus_available << " CPUs available" << (report.cpu_avx512 ? ", AVX-512" : "")
      << "\n";
  out << "BLAS   " << report.blas.name;
  if (!report.blas.path.empty()) {
    out << " (" << report.blas.path << ")";
  }
  out << ", threading: " << report.blas.threading;
  if (report.blas.threads > 0) {
    out << ", " << report.blas.threads << " threads";
  }
  out << "\n";
  if (!report.blas.detail.empty()) {
    out << "       " << report.blas.detail << "\n";
  }
  out << "CUDA   ";
  if (report.cuda_status == CudaStatus::kAvailable) {
    out << report.gpus.size() << (report.gpus.size() == 1 ? " GPU" : " GPUs") << " available\n";
  } else {
    out << "not available: " << report.cuda_reason << "\n";
  }
  out << "Build  ";
  for (size_t i = 0; i < report.capabilities.size(); ++i) {
    const auto& capability = report.capabilities[i];
    out << (i == 0 ? "" : ", ") << capability.name << (capability.available ? " yes" : " no");
  }
  out << "\n";
  for (const auto& extra : report.extras) {
    out << std::left << std::setw(7) << extra.label << std::right << extra.text << "\n";
  }
  if (!report.gpus.empty()) {
    out << "\n"
        << std::left << std::setw(4) << "GPU" << std::setw(28) << "Name" << std::setw(5) << "CC" << std::right
        << std::setw(5) << "SMs" << std::setw(12) << "Total" << std::setw(12) << "Free" << std::setw(12)
        << "Allocated" << std::setw(12) << "Reserved" << "\n";
    for (const auto& gpu_info : report.gpus) {
      out << std::left << std::setw(4) << gpu_info.index << std::setw(28) << gpu_info.name.substr(0, 27)
          << std::setw(5) << (std::to_string(gpu_info.major) + "." + std::to_string(gpu_info.minor)) << std::right
          << std::setw(5) << gpu_info.multiprocessors << std::setw(12) << mib(gpu_info.total_memory)
          << std::setw(12) << mib(gpu_info.free_memory) << std::setw(12) << mib(gpu_info.process.allocated_bytes)
          << std::setw(12) << mib(gpu_info.process.reserved_bytes) << "\n";
    }
  }
  for (const auto& warning : report.warnings) {
    out << "\nwarning: " << warning;
  }
  if (!report.warnings.empty()) {
    out << "\n";
  }
  return out.str();
}

std::string report_to_json(const DeviceReport& report) {
  nlohmann::ordered_json capabilities = nlohmann::ordered_json::object();
  for (const auto& capability : report.capabilities) {
    capabilities[capability.name] = capability.available;
  }
  nlohmann::ordered_json gpus = nlohmann::ordered_json::array();
  for (const auto& gpu_info : report.gpus) {
    gpus.push_back({{"index", gpu_info.index},
                    {"name", gpu_info.name},
                    {"compute_capability", std::to_string(gpu_info.major) + "." + std::to_string(gpu_info.minor)},
                    {"multiprocessors", gpu_info.multiprocessors},
                    {"total_memory_bytes", gpu_info.total_memory},
                    {"free_memory_bytes", gpu_info.free_memory},
                    {"allocated_bytes", gpu_info.process.allocated_bytes},
                    {"reserved_bytes", gpu_info.process.reserved_bytes},
                    {"peak_allocated_bytes", gpu_info.process.peak_allocated_bytes}});
  }
  nlohmann::ordered_json json = {
      {"dkit_version", report.dkit_version},
      {"torch_version", report.torch_version},
      {"cuda_version", report.cuda_version},
      {"cudnn_version", report.cudnn_version},
      {"cuda_status", to_string(report.cuda_status)},
      {"cuda_reason", report.cuda_reason},
      {"cpu",
       {{"intra_op_threads", report.cpu_threads},
        {"inter_op_threads", report.interop_threads},
        {"cpus_available", report.cpus_available},
        {"avx512", report.cpu_avx512}}},
      {"blas",
       {{"name", report.blas.name},
        {"path", report.blas.path},
        {"detail", report.blas.detail},
        {"core", report.blas.core},
        {"threading", report.blas.threading},
        {"threads", report.blas.threads},
        {"reference", report.blas.is_reference}}},
      {"capabilities", std::move(capabilities)},
      {"gpus", std::move(gpus)}};
  for (const auto& extra : report.extras) {
    nlohmann::ordered_json fields = nlohmann::ordered_json::object();
    for (const auto& [name, value] : extra.fields) {
      fields[name] = value;
    }
    json[extra.key] = std::move(fields);
  }
  json["warnings"] = report.warnings;
  return json.dump(/*indent=*/-1, /*indent_char=*/' ', /*ensure_ascii=*/false,
                   nlohmann::ordered_json::error_handler_t::replace) +
         "\n";
}

} // namespace dkit

#pragma once

#include <dkit/device/device.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dkit {

/// Why CUDA can or cannot be used in this process.
enum class CudaStatus {
  /// At least one GPU can be used.
  kAvailable,
  /// The LibTorch dkit was built against has no CUDA (a CPU-only build such as Debian's libtorch-dev).
  kNotBuilt,
  /// dkit was built against a CUDA LibTorch, but libtorch_cuda is not loaded: the linker dropped it.
  kNotLinked,
  /// CUDA is built in and loaded, but no device is visible (driver missing, `CUDA_VISIBLE_DEVICES`, ...).
  kNoDevice,
};

/// The facts that decide CudaStatus, gathered by probe_cuda() and kept apart so that every case can be tested
/// on any machine.
struct CudaProbe {
  /// dkit was compiled against a LibTorch with CUDA.
  bool built_with_cuda = false;
  /// LibTorch's CUDA backend registered itself in this process (libtorch_cuda is loaded).
  bool cuda_backend_loaded = false;
  /// Devices visible to this process.
  int64_t device_count = 0;
  /// What the CUDA runtime said when asked for the device count, when it failed.
  std::string runtime_error;
  /// The value of `CUDA_VISIBLE_DEVICES`, when set.
  std::optional<std::string> visible_devices;
};

/// Gathers the CudaProbe facts for this process.
CudaProbe probe_cuda();

/// Decides the CudaStatus from the facts.
CudaStatus classify_cuda(const CudaProbe& probe);

/// One sentence saying why CUDA cannot be used, and what to do about it; empty when it can.
std::string explain_cuda(const CudaProbe& probe);

/// explain_cuda(probe_cuda()): why this process cannot use CUDA, or an empty string.
std::string cuda_unavailable_reason();

/// The BLAS library LibTorch calls for CPU matrix products.
struct BlasInfo {
  /// Short name: `OpenBLAS`, `reference BLAS`, `MKL`, `BLIS` or `unknown`.
  std::string name;
  /// The library file actually loaded, with symbolic links (Debian's alternatives) resolved.
  std::string path;
  /// OpenBLAS's own description (version, kernel, threading), when it is OpenBLAS.
  std::string detail;
  /// The kernels OpenBLAS runs (`openblas_get_corename()`), e.g. `Haswell` or `SkylakeX`; empty for another BLAS.
  std::string core;
  /// `OPENBLAS_CORETYPE` as this process's environment sets it, which names the kernels a DYNAMIC_ARCH OpenBLAS
  /// runs instead of those it would pick for the CPU; empty when unset.
  std::string core_from_environment;
  /// How the library runs in parallel: `OpenMP`, `pthreads`, `sequential` or `unknown`.
  std::string threading = "unknown";
  /// Threads the BLAS itself will use; 0 when unknown.
  int threads = 0;
  /// The slow netlib reference implementation.
  bool is_reference = false;
};

/// A loaded shared library: the path the loader used and the file it resolves to.
struct LoadedLibrary {
  /// Path as the dynamic loader recorded it.
  std::string path;
  /// The same path with every symbolic link resolved.
  std::string resolved;
};

/// Every shared library loaded in this process.
std::vector<LoadedLibrary> loaded_libraries();

/// Works out which BLAS is in use from the loaded libraries. `openblas_config` is `openblas_get_config()`'s
/// text when that symbol exists, `has_mkl` whether LibTorch itself was built with MKL.
BlasInfo identify_blas(const std::vector<LoadedLibrary>& libraries, const std::string& openblas_config,
                       bool has_mkl);

/// identify_blas() for this process, with OpenBLAS's threading model and thread count filled in.
BlasInfo blas_info();

/// One GPU as `dkit devices` shows it.
struct GpuInfo {
  /// Device index, as in `cuda:N`.
  int64_t index = 0;
  /// Marketing name, e.g. `NVIDIA H100 80GB HBM3`.
  std::string name;
  /// Compute capability, major part.
  int major = 0;
  /// Compute capability, minor part.
  int minor = 0;
  /// Streaming multiprocessors.
  int multiprocessors = 0;
  /// Device memory in bytes.
  int64_t total_memory = 0;
  /// Free device memory in bytes, as the driver reports it.
  int64_t free_memory = 0;
  /// This process's use of the device through LibTorch's caching allocator.
  MemoryStats process;
};

/// A build-time capability of this dkit, such as DataParallel or a c10d backend.
struct Capability {
  /// Short name, e.g. `data_parallel`.
  std::string name;
  /// Whether this build has it.
  bool available = false;
  /// Why not, or what it means.
  std::string note;
};

/// A line that a module above the device module adds to the report, such as the train module's fused updates.
struct ReportExtra {
  /// The text line's label, six characters at most, e.g. `Optim`.
  std::string label;
  /// The key of its JSON object, e.g. `fused_updates`.
  std::string key;
  /// The text line after the label.
  std::string text;
  /// The JSON object's fields in order, every value a string.
  std::vector<std::pair<std::string, std::string>> fields;
};

/// What this process can use: the `dkit devices` report.
struct DeviceReport {
  /// dkit's version.
  std::string dkit_version;
  /// The LibTorch version dkit was compiled against.
  std::string torch_version;
  /// The CUDA runtime version LibTorch was built with, e.g. `12.8`; empty without CUDA.
  std::string cuda_version;
  /// The cuDNN version LibTorch was built with; empty without cuDNN.
  std::string cudnn_version;
  /// Whether CUDA can be used, and if not why.
  CudaStatus cuda_status = CudaStatus::kNotBuilt;
  /// explain_cuda() of the probe; empty when CUDA is available.
  std::string cuda_reason;
  /// LibTorch's intra-op threads (`at::get_num_threads()`).
  int cpu_threads = 0;
  /// LibTorch's inter-op threads.
  int interop_threads = 0;
  /// CPUs this process may run on (its affinity mask).
  int cpus_available = 0;
  /// Whether the CPU runs AVX-512 (F, BW, VL and DQ), as OpenBLAS's SkylakeX kernels need.
  bool cpu_avx512 = false;
  /// The BLAS in use.
  BlasInfo blas;
  /// The GPUs, in index order.
  std::vector<GpuInfo> gpus;
  /// Build-time capabilities.
  std::vector<Capability> capabilities;
  /// Lines added by modules above this one, printed after the capabilities.
  std::vector<ReportExtra> extras;
  /// Problems worth fixing: the reference BLAS, oversubscribed threads, OpenBLAS kernels narrower than the CPU.
  std::vector<std::string> warnings;
};

/// Collects the report for this process.
DeviceReport device_report();

/// The checks behind DeviceReport::warnings, separate so they can be tested with any BLAS, thread counts and CPU.
std::vector<std::string> performance_warnings(const BlasInfo& blas, int torch_threads, int cpus_available,
                                              bool cpu_avx512);

/// Whether this CPU runs AVX-512 (F, BW, VL and DQ); false on other architectures.
bool cpu_has_avx512();

/// Whether this CPU has the float16 arithmetic (AVX512_FP16 or AMX-FP16) that LibTorch's float16 products on the
/// CPU need to run at speed; false on other architectures.
bool cpu_has_float16_arithmetic();

/// The report as an `nvidia-smi`-like text table.
std::string format_report(const DeviceReport& report);

/// The report as JSON.
std::string report_to_json(const DeviceReport& report);

/// `CudaStatus` as a lower-case word: `available`, `not_built`, `not_linked`, `no_device`.
const char* to_string(CudaStatus status);

} // namespace dkit

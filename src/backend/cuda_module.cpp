#include "backend/cuda_module.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace ktier::backend {
namespace {

std::filesystem::path executable_dir() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path(".") : exe.parent_path();
}

}  // namespace

namespace {

Result<CudaModuleProbe> load_cuda_module() {
  std::vector<std::filesystem::path> candidates;
  // KTIER_CUDA_MODULE, when set, is the only place looked at (debugging a specific build).
  // Made absolute: dlopen() would search the library path for a name without a slash.
  // The error_code forms: a path the system cannot look at (too long, a folder not searchable)
  // is a module that cannot be loaded, said why, not an exception out of main.
  std::error_code ec;
  if (const char* env = std::getenv("KTIER_CUDA_MODULE"); env && *env) {
    std::filesystem::path absolute = std::filesystem::absolute(env, ec);
    candidates.push_back(ec ? std::filesystem::path(env) : absolute);
  } else {
    candidates.push_back(executable_dir() / "libktier_cuda.so");
  }

  std::string tried;
  for (const auto& path : candidates) {
    const bool exists = std::filesystem::exists(path, ec);
    if (ec || !exists) {
      tried += (tried.empty() ? "" : ", ") + path.string() +
               (ec ? " (" + ec.message() + ")" : std::string(" (absent)"));
      continue;
    }
    // The module stays loaded for the life of the process (the CUDA runtime inside it
    // registers exit handlers), so the handle is never closed.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      tried += (tried.empty() ? "" : ", ") + path.string() + " (" + dlerror() + ")";
      continue;
    }
    auto abi = reinterpret_cast<KtierCudaAbiVersionFn>(dlsym(handle, "ktier_cuda_abi_version"));
    auto probe = reinterpret_cast<KtierCudaProbeFn>(dlsym(handle, "ktier_cuda_probe"));
    auto ops = reinterpret_cast<KtierCudaOpsFn>(dlsym(handle, "ktier_cuda_ops"));
    if (!abi || !probe || !ops)
      return Status::runtime(path.string() + " is not a ktier CUDA module (symbols missing)");
    if (abi() != KTIER_CUDA_ABI_VERSION)
      return Status::runtime(path.string() + " has ABI version " + std::to_string(abi()) +
                             ", this ktier needs " + std::to_string(KTIER_CUDA_ABI_VERSION) +
                             " (rebuild both from the same tree)");
    CudaModuleProbe out;
    out.module_path = path.string();
    probe(&out.probe);
    out.ops = ops();
    if (!out.ops || out.ops->struct_size != sizeof(KtierCudaOps))
      return Status::runtime(path.string() + " has an op table of another layout " +
                             "(rebuild both from the same tree)");
    return out;
  }
  return Status::runtime("CUDA module not loaded: " + tried +
                         " (this build has no CUDA backend, or the module was not installed)");
}

}  // namespace

Result<CudaModuleProbe> probe_cuda_module() {
  // The CUDA runtime inside the module initialises once per process; probing twice would only
  // repeat the answer.
  static const Result<CudaModuleProbe> probe = load_cuda_module();
  return probe;
}

std::string cuda_device_unsupported(const KtierCudaProbe& p, int d) {
  const KtierCudaDeviceInfo& i = p.devices[d];
  if (i.compute_major * 10 + i.compute_minor >= p.min_compute) return "";
  char buf[400];
  std::snprintf(buf, sizeof(buf), "GPU %d (%s) is sm_%d%d; the CUDA module has kernels for sm_%d "
                "and newer only", d, i.name, i.compute_major, i.compute_minor, p.min_compute);
  return buf;
}

std::string describe_cuda(const Result<CudaModuleProbe>& probe) {
  if (!probe.is_ok()) return "cuda: unavailable, using the CPU path: " + probe.status().message();
  const KtierCudaProbe& p = probe->probe;
  char buf[512];
  if (p.device_count == 0) {
    std::snprintf(buf, sizeof(buf),
                  "cuda: module %s loaded (runtime %d, driver %d) but no usable GPU: %s; "
                  "using the CPU path",
                  probe->module_path.c_str(), p.runtime_version, p.driver_version, p.error);
    return buf;
  }
  std::string s;
  std::snprintf(buf, sizeof(buf), "cuda: %d device(s), runtime %d, driver %d, module %s",
                p.device_count, p.runtime_version, p.driver_version, probe->module_path.c_str());
  s = buf;
  for (int d = 0; d < p.device_count; ++d) {
    const KtierCudaDeviceInfo& i = p.devices[d];
    std::snprintf(buf, sizeof(buf), "\n  [%d] %s, sm_%d%d, %d SMs, %.1f GiB total", d, i.name,
                  i.compute_major, i.compute_minor, i.multiprocessors, i.total_bytes / 1073741824.0);
    s += buf;
    if (d == 0) {  // the only one asked (see KtierCudaDeviceInfo::free_bytes)
      std::snprintf(buf, sizeof(buf), ", %.1f GiB free", i.free_bytes / 1073741824.0);
      s += buf;
    }
    if (!cuda_device_unsupported(p, d).empty())
      s += " (unusable: needs sm_" + std::to_string(p.min_compute) + " or newer)";
  }
  return s;
}

}  // namespace ktier::backend

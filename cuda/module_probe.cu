// Device discovery for the CUDA module. "No GPU" is a normal answer, not an error.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#include "backend/cuda_module_abi.h"

#include "kernels.cuh"  // KTIER_CUDA_EXPORT

namespace {

// The virtual architectures this file is compiled for (nvcc's list, e.g. 800,860,890,900; the
// whole module is built with one list): code for compute_XY runs on XY and newer.
constexpr int kArchList[] = {__CUDA_ARCH_LIST__};
constexpr int oldest_arch() {
  int m = kArchList[0];
  for (int a : kArchList) m = a < m ? a : m;
  return m;
}

}  // namespace

KTIER_CUDA_EXPORT int ktier_cuda_abi_version(void) { return KTIER_CUDA_ABI_VERSION; }

KTIER_CUDA_EXPORT void ktier_cuda_probe(KtierCudaProbe* out) {
  std::memset(out, 0, sizeof(*out));
  out->abi_version = KTIER_CUDA_ABI_VERSION;
  out->min_compute = oldest_arch() / 10;
  cudaRuntimeGetVersion(&out->runtime_version);
  cudaDriverGetVersion(&out->driver_version);
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    std::snprintf(out->error, sizeof(out->error), "%s (%s)", cudaGetErrorName(err),
                  cudaGetErrorString(err));
    (void)cudaGetLastError();  // reported here, not by the next call (see cuda_check)
    return;
  }
  if (count == 0) {
    std::snprintf(out->error, sizeof(out->error), "the driver reports no CUDA device");
    return;
  }
  const int max_devices = static_cast<int>(sizeof(out->devices) / sizeof(out->devices[0]));
  out->device_count = count < max_devices ? count : max_devices;
  int current = 0;  // the calling thread's device, restored below
  const bool restore = cudaGetDevice(&current) == cudaSuccess;
  for (int d = 0; d < out->device_count; ++d) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    KtierCudaDeviceInfo& info = out->devices[d];
    std::snprintf(info.name, sizeof(info.name), "%s", prop.name);
    info.compute_major = prop.major;
    info.compute_minor = prop.minor;
    info.multiprocessors = prop.multiProcessorCount;
    info.total_bytes = prop.totalGlobalMem;
    if (d != 0) continue;  // no context on the devices ktier does not run on
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(d) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
      info.free_bytes = free_b;
      info.total_bytes = total_b;
    } else {
      (void)cudaGetLastError();
    }
  }
  if (restore) cudaSetDevice(current);
  (void)cudaGetLastError();  // the probe's tolerated failures are not the next caller's
}

// Device discovery for the CUDA module. "No GPU" is a normal answer, not an error.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#include "backend/cuda_module_abi.h"

#include "kernels.cuh"  // KTIER_CUDA_EXPORT

KTIER_CUDA_EXPORT int ktier_cuda_abi_version(void) { return KTIER_CUDA_ABI_VERSION; }

KTIER_CUDA_EXPORT void ktier_cuda_probe(KtierCudaProbe* out) {
  std::memset(out, 0, sizeof(*out));
  out->abi_version = KTIER_CUDA_ABI_VERSION;
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
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(d) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
      info.free_bytes = free_b;
      info.total_bytes = total_b;
    } else {
      (void)cudaGetLastError();
      info.total_bytes = prop.totalGlobalMem;
    }
  }
  if (restore) cudaSetDevice(current);
  (void)cudaGetLastError();  // the probe's tolerated failures are not the next caller's
}

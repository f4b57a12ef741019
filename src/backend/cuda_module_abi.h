#pragma once
/* The C ABI between the ktier executable and the optional CUDA module libktier_cuda.so.
 * ktier never links against libcudart or libcublas: it dlopen()s the module and resolves the
 * symbols below. Plain C, no CUDA headers, so both sides can include it.
 * Bump KTIER_CUDA_ABI_VERSION on any change; ktier refuses a module of another version. */
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KTIER_CUDA_ABI_VERSION 1

typedef struct KtierCudaDeviceInfo {
  char name[256];
  int compute_major;
  int compute_minor;
  int multiprocessors;
  uint64_t total_bytes;
  uint64_t free_bytes;
} KtierCudaDeviceInfo;

typedef struct KtierCudaProbe {
  int abi_version;      /* KTIER_CUDA_ABI_VERSION of the module */
  int runtime_version;  /* cudaRuntimeGetVersion, e.g. 13000 */
  int driver_version;   /* cudaDriverGetVersion; 0 when no driver is installed */
  int device_count;     /* usable CUDA devices; 0 when none */
  char error[256];      /* why device_count is 0, empty otherwise */
  KtierCudaDeviceInfo devices[8];
} KtierCudaProbe;

/* Symbol "ktier_cuda_abi_version": returns KTIER_CUDA_ABI_VERSION. */
typedef int (*KtierCudaAbiVersionFn)(void);
/* Symbol "ktier_cuda_probe": fills *out; never aborts, whatever the machine lacks. */
typedef void (*KtierCudaProbeFn)(KtierCudaProbe* out);

#ifdef __cplusplus
}
#endif

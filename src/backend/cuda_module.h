#pragma once
// Finding and loading the optional CUDA module (libktier_cuda.so) at run time.
// The module is looked for next to the ktier executable, or only at $KTIER_CUDA_MODULE when
// that is set (debugging only, see docs/TUNING.md). Thread-safety: call from main only.

#include <string>
#include <vector>

#include "backend/cuda_module_abi.h"
#include "common/status.h"

namespace ktier::backend {

struct CudaModuleProbe {
  std::string module_path;         // the file that was loaded
  KtierCudaProbe probe{};          // what the module found (device_count may be 0)
  const KtierCudaOps* ops = nullptr;  // the module's op table (static storage, never null)
};

// Loads the module (once per process; later calls return the first answer) and asks it for
// devices. A non-ok Status explains why CUDA cannot be used
// (module missing, ABI mismatch, symbol missing); its code is kRuntime. A loaded module
// that sees no device returns ok with probe.device_count == 0 and probe.error set.
Result<CudaModuleProbe> probe_cuda_module();

// One line for logs and `ktier doctor`: the devices, or why the CPU path is used.
std::string describe_cuda(const Result<CudaModuleProbe>& probe);

// Why device `d` of the probe cannot run the module's kernels (its compute capability is below
// the oldest architecture the module was built for), or "" when it can.
std::string cuda_device_unsupported(const KtierCudaProbe& p, int d);

}  // namespace ktier::backend

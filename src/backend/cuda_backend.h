#pragma once
// The CUDA backend: the Backend interface over the op table of libktier_cuda.so (loaded with
// dlopen by probe_cuda_module; ktier itself never links the CUDA libraries).

#include <memory>

#include "backend/backend.h"
#include "backend/cuda_module.h"

namespace ktier::backend {

// Opens device `device` of a loaded module: a stream for the ops and one per copy queue.
// Errors (kRuntime): the module is not loaded, has no such device, the device is older than the
// module's kernels, or it cannot be initialised; the message says which.
Result<std::unique_ptr<Backend>> make_cuda_backend(const Result<CudaModuleProbe>& module,
                                                   int device = 0);

}  // namespace ktier::backend

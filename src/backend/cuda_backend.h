#pragma once
// The CUDA backend: the Backend interface over the op table of libktier_cuda.so (loaded with
// dlopen by probe_cuda_module; ktier itself never links the CUDA libraries).

#include <memory>

#include "backend/backend.h"
#include "backend/cuda_module.h"

namespace ktier::backend {

// Opens device `device` of a loaded module: a stream for the ops and one per copy queue.
// `cublas_prefill` (`--gpu-prefill cublas`): F32 and BF16 linears of 8 tokens or more go to
// cuBLAS where the module found it (uses_blas(); a warning where not); otherwise every linear
// runs the fused kernels and the output does not depend on how a prefill is chunked.
// Errors (kRuntime): the module is not loaded, has no such device, the device is older than the
// module's kernels, or it cannot be initialised; the message says which.
Result<std::unique_ptr<Backend>> make_cuda_backend(const Result<CudaModuleProbe>& module,
                                                   bool cublas_prefill = false, int device = 0);

}  // namespace ktier::backend

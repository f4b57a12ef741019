#pragma once
// `--device auto|cpu|cuda`: which backend a run decodes on, decided once at start.

#include <string>

#include "backend/backend.h"
#include "backend/cuda_module.h"

namespace ktier::backend {

enum class DeviceRequest { kAuto, kCpu, kCuda };

// "auto", "cpu", "cuda"; Status::usage naming the value otherwise.
Result<DeviceRequest> parse_device_request(const std::string& text);

struct DeviceChoice {
  DeviceKind kind = DeviceKind::kCpu;
  std::string reason;  // one line for the log: what was found and why this backend
};

// Decides from what the CUDA module reported (probe_cuda_module()). kCpu: always the CPU.
// kAuto: CUDA when it can decode here, else the CPU with the reason. kCuda: CUDA, or
// Status::usage (exit 2) with the reason when it cannot be used.
Result<DeviceChoice> choose_device(DeviceRequest request, const Result<CudaModuleProbe>& module);

}  // namespace ktier::backend

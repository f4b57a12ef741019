#pragma once
// `--device auto|cpu|cuda|emulated`: which backend a run decodes on, decided once at start.
// `emulated` runs GPU mode's placement (trunk mirror, VRAM expert tier) on the emulated device
// (the CPU kernels behind a memory wall, backend.h): for tests and for trying --vram budgets on
// a machine without a GPU; same bytes as cpu, slower.

#include <string>

#include "backend/backend.h"
#include "backend/cuda_module.h"

namespace ktier::backend {

enum class DeviceRequest { kAuto, kCpu, kCuda, kEmulated };

// "auto", "cpu", "cuda", "emulated"; Status::usage naming the value otherwise.
Result<DeviceRequest> parse_device_request(const std::string& text);

struct DeviceChoice {
  DeviceKind kind = DeviceKind::kCpu;
  bool emulated = false;  // GPU mode on the emulated device (kind stays kCpu)
  std::string reason;  // one line for the log: what was found and why this backend
};

// Decides from what the CUDA module reported (probe_cuda_module()). kCpu: always the CPU;
// kEmulated: always the emulated device.
// kAuto: CUDA when it can decode here, else the CPU with the reason. kCuda: CUDA, or
// Status::usage (exit 2) with the reason when it cannot be used.
Result<DeviceChoice> choose_device(DeviceRequest request, const Result<CudaModuleProbe>& module);

}  // namespace ktier::backend

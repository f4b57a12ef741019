#include "backend/device_choice.h"

namespace ktier::backend {
namespace {

// Why decoding cannot run on CUDA here, or "" when it can.
std::string cuda_unusable_reason(const Result<CudaModuleProbe>& module) {
  if (!module.is_ok()) return module.status().message();
  if (module->probe.device_count == 0)
    return std::string("the CUDA module sees no usable GPU: ") + module->probe.error;
  return cuda_device_unsupported(module->probe, 0);  // the device ktier runs on
}

}  // namespace

Result<DeviceRequest> parse_device_request(const std::string& text) {
  if (text == "auto") return DeviceRequest::kAuto;
  if (text == "cpu") return DeviceRequest::kCpu;
  if (text == "cuda") return DeviceRequest::kCuda;
  if (text == "emulated") return DeviceRequest::kEmulated;
  return Status::usage("--device: '" + text + "' is not one of auto, cpu, cuda, emulated");
}

Result<DeviceChoice> choose_device(DeviceRequest request, const Result<CudaModuleProbe>& module) {
  if (request == DeviceRequest::kCpu) return DeviceChoice{DeviceKind::kCpu, false, "--device cpu"};
  if (request == DeviceRequest::kEmulated)
    return DeviceChoice{DeviceKind::kCpu, true, "--device emulated: GPU mode on the CPU kernels"};
  const std::string why_not = cuda_unusable_reason(module);
  if (why_not.empty()) return DeviceChoice{DeviceKind::kCuda, false, describe_cuda(module)};
  if (request == DeviceRequest::kCuda)
    return Status::usage("--device cuda: CUDA cannot be used: " + why_not);
  return DeviceChoice{DeviceKind::kCpu, false, "using the CPU path: " + why_not};
}

}  // namespace ktier::backend

#include "backend/device_choice.h"

namespace ktier::backend {
namespace {

// Why decoding cannot run on CUDA here, or "" when it can.
std::string cuda_unusable_reason(const Result<CudaModuleProbe>& module) {
  if (!module.is_ok()) return module.status().message();
  if (module->probe.device_count == 0)
    return std::string("the CUDA module sees no usable GPU: ") + module->probe.error;
  // The module's ops exist and are tested op by op (tests/backend), but the decode loop does
  // not run on them yet (issue 6): say so rather than pretend.
  return std::string("GPU found (") + module->probe.devices[0].name +
         ") but this ktier's decode loop runs on the CPU only; the CUDA ops are built and tested "
         "op by op, the GPU decode path is not finished";
}

}  // namespace

Result<DeviceRequest> parse_device_request(const std::string& text) {
  if (text == "auto") return DeviceRequest::kAuto;
  if (text == "cpu") return DeviceRequest::kCpu;
  if (text == "cuda") return DeviceRequest::kCuda;
  return Status::usage("--device: '" + text + "' is not one of auto, cpu, cuda");
}

Result<DeviceChoice> choose_device(DeviceRequest request, const Result<CudaModuleProbe>& module) {
  if (request == DeviceRequest::kCpu) return DeviceChoice{DeviceKind::kCpu, "--device cpu"};
  const std::string why_not = cuda_unusable_reason(module);
  if (why_not.empty()) return DeviceChoice{DeviceKind::kCuda, describe_cuda(module)};
  if (request == DeviceRequest::kCuda)
    return Status::usage("--device cuda: CUDA cannot be used: " + why_not);
  return DeviceChoice{DeviceKind::kCpu, "using the CPU path: " + why_not};
}

}  // namespace ktier::backend

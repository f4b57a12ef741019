// --device auto|cpu|cuda against what a CUDA module could report (backend/device_choice.h): the
// answers are made up here, so every case runs without a GPU — a missing module, a module that
// sees no GPU, a GPU older than the module's kernels, and one that can run them.
#include <gtest/gtest.h>

#include <cstdio>

#include "backend/device_choice.h"

namespace ktier::backend {
namespace {

CudaModuleProbe one_gpu(int major, int minor) {
  CudaModuleProbe m{};
  m.module_path = "/opt/ktier/libktier_cuda.so";
  m.probe.abi_version = KTIER_CUDA_ABI_VERSION;
  m.probe.device_count = 1;
  m.probe.min_compute = 80;
  std::snprintf(m.probe.devices[0].name, sizeof m.probe.devices[0].name, "Test GPU");
  m.probe.devices[0].compute_major = major;
  m.probe.devices[0].compute_minor = minor;
  return m;
}

TEST(DeviceChoice, AGpuTheModuleHasKernelsForIsChosen) {
  for (auto [major, minor] : {std::pair{8, 0}, {8, 6}, {9, 0}, {12, 0}}) {
    auto c = choose_device(DeviceRequest::kAuto, one_gpu(major, minor));
    ASSERT_TRUE(c.is_ok());
    EXPECT_EQ(c->kind, DeviceKind::kCuda) << major << minor;
    EXPECT_TRUE(choose_device(DeviceRequest::kCuda, one_gpu(major, minor)).is_ok());
  }
}

// An sm_75 GPU passes the driver's checks but would fail at its first kernel: auto says why and
// takes the CPU; cuda exits 2 with the same reason.
TEST(DeviceChoice, AGpuOlderThanTheModuleIsRefusedWithTheReason) {
  auto c = choose_device(DeviceRequest::kAuto, one_gpu(7, 5));
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->kind, DeviceKind::kCpu);
  EXPECT_NE(c->reason.find("sm_75"), std::string::npos) << c->reason;
  EXPECT_NE(c->reason.find("sm_80"), std::string::npos) << c->reason;
  auto forced = choose_device(DeviceRequest::kCuda, one_gpu(7, 5));
  ASSERT_FALSE(forced.is_ok());
  EXPECT_EQ(forced.status().exit_code(), 2);
  EXPECT_NE(forced.status().message().find("Test GPU"), std::string::npos);
  EXPECT_NE(describe_cuda(one_gpu(7, 5)).find("unusable"), std::string::npos);
  EXPECT_EQ(describe_cuda(one_gpu(9, 0)).find("unusable"), std::string::npos);
}

TEST(DeviceChoice, NoModuleOrNoGpuFallsBackToTheCpuOrExitsTwo) {
  auto check = [](const Result<CudaModuleProbe>& probe, const std::string& why) {
    auto c = choose_device(DeviceRequest::kAuto, probe);
    ASSERT_TRUE(c.is_ok());
    EXPECT_EQ(c->kind, DeviceKind::kCpu);
    EXPECT_NE(c->reason.find(why), std::string::npos) << c->reason;
    EXPECT_EQ(choose_device(DeviceRequest::kCuda, probe).status().exit_code(), 2);
    EXPECT_EQ(choose_device(DeviceRequest::kCpu, probe)->kind, DeviceKind::kCpu);
  };
  check(Status::runtime("libktier_cuda.so (absent)"), "absent");
  CudaModuleProbe none = one_gpu(9, 0);
  none.probe.device_count = 0;
  std::snprintf(none.probe.error, sizeof none.probe.error, "the driver reports no CUDA device");
  check(none, "no CUDA device");
}

}  // namespace
}  // namespace ktier::backend

// Checks of the host emulation's module itself (cuda/emulation), for the faults it must raise
// where a GPU would. Runs where KTIER_CUDA_MODULE names that module (CTest
// cuda_emulation.cross_backend); skips elsewhere.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda_module.h"

namespace ktier::backend {
namespace {

const KtierCudaOps* emulated_module_ops() {
  const Result<CudaModuleProbe>& m = probe_cuda_module();
  if (!m.is_ok() || m->probe.device_count == 0 ||
      std::string(m->probe.devices[0].name) != "ktier host emulation")
    return nullptr;
  return m->ops;
}

// Host code that reads device memory without a copy works on a CPU and faults on a GPU: the
// emulation closes device memory to the host outside its own work, so it faults here too.
TEST(CudaEmulation, DeviceMemoryIsClosedToTheHostOutsideDeviceWork) {
  const KtierCudaOps* ops = emulated_module_ops();
  if (!ops) GTEST_SKIP() << "KTIER_CUDA_MODULE is not the host emulation's module";
  ASSERT_EQ(ops->init(0), 0) << ops->last_error();
  void* device = nullptr;
  ASSERT_EQ(ops->malloc_device(&device, 64), 0) << ops->last_error();
  const std::vector<float> host(16, 1.5f);
  std::vector<float> back(16, 0.0f);
  ASSERT_EQ(ops->memcpy_async(device, host.data(), 64, nullptr), 0) << ops->last_error();
  ASSERT_EQ(ops->memcpy_async(back.data(), device, 64, nullptr), 0) << ops->last_error();
  ASSERT_EQ(ops->stream_synchronize(nullptr), 0) << ops->last_error();
  EXPECT_EQ(back, host);
  const std::string style = GTEST_FLAG_GET(death_test_style);
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the test process has threads
  EXPECT_DEATH(
      {
        float v;
        std::memcpy(&v, device, sizeof(v));
        std::printf("%g\n", v);
      },
      "");
  GTEST_FLAG_SET(death_test_style, style);
  EXPECT_EQ(ops->free_device(device), 0) << ops->last_error();
}

}  // namespace
}  // namespace ktier::backend

// The CUDA backend's host side (src/backend/cuda_backend.cpp) over a made-up module: its op
// table's memory, stream and event calls done in host memory, with failures on demand. This runs
// everywhere, so the VRAM pool, the per-thread device binding and the error messages are tested
// without a GPU; the kernels themselves are cross_backend_test's (on a GPU only).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "backend/cuda_backend.h"

namespace ktier::backend {
namespace {

// The made-up module's state: one device of `capacity` bytes. Guarded by `mu` (the backend is
// called from several threads in one test).
struct FakeDevice {
  std::mutex mu;
  std::map<void*, size_t> blocks;  // device allocations -> bytes
  size_t used = 0, capacity = 1 << 20;
  int mallocs = 0, inits = 0, streams = 0, events = 0;
  std::atomic<bool> refuse_init{false}, refuse_streams{false}, lost{false};
};
FakeDevice* g_fake = nullptr;
thread_local std::string t_error;
thread_local int t_current = -1;  // the device made current on this thread, -1: none yet

int fail(const char* why) {
  t_error = why;
  return 1;
}
const char* last_error() { return t_error.c_str(); }
int init(int device) {
  std::lock_guard<std::mutex> lock(g_fake->mu);
  ++g_fake->inits;
  if (g_fake->refuse_init) return fail("fake: init refused");
  t_current = device;
  return 0;
}
int malloc_device(void** p, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_fake->mu);
  if (g_fake->lost) return fail("fake: device lost");
  if (g_fake->used + bytes > g_fake->capacity) {
    fail("fake: out of memory");
    return KTIER_CUDA_ERROR_OUT_OF_MEMORY;
  }
  *p = std::malloc(bytes);
  g_fake->blocks[*p] = bytes;
  g_fake->used += bytes;
  ++g_fake->mallocs;
  return 0;
}
int free_device(void* p) {
  std::lock_guard<std::mutex> lock(g_fake->mu);
  auto it = g_fake->blocks.find(p);
  if (it == g_fake->blocks.end()) return fail("fake: free of a foreign pointer");
  g_fake->used -= it->second;
  g_fake->blocks.erase(it);
  std::free(p);
  return 0;
}
int host_register(void*, size_t) { return 0; }
int host_unregister(void*) { return 0; }
int mem_info(size_t* free_bytes, size_t* total) {
  std::lock_guard<std::mutex> lock(g_fake->mu);
  *free_bytes = g_fake->capacity - g_fake->used;
  *total = g_fake->capacity;
  return 0;
}
int memcpy_async(void* dst, const void* src, size_t bytes, KtierCudaStream) {
  std::memcpy(dst, src, bytes);
  return 0;
}
int memset_async(void* dst, int value, size_t bytes, KtierCudaStream) {
  std::memset(dst, value, bytes);
  return 0;
}
int stream_create(KtierCudaStream* s) {
  if (g_fake->refuse_streams) return fail("fake: no streams left");
  std::lock_guard<std::mutex> lock(g_fake->mu);
  ++g_fake->streams;
  *s = new int(0);
  return 0;
}
int stream_destroy(KtierCudaStream s) {
  std::lock_guard<std::mutex> lock(g_fake->mu);
  --g_fake->streams;
  delete static_cast<int*>(s);
  return 0;
}
int event_create(KtierCudaEvent* e) {
  std::lock_guard<std::mutex> lock(g_fake->mu);
  ++g_fake->events;
  *e = new int(0);
  return 0;
}
int event_destroy(KtierCudaEvent e) {
  std::lock_guard<std::mutex> lock(g_fake->mu);
  --g_fake->events;
  delete static_cast<int*>(e);
  return 0;
}
int no_op_stream(KtierCudaStream) { return 0; }
int no_op_event(KtierCudaEvent) { return 0; }
int no_op_pair(KtierCudaEvent, KtierCudaStream) { return 0; }
int enable_cublas() { return 0; }

// Memory, streams and events only: the backend's op forwards are never called here.
KtierCudaOps fake_ops() {
  KtierCudaOps o{};
  o.struct_size = sizeof o;
  o.last_error = last_error;
  o.init = init;
  o.malloc_device = malloc_device;
  o.free_device = free_device;
  o.host_register = host_register;
  o.host_unregister = host_unregister;
  o.mem_info = mem_info;
  o.memcpy_async = memcpy_async;
  o.memset_async = memset_async;
  o.stream_create = stream_create;
  o.stream_destroy = stream_destroy;
  o.stream_synchronize = no_op_stream;
  o.event_create = event_create;
  o.event_destroy = event_destroy;
  o.event_record = no_op_pair;
  o.stream_wait_event = [](KtierCudaStream, KtierCudaEvent) { return 0; };
  o.event_synchronize = no_op_event;
  o.event_query = [](KtierCudaEvent, int* passed) {
    *passed = 1;
    return 0;
  };
  o.enable_cublas = enable_cublas;
  return o;
}

class CudaBackendHost : public ::testing::Test {
 protected:
  void SetUp() override {
    g_fake = &fake_;
    ops_ = fake_ops();
    CudaModuleProbe m;
    m.module_path = "fake";
    m.ops = &ops_;
    m.probe.abi_version = KTIER_CUDA_ABI_VERSION;
    m.probe.device_count = 1;
    m.probe.min_compute = 80;
    std::snprintf(m.probe.devices[0].name, sizeof m.probe.devices[0].name, "Fake GPU");
    m.probe.devices[0].compute_major = 9;
    module_ = m;
  }
  void TearDown() override { g_fake = nullptr; }
  Result<std::unique_ptr<Backend>> open(bool cublas_prefill = false) {
    return make_cuda_backend(module_, cublas_prefill);
  }

  FakeDevice fake_;
  KtierCudaOps ops_{};
  Result<CudaModuleProbe> module_ = Status::runtime("not set up");
};

TEST_F(CudaBackendHost, OpensStreamsAndEventsAndGivesEverythingBack) {
  {
    auto be = open();
    ASSERT_TRUE(be.is_ok()) << be.status().message();
    EXPECT_EQ((*be)->name(), "cuda:0 Fake GPU (sm_90)");
    EXPECT_EQ((*be)->kind(), DeviceKind::kCuda);
    EXPECT_FALSE((*be)->uses_blas());
    EXPECT_EQ(fake_.streams, 1 + Backend::kNumCopyQueues);
    auto a = (*be)->allocate(100), b = (*be)->allocate(200);
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    (*be)->release(*a);  // kept in the pool; b stays live
    auto f = (*be)->create_fence();
    ASSERT_TRUE(f.is_ok());
    EXPECT_EQ(fake_.blocks.size(), 2u);
  }
  EXPECT_TRUE(fake_.blocks.empty()) << "pooled and live blocks are freed with the backend";
  EXPECT_EQ(fake_.streams, 0);
  EXPECT_EQ(fake_.events, 0);
}

TEST_F(CudaBackendHost, AFailedOpenSaysWhichCallFailed) {
  fake_.refuse_streams = true;
  auto be = open();
  ASSERT_FALSE(be.is_ok());
  EXPECT_EQ(be.status().code(), ExitCode::kRuntime);
  EXPECT_EQ(be.status().message(),
            "cuda:0 Fake GPU (sm_90): stream_create failed: fake: no streams left");
  EXPECT_EQ(fake_.events, 0);
}

// cuBLAS prefill asked of a module without cuBLAS: the fused kernels, said in the name.
TEST_F(CudaBackendHost, CublasPrefillWithoutCublasRunsTheFusedKernels) {
  auto be = open(/*cublas_prefill=*/true);
  ASSERT_TRUE(be.is_ok()) << be.status().message();
  EXPECT_EQ((*be)->name(), "cuda:0 Fake GPU (sm_90, no cuBLAS: fused kernels for prefill)");
  EXPECT_FALSE((*be)->uses_blas());
}

// Released blocks are handed out again by size without a new cudaMalloc; when the device runs
// out, the kept blocks of other sizes are given back and the allocation tried once more.
TEST_F(CudaBackendHost, PoolReusesBlocksAndTrimsWhenTheDeviceIsFull) {
  fake_.capacity = 1000;
  auto be = open();
  ASSERT_TRUE(be.is_ok()) << be.status().message();
  Backend& d = **be;
  auto a = d.allocate(400);
  ASSERT_TRUE(a.is_ok());
  d.release(*a);
  auto again = d.allocate(400);
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(*again, *a);
  EXPECT_EQ(fake_.mallocs, 1);
  EXPECT_EQ(d.memory_use().live, 400u);
  d.release(*again);
  auto big = d.allocate(700);  // 400 kept + 700 > 1000: the kept block goes first
  ASSERT_TRUE(big.is_ok()) << big.status().message();
  EXPECT_EQ(fake_.used, 700u);
  EXPECT_EQ(fake_.blocks.size(), 1u);
  auto more = d.allocate(400);
  ASSERT_FALSE(more.is_ok());
  EXPECT_EQ(more.status().code(), ExitCode::kRuntime);
  EXPECT_NE(more.status().message().find("allocating 400 bytes of VRAM failed: fake: out of "
                                         "memory"),
            std::string::npos)
      << more.status().message();
  EXPECT_TRUE(more.status().is_out_of_memory()) << "the module's code says so, not the text";
  EXPECT_EQ(d.memory_use().live, 700u);
  EXPECT_EQ(d.memory_use().peak, 700u);
  fake_.lost = true;
  auto lost = d.allocate(100);
  ASSERT_FALSE(lost.is_ok());
  EXPECT_EQ(lost.status().code(), ExitCode::kRuntime);
  EXPECT_FALSE(lost.status().is_out_of_memory()) << lost.status().message();
}

// limit_memory counts the kept blocks too: they are given back before the limit is passed.
TEST_F(CudaBackendHost, KeptBlocksAreGivenBackBeforeTheLimitIsPassed) {
  auto be = open();
  ASSERT_TRUE(be.is_ok());
  Backend& d = **be;
  d.limit_memory(1000);
  auto a = d.allocate(600);
  ASSERT_TRUE(a.is_ok());
  d.release(*a);
  auto b = d.allocate(500);
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(fake_.used, 500u) << "the kept 600 would have passed the limit";
}

TEST_F(CudaBackendHost, CopiesAndFillsMoveTheBytes) {
  auto be = open();
  ASSERT_TRUE(be.is_ok());
  Backend& d = **be;
  auto p = d.allocate(16), q = d.allocate(16);
  ASSERT_TRUE(p.is_ok() && q.is_ok());
  const char text[16] = "fifteen bytes..";
  ASSERT_TRUE(d.upload(*p, text, 16).is_ok());
  ASSERT_TRUE(d.copy(*q, *p, 16).is_ok());
  ASSERT_TRUE(d.fill(*p, 'x', 8).is_ok());
  char back[16] = {};
  ASSERT_TRUE(d.download(back, *q, 16).is_ok());
  EXPECT_EQ(std::string(back, 15), "fifteen bytes..");
  ASSERT_TRUE(d.download(back, *p, 16).is_ok());
  EXPECT_EQ(std::string(back, 15), "xxxxxxxxbytes..");
}

// Each thread's first call makes the device current (the CUDA runtime's current device is per
// thread). If that fails, the call fails with the reason and does nothing: in particular no
// block is allocated on whatever device the thread had (it would be used here and leak).
TEST_F(CudaBackendHost, AnotherThreadBindsTheDeviceFirstAndAFailedBindAllocatesNothing) {
  auto be = open();
  ASSERT_TRUE(be.is_ok());
  Backend& d = **be;
  const int inits_at_open = fake_.inits;
  Result<void*> on_thread = Status::runtime("not run");
  int current_there = -2;
  std::thread([&] {
    on_thread = d.allocate(64);
    current_there = t_current;
  }).join();
  ASSERT_TRUE(on_thread.is_ok()) << on_thread.status().message();
  EXPECT_EQ(current_there, 0);
  EXPECT_EQ(fake_.inits, inits_at_open + 1);
  ASSERT_TRUE(d.allocate(64).is_ok());
  EXPECT_EQ(fake_.inits, inits_at_open + 1) << "the opening thread is bound already";

  fake_.refuse_init = true;
  const size_t blocks = fake_.blocks.size();
  Result<void*> refused = Status::runtime("not run");
  Status sync = Status::ok();
  std::thread([&] {
    refused = d.allocate(32);
    sync = d.synchronize();
  }).join();
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find(
                "allocating 32 bytes of VRAM: making the device current on this thread failed: "
                "fake: init refused"),
            std::string::npos)
      << refused.status().message();
  EXPECT_FALSE(refused.status().is_out_of_memory());
  EXPECT_EQ(fake_.blocks.size(), blocks);
  EXPECT_FALSE(sync.is_ok()) << "every call on that thread tries again and fails";
  fake_.refuse_init = false;
  std::thread([&] { refused = d.allocate(32); }).join();
  EXPECT_TRUE(refused.is_ok()) << "a later call binds";
}

}  // namespace
}  // namespace ktier::backend

// Checks of the host emulation's module itself (cuda/emulation): the faults it must raise where
// a GPU would, and the orders its streams run queued work in. Runs where KTIER_CUDA_MODULE
// names that module (CTest cuda_emulation.cross_backend); skips elsewhere.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <set>
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

// Every case needs the emulated module; the test process has threads (the module's), so death
// tests re-run the binary rather than fork it as it stands.
class CudaEmulation : public ::testing::Test {
 protected:
  void SetUp() override {
    ops = emulated_module_ops();
    if (!ops) GTEST_SKIP() << "KTIER_CUDA_MODULE is not the host emulation's module";
    GTEST_FLAG_SET(death_test_style, "threadsafe");
  }
  const KtierCudaOps* ops = nullptr;
};

// Host code that reads device memory without a copy works on a CPU and faults on a GPU: the
// emulation closes device memory to the host outside its own work, so it faults here too.
TEST_F(CudaEmulation, DeviceMemoryIsClosedToTheHostOutsideDeviceWork) {
  ASSERT_EQ(ops->init(0), 0) << ops->last_error();
  void* device = nullptr;
  ASSERT_EQ(ops->malloc_device(&device, 64), 0) << ops->last_error();
  const std::vector<float> host(16, 1.5f);
  std::vector<float> back(16, 0.0f);
  ASSERT_EQ(ops->memcpy_async(device, host.data(), 64, nullptr), 0) << ops->last_error();
  ASSERT_EQ(ops->memcpy_async(back.data(), device, 64, nullptr), 0) << ops->last_error();
  ASSERT_EQ(ops->stream_synchronize(nullptr), 0) << ops->last_error();
  EXPECT_EQ(back, host);
  EXPECT_DEATH(
      {
        float v;
        std::memcpy(&v, device, sizeof(v));
        std::printf("%g\n", v);
      },
      "");
  EXPECT_EQ(ops->free_device(device), 0) << ops->last_error();
}

// A kernel given a pageable host pointer faults on a GPU; the emulation checks every pointer
// parameter at the launch and aborts, naming the kernel.
TEST_F(CudaEmulation, AKernelGivenAPageableHostPointerAborts) {
  ASSERT_EQ(ops->init(0), 0) << ops->last_error();
  float* device = nullptr;
  ASSERT_EQ(ops->malloc_device(reinterpret_cast<void**>(&device), 3 * 16 * sizeof(float)), 0);
  ASSERT_EQ(ops->add(device, device + 16, 16, device + 32, nullptr), 0) << ops->last_error();
  ASSERT_EQ(ops->stream_synchronize(nullptr), 0) << ops->last_error();
  std::vector<float> host(16, 0.0f);
  EXPECT_DEATH(ops->add(device, host.data(), 16, device + 32, nullptr),
               "add_kernel: parameter 1 .* is neither device nor pinned host memory");
  // The same for a pointer inside a struct parameter: a linear job's input vector.
  const KtierCudaLinearJob job{{KTIER_CUDA_F32, device, nullptr, 4, 4}, host.data(), 1,
                              device + 32};
  EXPECT_DEATH(ops->linear(&job, 1, 0, nullptr),
               "dense_kernel.*: parameter 0 .* is neither device nor pinned host memory");
  EXPECT_EQ(ops->free_device(device), 0) << ops->last_error();
}

// The orders whose outcomes the cases below spell out ("random:SEED" lies between the first
// two: RandomOrdersLieBetweenLateAndOthersFirst).
constexpr const char* kOrders[] = {"late", "others-first", "sync"};

// The emulation's stream order (cuda/emulation/streams.h) for the length of a test.
class ScopedOrder {
 public:
  explicit ScopedOrder(const char* order) {
    if (const char* v = std::getenv(kVar)) saved_ = v;
    setenv(kVar, order, 1);
  }
  ~ScopedOrder() {
    if (saved_.empty())
      unsetenv(kVar);
    else
      setenv(kVar, saved_.c_str(), 1);
  }

 private:
  static constexpr const char* kVar = "KTIER_CUDA_EMULATION_ORDER";
  std::string saved_;
};

struct Streams {
  const KtierCudaOps* ops;
  KtierCudaStream a = nullptr, b = nullptr;
  KtierCudaEvent e = nullptr;
  int32_t* device = nullptr;  // [2]: x, y
  int32_t* pinned = nullptr;  // [1]

  explicit Streams(const KtierCudaOps* o) : ops(o) {
    EXPECT_EQ(ops->init(0), 0) << ops->last_error();
    EXPECT_EQ(ops->stream_create(&a), 0) << ops->last_error();
    EXPECT_EQ(ops->stream_create(&b), 0) << ops->last_error();
    EXPECT_EQ(ops->event_create(&e), 0) << ops->last_error();
    EXPECT_EQ(ops->malloc_device(reinterpret_cast<void**>(&device), 8), 0);
    EXPECT_EQ(ops->malloc_host(reinterpret_cast<void**>(&pinned), 4), 0);
  }
  ~Streams() {
    ops->free_host(pinned);
    ops->free_device(device);
    ops->event_destroy(e);
    ops->stream_destroy(b);
    ops->stream_destroy(a);
  }
  void set(int32_t* at, int32_t v, KtierCudaStream s) {
    ASSERT_EQ(ops->memcpy_async(at, &v, 4, s), 0) << ops->last_error();  // pageable: staged
  }
  int32_t get(const int32_t* at) {
    int32_t v = -1;
    EXPECT_EQ(ops->memcpy_async(&v, at, 4, a), 0) << ops->last_error();  // pageable: waits
    return v;
  }
};

// Work queued on a stream runs when the host waits for it: a pinned source overwritten before
// the wait is what the copy reads (the host may not reuse it before), under the orders that
// defer; under "sync" the copy ran at once.
TEST_F(CudaEmulation, QueuedCopiesReadPinnedHostMemoryWhenTheHostWaits) {
  for (const char* order : kOrders) {
    SCOPED_TRACE(order);
    const ScopedOrder scoped(order);
    Streams st(ops);
    *st.pinned = 1;
    ASSERT_EQ(ops->memcpy_async(st.device, st.pinned, 4, st.a), 0) << ops->last_error();
    *st.pinned = 2;
    ASSERT_EQ(ops->stream_synchronize(st.a), 0) << ops->last_error();
    EXPECT_EQ(st.get(st.device), std::string(order) == "sync" ? 1 : 2);
    // A pageable source is staged at the call: what it holds after does not land.
    int32_t pageable = 3;
    ASSERT_EQ(ops->memcpy_async(st.device, &pageable, 4, st.a), 0) << ops->last_error();
    pageable = 4;
    ASSERT_EQ(ops->stream_synchronize(st.a), 0) << ops->last_error();
    EXPECT_EQ(st.get(st.device), 3);
    // A copy into pinned memory lands when the host waits, not before.
    *st.pinned = 5;
    ASSERT_EQ(ops->memcpy_async(st.pinned, st.device, 4, st.a), 0) << ops->last_error();
    EXPECT_EQ(*st.pinned, std::string(order) == "sync" ? 3 : 5);
    ASSERT_EQ(ops->stream_synchronize(st.a), 0) << ops->last_error();
    EXPECT_EQ(*st.pinned, 3);
  }
}

// Two streams without an event between them: "late" never runs the other stream's work for a
// wait on this one, "others-first" runs it first; an event wait orders them under every order.
TEST_F(CudaEmulation, StreamsAreOrderedOnlyByEvents) {
  for (const char* order : kOrders) {
    SCOPED_TRACE(order);
    const ScopedOrder scoped(order);
    Streams st(ops);
    int32_t* x = st.device;
    int32_t* y = st.device + 1;
    st.set(x, 1, st.a);
    ASSERT_EQ(ops->stream_synchronize(st.a), 0) << ops->last_error();
    st.set(x, 2, st.b);                                     // b: x = 2
    ASSERT_EQ(ops->memcpy_async(y, x, 4, st.a), 0);         // a: y = x, unordered with b
    EXPECT_EQ(st.get(y), std::string(order) == "late" ? 1 : 2);
    st.set(x, 3, st.b);
    ASSERT_EQ(ops->event_record(st.e, st.b), 0) << ops->last_error();
    st.set(x, 4, st.b);                                     // after the record: not waited for
    // A query runs nothing: until a wait has run b's work, the record has not passed.
    auto passed = [&](KtierCudaEvent e) {
      int p = -1;
      EXPECT_EQ(ops->event_query(e, &p), 0) << ops->last_error();
      return p;
    };
    EXPECT_EQ(passed(st.e), std::string(order) == "sync" ? 1 : 0);
    // "Not ready" is not an error: the next launch does not report it (the emulation records
    // it as the last error, as some runtimes do).
    float* scratch = reinterpret_cast<float*>(st.pinned);  // unused by this test otherwise
    EXPECT_EQ(ops->sigmoid(scratch, 1, scratch, st.b), 0) << ops->last_error();
    ASSERT_EQ(ops->stream_wait_event(st.a, st.e), 0) << ops->last_error();
    ASSERT_EQ(ops->memcpy_async(y, x, 4, st.a), 0);         // a: y = x, after b's x = 3
    EXPECT_EQ(st.get(y), std::string(order) == "late" ? 3 : 4);
    ASSERT_EQ(ops->stream_synchronize(st.b), 0) << ops->last_error();
    EXPECT_EQ(passed(st.e), 1);
    EXPECT_EQ(st.get(x), 4);
    // A wait is for the record before it: recording the event again after does not move it.
    ASSERT_EQ(ops->event_record(st.e, st.b), 0) << ops->last_error();  // b: nothing queued
    ASSERT_EQ(ops->stream_wait_event(st.a, st.e), 0) << ops->last_error();
    st.set(x, 5, st.b);
    ASSERT_EQ(ops->event_record(st.e, st.b), 0) << ops->last_error();  // after x = 5
    ASSERT_EQ(ops->memcpy_async(y, x, 4, st.a), 0);
    EXPECT_EQ(st.get(y), std::string(order) == "late" ? 4 : 5);
    // An event never recorded is complete: a wait for it waits for nothing.
    KtierCudaEvent fresh = nullptr;
    ASSERT_EQ(ops->event_create(&fresh), 0) << ops->last_error();
    EXPECT_EQ(passed(fresh), 1);
    ASSERT_EQ(ops->stream_wait_event(st.a, fresh), 0) << ops->last_error();
    EXPECT_EQ(ops->event_synchronize(fresh), 0) << ops->last_error();
    EXPECT_EQ(st.get(y), std::string(order) == "late" ? 4 : 5);
    EXPECT_EQ(ops->event_destroy(fresh), 0) << ops->last_error();
  }
}

// "random:SEED" draws how much of the other streams' queued work runs before a host wait's:
// over seeds, an unordered pair of streams is seen both ways, and never any other way.
TEST_F(CudaEmulation, RandomOrdersLieBetweenLateAndOthersFirst) {
  std::set<int32_t> seen;
  for (int seed = 1; seed <= 16; ++seed) {
    const std::string order = "random:" + std::to_string(seed);
    SCOPED_TRACE(order);
    const ScopedOrder scoped(order.c_str());
    Streams st(ops);
    int32_t* x = st.device;
    int32_t* y = st.device + 1;
    st.set(x, 1, st.a);
    ASSERT_EQ(ops->stream_synchronize(st.a), 0) << ops->last_error();
    st.set(x, 2, st.b);
    st.set(x, 3, st.b);
    ASSERT_EQ(ops->memcpy_async(y, x, 4, st.a), 0);  // unordered with b
    const int32_t got = st.get(y);
    EXPECT_TRUE(got == 1 || got == 2 || got == 3) << got;
    seen.insert(got);
    ASSERT_EQ(ops->stream_synchronize(st.b), 0) << ops->last_error();
    EXPECT_EQ(st.get(x), 3);  // b's own order holds
  }
  EXPECT_EQ(seen, (std::set<int32_t>{1, 2, 3}));
}

// Unpinning memory a queued copy still reads moves unpinned pages on a GPU: the host must wait
// for the copy first. The emulation aborts; after the wait, unpinning is fine.
TEST_F(CudaEmulation, UnpinningMemoryAQueuedCopyReadsAborts) {
  const ScopedOrder scoped("late");
  Streams st(ops);
  std::vector<int32_t> host(1024, 7);
  ASSERT_EQ(ops->host_register(host.data(), host.size() * 4), 0) << ops->last_error();
  ASSERT_EQ(ops->memcpy_async(st.device, host.data() + 100, 4, st.a), 0) << ops->last_error();
  EXPECT_DEATH(ops->host_unregister(host.data()), "cudaHostUnregister .* still uses");
  ASSERT_EQ(ops->stream_synchronize(st.a), 0) << ops->last_error();
  EXPECT_EQ(ops->host_unregister(host.data()), 0) << ops->last_error();
  EXPECT_EQ(st.get(st.device), 7);
}

// A device free (cudaFree: the op table has no stream-ordered one) is checked at the call: a
// second free of the same block, or a free of host memory, fails there and frees nothing.
TEST_F(CudaEmulation, FreesAreCheckedAtTheCall) {
  const ScopedOrder scoped("late");
  ASSERT_EQ(ops->init(0), 0) << ops->last_error();
  size_t free_before = 0, free_after = 0, total = 0;
  ASSERT_EQ(ops->mem_info(&free_before, &total), 0) << ops->last_error();
  void* block = nullptr;
  ASSERT_EQ(ops->malloc_device(&block, 1 << 20), 0) << ops->last_error();
  ASSERT_EQ(ops->free_device(block), 0) << ops->last_error();
  EXPECT_NE(ops->free_device(block), 0);  // not a live block any more
  int32_t local = 0;
  EXPECT_NE(ops->free_device(&local), 0);  // never one
  ASSERT_EQ(ops->mem_info(&free_after, &total), 0) << ops->last_error();
  EXPECT_EQ(free_after, free_before);
}

}  // namespace
}  // namespace ktier::backend

// Host emulation of the CUDA runtime and cuBLAS subset declared in cuda_runtime.h and
// cublas_v2.h: the block scheduler (fibers, barriers, warp exchange), memory, copies and the
// GEMMs, queued on streams.cpp's streams. Test-only (cuda/emulation/README.md).
#include <sys/mman.h>
#include <unistd.h>

#include <boost/context/fiber.hpp>
#include <boost/context/stack_context.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cublas_v2.h"
#include "cuda_runtime.h"
#include "streams.h"

namespace ktier_emu {

thread_local const ThreadState* g_thread = nullptr;

namespace {
thread_local cudaError_t g_last_error = cudaSuccess;
}  // namespace

cudaError_t fail(cudaError_t e) {
  g_last_error = e;
  return e;
}

namespace {

namespace bctx = boost::context;

[[noreturn]] void die(const char* kernel, const std::string& what) {
  std::fprintf(stderr, "ktier CUDA emulation: kernel %s: %s\n", kernel, what.c_str());
  std::abort();
}

size_t page_bytes() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// ---- fiber stacks: reused across blocks on one host thread, each above a guard page ----

constexpr size_t kStackBytes = 128 * 1024;

struct StackPool {
  std::vector<char*> free;  // usable bottoms; the mappings live as long as the thread
  ~StackPool() {
    for (char* base : free) munmap(base - page_bytes(), kStackBytes + page_bytes());
  }
};
thread_local StackPool g_stacks;

// Boost.Context StackAllocator over g_stacks (a handle: copied into each fiber).
struct PooledStack {
  bctx::stack_context allocate() {
    if (g_stacks.free.empty()) {
      void* m = mmap(nullptr, kStackBytes + page_bytes(), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED || mprotect(m, page_bytes(), PROT_NONE) != 0) {
        std::fprintf(stderr, "ktier CUDA emulation: cannot map a fiber stack\n");
        std::abort();
      }
      g_stacks.free.push_back(static_cast<char*>(m) + page_bytes());
    }
    char* base = g_stacks.free.back();
    g_stacks.free.pop_back();
    bctx::stack_context sc;
    sc.size = kStackBytes;
    sc.sp = base + kStackBytes;  // stacks grow down
    return sc;
  }
  void deallocate(bctx::stack_context& sc) noexcept {
    g_stacks.free.push_back(static_cast<char*>(sc.sp) - kStackBytes);
  }
};

constexpr uint64_t kDefaultDeviceBytes = uint64_t{16} << 30;

struct Device {
  std::mutex mu;
  uint64_t total = kDefaultDeviceBytes;
  uint64_t used = 0;
  std::map<void*, size_t> device_blocks;  // mappings of whole pages: address -> length
  int work_in_flight = 0;  // kernels, copies, memsets and GEMMs running: device memory is open
  std::condition_variable idle;  // work_in_flight fell to 0
  std::map<void*, size_t> host_blocks, registered;  // pinned host memory: start -> bytes
  std::set<void*> freeing;  // device blocks whose free is queued (cudaFreeAsync) or running
  // Pinned host bytes that queued copies will read or write: number -> (start, bytes).
  std::map<uint64_t, std::pair<const char*, size_t>> queued_host_bytes;
  uint64_t next_copy = 0;
};
Device& dev() {
  static Device* d = [] {
    auto* p = new Device;  // never destroyed: frees may come from static destructors
    // Debugging only (docs/TUNING.md): the emulated device's memory, in MiB.
    if (const char* s = std::getenv("KTIER_CUDA_EMULATION_MIB"); s && *s) {
      const bool digits = std::strspn(s, "0123456789") == std::strlen(s) && std::strlen(s) <= 10;
      const unsigned long long mib = digits ? std::strtoull(s, nullptr, 10) : 0;
      if (mib == 0 || mib >= (1ull << 30)) {
        std::fprintf(stderr, "ktier CUDA emulation: KTIER_CUDA_EMULATION_MIB=\"%s\": not a "
                     "whole number of MiB from 1 to 2^30 - 1\n", s);
        std::abort();  // a test's set-up, like the other emulation variables
      }
      p->total = static_cast<uint64_t>(mib) << 20;
    }
    return p;
  }();
  return *d;
}
// Device memory is open to the host only while the emulated device works on it (any thread):
// a host read or write of it elsewhere faults, as it would on a GPU.
void set_device_access(Device& d, int prot) {
  for (const auto& [p, n] : d.device_blocks) {
    if (mprotect(p, n, prot) != 0) {
      std::perror("ktier CUDA emulation: mprotect of device memory");
      std::abort();
    }
  }
}
class DeviceWork {
 public:
  DeviceWork() {
    Device& d = dev();
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.work_in_flight++ == 0) set_device_access(d, PROT_READ | PROT_WRITE);
  }
  ~DeviceWork() {
    Device& d = dev();
    std::lock_guard<std::mutex> lock(d.mu);
    if (--d.work_in_flight == 0) {
      set_device_access(d, PROT_NONE);
      d.idle.notify_all();
    }
  }
  DeviceWork(const DeviceWork&) = delete;
  DeviceWork& operator=(const DeviceWork&) = delete;
};

// ---- one block's threads ----

struct KernelThread {
  ThreadState state;
  bctx::fiber fiber;   // the thread, while suspended
  bctx::fiber caller;  // the scheduler, while the thread runs
  bool done = false;
  enum Wait { kRunning, kBlockBarrier, kWarpBarrier } wait = kRunning;
};

struct Warp {
  int lanes = 0;     // threads of the block in this warp
  int arrived = 0;
  uint64_t gen = 0;
  unsigned char slot[32][8];
};

struct BlockRun {
  const char* kernel = "";
  size_t dynamic_shared = 0, shared_limit = 0;  // bytes: the launch's, static + dynamic
  std::vector<const void*> static_shared;       // arrays poisoned in this block
  size_t static_shared_bytes = 0;
  std::vector<KernelThread> threads;
  std::vector<Warp> warps;
  int live = 0;
  int block_arrived = 0;
  uint64_t block_gen = 0;
  uint64_t progress = 0;  // arrivals, releases and exits: a round without any is a deadlock
};

thread_local BlockRun* g_block = nullptr;
thread_local KernelThread* g_self = nullptr;
thread_local std::vector<double> g_dynamic_shared;  // doubles: 8-byte alignment at least

void yield(KernelThread* me) { me->caller = std::move(me->caller).resume(); }

int linear_tid(const ThreadState& s) {
  return static_cast<int>(s.thread_idx.x + s.block_dim.x * (s.thread_idx.y +
                                                            s.block_dim.y * s.thread_idx.z));
}

void release_block_barrier_if_complete(BlockRun& b) {
  if (b.block_arrived > 0 && b.block_arrived == b.live) {
    b.block_arrived = 0;
    ++b.block_gen;
    ++b.progress;
  }
}

std::string describe_waits(const BlockRun& b) {
  int at_block = 0, at_warp = 0, done = 0;
  for (const KernelThread& t : b.threads) {
    done += t.done;
    at_block += !t.done && t.wait == KernelThread::kBlockBarrier;
    at_warp += !t.done && t.wait == KernelThread::kWarpBarrier;
  }
  const ThreadState& s = b.threads.front().state;
  return "block (" + std::to_string(s.block_idx.x) + "," + std::to_string(s.block_idx.y) + "," +
         std::to_string(s.block_idx.z) + ") cannot go on: " + std::to_string(at_block) +
         " threads wait at __syncthreads, " + std::to_string(at_warp) +
         " at a warp shuffle, " + std::to_string(done) + " exited (a barrier or a full-mask " +
         "shuffle that some threads never reach)";
}

void run_block(BlockRun& b, const ThreadState& proto, void (*body)(void*), void* arg) {
  const int n = static_cast<int>(proto.block_dim.x * proto.block_dim.y * proto.block_dim.z);
  b.threads.clear();
  b.threads.resize(static_cast<size_t>(n));
  b.warps.assign(static_cast<size_t>((n + 31) / 32), Warp{});
  b.live = n;
  b.block_arrived = 0;
  b.static_shared.clear();
  b.static_shared_bytes = 0;
  for (int i = 0; i < n; ++i) {
    KernelThread& t = b.threads[static_cast<size_t>(i)];
    t.state = proto;
    t.state.thread_idx = {static_cast<unsigned>(i) % proto.block_dim.x,
                          static_cast<unsigned>(i) / proto.block_dim.x % proto.block_dim.y,
                          static_cast<unsigned>(i) / (proto.block_dim.x * proto.block_dim.y)};
    ++b.warps[static_cast<size_t>(i / 32)].lanes;
    t.fiber = bctx::fiber(std::allocator_arg, PooledStack{},
                          [&t, body, arg](bctx::fiber&& scheduler) {
                            t.caller = std::move(scheduler);
                            body(arg);
                            t.done = true;
                            return std::move(t.caller);
                          });
  }
  if (!g_dynamic_shared.empty())
    std::memset(g_dynamic_shared.data(), 0xff, g_dynamic_shared.size() * sizeof(double));
  // Threads run in increasing order in one block and decreasing in the next, so that a read of
  // another thread's write with no barrier between sees the stale (or poisoned) value in one of
  // the two, whichever thread comes first.
  static thread_local bool g_reverse = false;
  g_reverse = !g_reverse;
  while (b.live > 0) {
    const uint64_t before = b.progress;
    for (int k = 0; k < n; ++k) {
      const int i = g_reverse ? n - 1 - k : k;
      KernelThread& t = b.threads[static_cast<size_t>(i)];
      if (t.done) continue;
      g_self = &t;
      g_thread = &t.state;
      t.fiber = std::move(t.fiber).resume();
      if (t.done) {
        --b.live;
        ++b.progress;
        release_block_barrier_if_complete(b);
      }
    }
    if (b.live > 0 && b.progress == before) die(b.kernel, describe_waits(b));
  }
  g_self = nullptr;
  g_thread = nullptr;
}

std::mutex g_kernel_mu;
std::map<const void*, int> g_max_dynamic_shared;  // opted in by cudaFuncSetAttribute

constexpr int kDefaultDynamicShared = 48 * 1024, kMaxOptInShared = 227 * 1024;
constexpr size_t kMaxParamBytes = 4096;  // the classic limit the module keeps under

}  // namespace

void syncthreads() {
  KernelThread* me = g_self;
  BlockRun& b = *g_block;
  const uint64_t gen = b.block_gen;
  me->wait = KernelThread::kBlockBarrier;
  ++b.block_arrived;
  ++b.progress;
  release_block_barrier_if_complete(b);
  while (b.block_gen == gen) yield(me);
  me->wait = KernelThread::kRunning;
}

void warp_exchange(unsigned mask, const void* in, size_t bytes, int lane_mask, void* out) {
  KernelThread* me = g_self;
  BlockRun& b = *g_block;
  const int tid = linear_tid(me->state), lane = tid % 32;
  const int src_lane = lane ^ lane_mask;
  Warp& w = b.warps[static_cast<size_t>(tid / 32)];
  const unsigned full = w.lanes == 32 ? 0xffffffffu : (1u << w.lanes) - 1u;
  if (mask != full)
    die(b.kernel, "shuffle mask " + std::to_string(mask) + " is not the warp's " +
                      std::to_string(w.lanes) + " lanes (partial masks are not emulated)");
  if (lane_mask < 0 || src_lane >= w.lanes)
    die(b.kernel, "shuffle reads lane " + std::to_string(src_lane) + " of a warp of " +
                      std::to_string(w.lanes));
  std::memcpy(w.slot[lane], in, bytes);
  // Two phases: every lane has written before any reads, and has read before any writes again.
  for (int phase = 0; phase < 2; ++phase) {
    const uint64_t gen = w.gen;
    me->wait = KernelThread::kWarpBarrier;
    ++b.progress;
    if (++w.arrived == w.lanes) {
      w.arrived = 0;
      ++w.gen;
    }
    while (w.gen == gen) yield(me);
    me->wait = KernelThread::kRunning;
    if (phase == 0) std::memcpy(out, w.slot[src_lane], bytes);
  }
}

void* dynamic_shared() { return g_dynamic_shared.data(); }

void shared_array(void* p, size_t bytes) {
  BlockRun& b = *g_block;
  for (const void* seen : b.static_shared)
    if (seen == p) return;
  b.static_shared.push_back(p);
  b.static_shared_bytes += bytes;
  if (b.static_shared_bytes + b.dynamic_shared > b.shared_limit)
    die(b.kernel, std::to_string(b.static_shared_bytes) + " bytes of static and " +
                      std::to_string(b.dynamic_shared) + " of dynamic shared memory: over " +
                      std::to_string(b.shared_limit));
  std::memset(p, 0xff, bytes);
}

void check_aligned(const void* p, size_t alignment, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0)
    die(g_block ? g_block->kernel : "?",
        std::string(what) + ": address not a multiple of " + std::to_string(alignment));
}

void abort_in_kernel(const char* what) { die(g_block ? g_block->kernel : "?", what); }

cudaError_t set_max_dynamic_shared(const void* kernel, int bytes) {
  if (bytes < 0 || bytes > kMaxOptInShared) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(g_kernel_mu);
  g_max_dynamic_shared[kernel] = bytes;
  return cudaSuccess;
}

int max_dynamic_shared(const void* kernel) {
  std::lock_guard<std::mutex> lock(g_kernel_mu);
  const auto it = g_max_dynamic_shared.find(kernel);
  return it == g_max_dynamic_shared.end() ? kDefaultDynamicShared : it->second;
}

namespace {
bool opted_in(const void* kernel) {
  std::lock_guard<std::mutex> lock(g_kernel_mu);
  return g_max_dynamic_shared.count(kernel) != 0;
}

// Alternates per kernel (not per launch: a fixed sequence of launches would run some kernel the
// same way every time): true on a kernel's 1st, 3rd... run.
bool next_blocks_reversed(const void* kernel) {
  std::lock_guard<std::mutex> lock(g_kernel_mu);
  static std::map<const void*, bool> reversed;
  bool& r = reversed[kernel];
  r = !r;
  return r;
}

// Runs every block of a launch checked by launch_grid on the calling thread.
void run_grid(const char* kernel_name, const void* kernel, dim3 grid, dim3 block,
              size_t dynamic_shared_bytes, size_t shared_limit, void (*body)(void*), void* arg) {
  g_dynamic_shared.assign((dynamic_shared_bytes + 7) / 8, 0.0);
  const DeviceWork work;
  BlockRun b;
  b.kernel = kernel_name;
  b.dynamic_shared = dynamic_shared_bytes;
  b.shared_limit = shared_limit;
  g_block = &b;
  ThreadState proto{};
  proto.block_dim = block;
  proto.grid_dim = grid;
  // A kernel's blocks run in increasing order in one launch and decreasing in its next: a block
  // that reads what another block of the same launch writes (a race on a GPU, where blocks run
  // in any order and at once) sees the value from before the launch in one of the two.
  const bool reverse = next_blocks_reversed(kernel);
  const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
  for (uint64_t k = 0; k < blocks; ++k) {
    const uint64_t i = reverse ? blocks - 1 - k : k;
    proto.block_idx = {static_cast<unsigned>(i % grid.x),
                       static_cast<unsigned>(i / grid.x % grid.y),
                       static_cast<unsigned>(i / (uint64_t{grid.x} * grid.y))};
    run_block(b, proto, body, arg);
  }
  g_block = nullptr;
}

}  // namespace

cudaError_t launch_grid(const char* kernel_name, const void* kernel, dim3 grid, dim3 block,
                        size_t dynamic_shared_bytes, size_t param_bytes, cudaStream_t stream,
                        void (*body)(void*), std::shared_ptr<void> arg) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 ||
      grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
    std::fprintf(stderr, "ktier CUDA emulation: kernel %s: launch grid (%u,%u,%u) block "
                 "(%u,%u,%u) is invalid\n", kernel_name, grid.x, grid.y, grid.z, block.x,
                 block.y, block.z);
    return fail(cudaErrorInvalidConfiguration);
  }
  if (dynamic_shared_bytes > static_cast<size_t>(max_dynamic_shared(kernel))) {
    std::fprintf(stderr, "ktier CUDA emulation: kernel %s: %zu bytes of dynamic shared memory "
                 "without opting in\n", kernel_name, dynamic_shared_bytes);
    return fail(cudaErrorInvalidValue);
  }
  if (param_bytes > kMaxParamBytes)
    die(kernel_name, std::to_string(param_bytes) + " bytes of kernel parameters");
  if (g_block) die(kernel_name, "launched from inside a kernel");
  // Static and dynamic together: 48 KiB, or the opt-in maximum if the kernel had opted in by
  // the launch.
  const size_t shared_limit = opted_in(kernel) ? kMaxOptInShared : kDefaultDynamicShared;
  // The parameters (arg) live as long as the queued launch.
  return enqueue(stream, [=] {
    run_grid(kernel_name, kernel, grid, block, dynamic_shared_bytes, shared_limit, body,
             arg.get());
  });
}

}  // namespace ktier_emu

// ---- runtime API ---------------------------------------------------------------------------

using ktier_emu::dev;
using ktier_emu::Device;
using ktier_emu::DeviceWork;
using ktier_emu::fail;

namespace {

thread_local int g_device = 0;

// Whether the emulated device has memory pools (KTIER_CUDA_EMULATION_MEMORY_POOLS: 1, the
// default; 0; or "claimed": the attribute says 1 and stream-ordered allocation still fails, as
// a virtualised driver may; any other value aborts).
enum class Pools { kNone, kYes, kClaimed };
Pools memory_pools_mode() {
  static const Pools pools = [] {
    const char* v = std::getenv("KTIER_CUDA_EMULATION_MEMORY_POOLS");
    if (!v || !*v || std::strcmp(v, "1") == 0) return Pools::kYes;
    if (std::strcmp(v, "0") == 0) return Pools::kNone;
    if (std::strcmp(v, "claimed") == 0) return Pools::kClaimed;
    std::fprintf(stderr,
                 "ktier CUDA emulation: KTIER_CUDA_EMULATION_MEMORY_POOLS=%s: not 0, 1 or "
                 "claimed\n", v);
    std::abort();
  }();
  return pools;
}
bool memory_pools() { return memory_pools_mode() == Pools::kYes; }

}  // namespace

cudaError_t cudaGetLastError() {
  const cudaError_t e = ktier_emu::g_last_error;
  ktier_emu::g_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return ktier_emu::g_last_error; }
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    default: return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : "emulated CUDA error";
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice);
  std::memset(p, 0, sizeof(*p));
  std::snprintf(p->name, sizeof(p->name), "ktier host emulation");
  p->totalGlobalMem = dev().total;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 1;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice);
  if (attr != cudaDevAttrMemoryPoolsSupported) return fail(cudaErrorInvalidValue);
  *value = memory_pools_mode() != Pools::kNone ? 1 : 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice);
  g_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = g_device;
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  Device& d = dev();
  std::lock_guard<std::mutex> lock(d.mu);
  *free_bytes = d.total - d.used;
  *total_bytes = d.total;
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t bytes) {
  Device& d = dev();
  std::lock_guard<std::mutex> lock(d.mu);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  if (bytes > d.total - d.used) return fail(cudaErrorMemoryAllocation);
  const size_t length = (bytes + ktier_emu::page_bytes() - 1) / ktier_emu::page_bytes() *
                        ktier_emu::page_bytes();
  void* block = mmap(nullptr, length, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (block == MAP_FAILED) return fail(cudaErrorMemoryAllocation);
  // A GPU's new memory holds whatever was there: all bits set (NaN), so that a read before the
  // first write shows, where fresh pages would read as zeros.
  std::memset(block, 0xff, bytes);
  if (d.work_in_flight == 0 && mprotect(block, length, PROT_NONE) != 0) {
    munmap(block, length);
    return fail(cudaErrorMemoryAllocation);
  }
  d.device_blocks[block] = length;
  d.used += length;
  *p = block;
  return cudaSuccess;
}
namespace {

// Marks the device block p as being freed, if it is one and not already (Device::mu not held):
// a free is checked at the call, though it may run later.
cudaError_t claim_for_free(void* p) {
  Device& d = dev();
  std::lock_guard<std::mutex> lock(d.mu);
  if (!d.device_blocks.count(p) || !d.freeing.insert(p).second)
    return fail(cudaErrorInvalidValue);
  return cudaSuccess;
}

// Unmaps a claimed device block once no device work runs on any thread (Device::mu not held).
void free_block(void* p) {
  Device& d = dev();
  std::unique_lock<std::mutex> lock(d.mu);
  d.idle.wait(lock, [&d] { return d.work_in_flight == 0; });
  const auto it = d.device_blocks.find(p);
  d.freeing.erase(p);
  d.used -= it->second;
  if (munmap(p, it->second) != 0) {
    std::perror("ktier CUDA emulation: munmap of device memory");
    std::abort();
  }
  d.device_blocks.erase(it);
}

// The start of the block of `blocks` (start -> bytes) that holds p, or nullptr.
void* block_of(const std::map<void*, size_t>& blocks, const void* p) {
  auto it = blocks.upper_bound(const_cast<void*>(p));
  if (it == blocks.begin()) return nullptr;
  --it;
  return static_cast<const char*>(p) < static_cast<const char*>(it->first) + it->second
             ? it->first
             : nullptr;
}
bool inside(const std::map<void*, size_t>& blocks, const void* p) {
  return block_of(blocks, p) != nullptr;
}

bool is_device(const void* p) {
  Device& d = dev();
  std::lock_guard<std::mutex> lock(d.mu);
  return inside(d.device_blocks, p);
}
// Inside a device block whose free was called (queued or run): a kernel given it reads freed
// memory.
bool is_being_freed(const void* p) {
  Device& d = dev();
  std::lock_guard<std::mutex> lock(d.mu);
  void* block = block_of(d.device_blocks, p);
  return block && d.freeing.count(block) != 0;
}
// A queued copy no longer uses its pinned host bytes (it ran, or was never queued).
void forget_queued_host_bytes(uint64_t number) {
  Device& d = dev();
  std::lock_guard<std::mutex> lock(d.mu);
  d.queued_host_bytes.erase(number);
}
bool is_pinned(const void* p) {
  Device& d = dev();
  std::lock_guard<std::mutex> lock(d.mu);
  return inside(d.host_blocks, p) || inside(d.registered, p);
}

}  // namespace

void ktier_emu::check_device_pointer(const char* kernel, int index, const void* p) {
  if (!p) return;
  const std::string what = "parameter " + std::to_string(index) + " (" +
                           std::to_string(reinterpret_cast<uintptr_t>(p)) + ")";
  if (!is_device(p) && !is_pinned(p))
    die(kernel, what + " is neither device nor pinned host memory");
  if (is_being_freed(p)) die(kernel, what + " is in device memory already freed");
}

cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  if (const cudaError_t e = claim_for_free(p); e != cudaSuccess) return e;
  ktier_emu::synchronize_all();  // cudaFree synchronises the device
  free_block(p);
  return cudaSuccess;
}
// Stream-ordered allocation is not modelled: a block is new memory at once, and a pool's reuse
// of freed blocks across streams is never shown.
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t) {
  if (!memory_pools()) return fail(cudaErrorNotSupported);
  return cudaMalloc(p, bytes);
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t s) {
  if (!memory_pools()) return fail(cudaErrorNotSupported);
  if (!p) return cudaSuccess;
  if (const cudaError_t e = claim_for_free(p); e != cudaSuccess) return e;
  const cudaError_t queued = ktier_emu::enqueue(s, [p] { free_block(p); });
  if (queued != cudaSuccess) {  // an invalid stream: the block stays live
    Device& d = dev();
    std::lock_guard<std::mutex> lock(d.mu);
    d.freeing.erase(p);
  }
  return queued;
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) {
  void* block = nullptr;
  if (posix_memalign(&block, 4096, bytes ? bytes : 1) != 0) return fail(cudaErrorMemoryAllocation);
  Device& d = dev();
  std::lock_guard<std::mutex> lock(d.mu);
  d.host_blocks[block] = bytes;
  *p = block;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  if (!p) return cudaSuccess;
  ktier_emu::synchronize_all();  // as the runtime: queued copies may read it
  Device& d = dev();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.host_blocks.erase(p) == 0) return fail(cudaErrorInvalidValue);
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned) {
  Device& d = dev();
  std::lock_guard<std::mutex> lock(d.mu);
  if (!d.registered.emplace(p, bytes).second)
    return fail(cudaErrorInvalidValue);
  return cudaSuccess;
}
// Not a synchronisation point (the runtime does not document one): a copy still queued on the
// memory would move unpinned pages on a GPU, so the host must have waited for it; here that
// aborts.
cudaError_t cudaHostUnregister(void* p) {
  Device& d = dev();
  std::lock_guard<std::mutex> lock(d.mu);
  const auto it = d.registered.find(p);
  if (it == d.registered.end()) return fail(cudaErrorInvalidValue);
  const char* begin = static_cast<const char*>(p);
  for (const auto& [number, range] : d.queued_host_bytes)
    if (range.first < begin + it->second && begin < range.first + range.second) {
      std::fprintf(stderr, "ktier CUDA emulation: cudaHostUnregister of %zu bytes at %p that a "
                   "queued copy (%zu bytes at %p) still uses: the host did not wait for it\n",
                   it->second, p, range.second, static_cast<const void*>(range.first));
      std::abort();
    }
  d.registered.erase(it);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t s) {
  if (bytes > 0 && (!dst || !src)) return fail(cudaErrorInvalidValue);
  if (bytes == 0) return ktier_emu::enqueue(s, [] {});
  // Device memory and pinned host memory are read and written when the stream gets to the copy.
  // Pageable host memory is read at the call and written before the call returns, as the
  // runtime stages it; a copy between host buffers returns once done.
  const bool src_device = is_device(src), dst_device = is_device(dst);
  std::shared_ptr<std::vector<char>> staged;
  if (!src_device && !is_pinned(src))
    staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                 static_cast<const char*>(src) + bytes);
  // The pinned host side of a queued copy, which cudaHostUnregister must not take away.
  uint64_t number = 0;
  const char* host_side = !staged && !src_device ? static_cast<const char*>(src)
                          : !dst_device          ? static_cast<const char*>(dst)
                                                 : nullptr;
  if (host_side) {
    Device& d = dev();
    std::lock_guard<std::mutex> lock(d.mu);
    number = ++d.next_copy;
    d.queued_host_bytes[number] = {host_side, bytes};
  }
  auto copy = [dst, src, bytes, staged, number] {
    const DeviceWork work;
    std::memmove(dst, staged ? staged->data() : src, bytes);
    if (number) forget_queued_host_bytes(number);
  };
  const bool waits = !dst_device && (!is_pinned(dst) || !src_device);
  const cudaError_t e = waits ? ktier_emu::enqueue_and_wait(s, copy) : ktier_emu::enqueue(s, copy);
  if (e != cudaSuccess && number) forget_queued_host_bytes(number);  // not queued: bad stream
  return e;
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t s) {
  if (bytes > 0 && !dst) return fail(cudaErrorInvalidValue);
  return ktier_emu::enqueue(s, [dst, value, bytes] {
    const DeviceWork work;
    if (bytes > 0) std::memset(dst, value, bytes);
  });
}

// ---- cuBLAS ----------------------------------------------------------------------------------

struct cublasContext {
  cudaStream_t stream = nullptr;
};

cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
  *h = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t) {
  return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

namespace {

float element(const void* base, cudaDataType type, int64_t i) {
  if (type == CUDA_R_32F) return static_cast<const float*>(base)[i];
  return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}

// C[m, n] (column-major, ldc) = alpha * op(A)[m, k] op(B)[k, n] + beta * C; C is not read when
// beta == 0 (as cuBLAS). f32 sums in k order. Queued on the handle's stream; alpha and beta are
// read at the call (host pointer mode).
cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                    int k, float alpha, const void* A, cudaDataType at, int lda, const void* B,
                    cudaDataType bt, int ldb, float beta, float* C, int ldc) {
  if (m < 0 || n < 0 || k < 0 || ldc < (m > 1 ? m : 1) ||
      lda < ((ta == CUBLAS_OP_N ? m : k) > 1 ? (ta == CUBLAS_OP_N ? m : k) : 1) ||
      ldb < ((tb == CUBLAS_OP_N ? k : n) > 1 ? (tb == CUBLAS_OP_N ? k : n) : 1))
    return CUBLAS_STATUS_INVALID_VALUE;
  const cudaError_t queued = ktier_emu::enqueue(h->stream, [=] {
    const DeviceWork work;
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        float acc = 0.0f;
        for (int l = 0; l < k; ++l) {
          const int64_t ai = ta == CUBLAS_OP_N ? i + int64_t{l} * lda : l + int64_t{i} * lda;
          const int64_t bi = tb == CUBLAS_OP_N ? l + int64_t{j} * ldb : j + int64_t{l} * ldb;
          acc = std::fma(element(A, at, ai), element(B, bt, bi), acc);
        }
        float& c = C[i + int64_t{j} * ldc];
        c = beta == 0.0f ? alpha * acc : alpha * acc + beta * c;
      }
  });
  return queued == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // namespace

cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                              int n, int k, const float* alpha, const float* A, int lda,
                              const float* B, int ldb, const float* beta, float* C, int ldc) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  return gemm(h, ta, tb, m, n, k, *alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, *beta, C, ldc);
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void* alpha, const void* A, cudaDataType a_type,
                            int lda, const void* B, cudaDataType b_type, int ldb,
                            const void* beta, void* C, cudaDataType c_type, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  // The two combinations cuBLAS documents for these types: bf16 x bf16 -> f32, f32 x f32 -> f32.
  if (c_type != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F || a_type != b_type ||
      (a_type != CUDA_R_16BF && a_type != CUDA_R_32F))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return gemm(h, ta, tb, m, n, k, *static_cast<const float*>(alpha), A, a_type, lda, B, b_type,
              ldb, *static_cast<const float*>(beta), static_cast<float*>(C), ldc);
}

#pragma once
// Host emulation of the part of the CUDA runtime, device built-ins and intrinsics that
// libktier_cuda.so uses, so that the module's own kernel source runs on a machine without a GPU
// (cuda/emulation/README.md). Test-only: the emulated module is never installed or shipped.
//
// Model: one device (compute 9.0); device memory is host memory; launches, copies and GEMMs are
// checked at the call and queued on their stream, run when a host wait needs them (streams.h).
// A block's threads are fibers on the host thread that runs the launch, switched at
// __syncthreads() and at warp shuffles, so barriers and shuffles have CUDA's meaning. Aborted
// with the kernel named: a barrier some threads never reach, a full-mask shuffle in a warp with
// a lane that has exited (stricter than CUDA, which only leaves the value read from such a lane
// undefined), a misaligned vector load, shared memory past the launch's limit, a pointer
// parameter that is neither device nor pinned host memory. Device memory is unreadable
// by the host outside the emulated device's own work (kernels, copies, GEMMs): a host access is
// a SIGSEGV. __shared__ arrays are per host thread (one block at a time per thread); all shared
// memory is poisoned (every bit set: NaN) at the start of each block.
// Arithmetic: IEEE f32/f64 with no contraction (built with -ffp-contract=off), so an intrinsic
// like __fmaf_rn is the one fused operation, as on the device; transcendental functions are
// glibc's (within the device's documented ulp bounds, not bit-equal to them).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- qualifiers ------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __grid_constant__
#define __launch_bounds__(...)
#define KTIER_CUDA_EMULATION 1

// ---- vector and scalar types -----------------------------------------------------------------
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
  unsigned x, y, z;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

struct __half {
  uint16_t bits;
};
struct alignas(4) __half2 {
  __half x, y;
};
struct __nv_bfloat16 {
  uint16_t bits;
};

// ---- errors, streams, events, properties -----------------------------------------------------
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorNotSupported = 801,
  cudaErrorUnknown = 999,
};
using cudaError = cudaError_t;
struct CUstream_st;
struct CUevent_st;
using cudaStream_t = CUstream_st*;
using cudaEvent_t = CUevent_st*;
enum cudaMemcpyKind { cudaMemcpyDefault = 4 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDeviceAttr { cudaDevAttrMemoryPoolsSupported = 115 };
enum cudaDataType { CUDA_R_32F = 0, CUDA_R_16BF = 14 };
constexpr unsigned cudaStreamNonBlocking = 1, cudaEventDisableTiming = 2;
constexpr unsigned cudaHostAllocPortable = 1, cudaHostRegisterPortable = 1;

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  int major, minor, multiProcessorCount;
};
struct cudaFuncAttributes {
  size_t sharedSizeBytes;
  int maxDynamicSharedSizeBytes;
};

// The emulated architecture (module_probe.cu reads nvcc's list).
#define __CUDA_ARCH_LIST__ 900
#define CUDART_VERSION 13000

cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorName(cudaError_t e);
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaRuntimeGetVersion(int* v);
cudaError_t cudaDriverGetVersion(int* v);
cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device);
// cudaDevAttrMemoryPoolsSupported: 1, or 0 with KTIER_CUDA_EMULATION_MEMORY_POOLS=0 (tests of
// the module's fallback), where cudaMallocAsync and cudaFreeAsync then fail with
// cudaErrorNotSupported, as on a device without memory pools; with =claimed it is 1 and they
// fail all the same (a virtualised driver's attribute without the feature).
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaMalloc(void** p, size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t s);
cudaError_t cudaFreeAsync(void* p, cudaStream_t s);
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned flags);
cudaError_t cudaHostUnregister(void* p);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);

// ---- the emulator's launch machinery -----------------------------------------------------------
namespace ktier_emu {

// What a running kernel thread sees (set by the block scheduler before each switch to it).
struct ThreadState {
  uint3 thread_idx, block_idx;
  dim3 block_dim, grid_dim;
};
extern thread_local const ThreadState* g_thread;

// Block-wide barrier and warp exchange (runtime.cpp); abort on misuse with the kernel named.
// warp_exchange: every lane of the calling warp gives `in` and gets lane (its own ^ lane_mask)'s.
void syncthreads();
void warp_exchange(unsigned mask, const void* in, size_t bytes, int lane_mask, void* out);
// The dynamic shared memory of the running block (launch's size, poisoned before each block).
void* dynamic_shared();
// A static __shared__ array of the running kernel (translate.py adds the call after its
// declaration): the first thread of a block to reach it poisons it; its size counts against the
// launch's shared-memory limit with the dynamic part.
void shared_array(void* p, size_t bytes);
// Aborts, naming the running kernel, unless p is a multiple of `alignment` (a vector load the
// device would fault on).
void check_aligned(const void* p, size_t alignment, const char* what);
[[noreturn]] void abort_in_kernel(const char* what);

// Opted-in dynamic shared memory per kernel (cudaFuncSetAttribute), read at launch.
cudaError_t set_max_dynamic_shared(const void* kernel, int bytes);
int max_dynamic_shared(const void* kernel);

// Checks a launch and queues it on `stream` (streams.h): when the stream gets to it, `body`
// runs for every thread of every block of the grid (blocks in order, on one host thread) with
// arg, which the queued launch keeps alive. Records and returns the launch error (bad
// configuration, too much shared memory).
cudaError_t launch_grid(const char* kernel_name, const void* kernel, dim3 grid, dim3 block,
                        size_t dynamic_shared_bytes, size_t param_bytes, cudaStream_t stream,
                        void (*body)(void*), std::shared_ptr<void> arg);

// Aborts, naming the kernel and the parameter, unless p is null, device memory or pinned host
// memory: a kernel given a pageable host pointer faults on a GPU.
void check_device_pointer(const char* kernel, int index, const void* p);

// The translated form of `kernel<<<grid, block, shared, stream>>>(args...)`
// (cuda/emulation/translate.py): Launch(grid, block, shared, stream).run("kernel", kernel,
// args...). Arguments are converted to the kernel's parameter types once, as the runtime
// copies them into the parameter block; each thread calls the kernel with copies of them.
class Launch {
 public:
  Launch(dim3 grid, dim3 block, size_t shared = 0, cudaStream_t stream = nullptr)
      : grid_(grid), block_(block), shared_(shared), stream_(stream) {}

  template <class... P, class... A>
  void run(const char* name, void (*kernel)(P...), A&&... args) {
    using Params = std::tuple<std::decay_t<P>...>;
    struct Call {
      void (*kernel)(P...);
      Params params;
    };
    auto call = std::make_shared<Call>(Call{kernel, Params(std::forward<A>(args)...)});
    std::apply(
        [name](const auto&... param) {
          int index = 0;
          (check_param(name, index++, param), ...);
        },
        call->params);
    launch_grid(
        name, reinterpret_cast<const void*>(kernel), grid_, block_, shared_, sizeof(Params),
        stream_,
        [](void* p) {
          Call& c = *static_cast<Call*>(p);
          std::apply(c.kernel, c.params);  // each thread's parameters are copies
        },
        std::move(call));
  }

 private:
  template <class T>
  static void check_param(const char* kernel, int index, const T& value) {
    if constexpr (std::is_pointer_v<T>)
      check_device_pointer(kernel, index, value);
    else if constexpr (requires { emulation_check_pointers(kernel, index, value); })
      emulation_check_pointers(kernel, index, value);  // a struct's pointers (found by ADL)
  }

  dim3 grid_, block_;
  size_t shared_;
  cudaStream_t stream_;
};

template <class T>
T bit_cast_to(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace ktier_emu

template <class Kernel>
cudaError_t cudaFuncSetAttribute(Kernel* kernel, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
  return ktier_emu::set_max_dynamic_shared(reinterpret_cast<const void*>(kernel), value);
}
template <class Kernel>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, Kernel* kernel) {
  a->sharedSizeBytes = 0;  // static __shared__ sizes are not known to the emulator
  a->maxDynamicSharedSizeBytes =
      ktier_emu::max_dynamic_shared(reinterpret_cast<const void*>(kernel));
  return cudaSuccess;
}

// ---- built-in variables ----------------------------------------------------------------------
#define threadIdx (::ktier_emu::g_thread->thread_idx)
#define blockIdx (::ktier_emu::g_thread->block_idx)
#define blockDim (::ktier_emu::g_thread->block_dim)
#define gridDim (::ktier_emu::g_thread->grid_dim)
#define warpSize 32

inline void __syncthreads() { ktier_emu::syncthreads(); }

// Whole warps only (width 32, the only use in cuda/): a narrower width aborts.
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8);
  if (width != 32) ktier_emu::abort_in_kernel("__shfl_xor_sync with a width below 32");
  T out;
  ktier_emu::warp_exchange(mask, &v, sizeof(T), lane_mask, &out);
  return out;
}

// ---- intrinsics (IEEE round-to-nearest; no contraction in this build) -------------------------
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __double2float_rn(double v) { return static_cast<float>(v); }
inline float __uint_as_float(unsigned u) { return ktier_emu::bit_cast_to<float>(&u); }
inline double __longlong_as_double(long long v) { return ktier_emu::bit_cast_to<double>(&v); }
template <class T>
T __ldg(const T* p) {
  ktier_emu::check_aligned(p, alignof(T), "__ldg");
  return *p;
}

// binary16 -> f32, exactly (every binary16 value is an f32).
inline float __half2float(__half h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu, man = h.bits & 0x3ffu;
  float mag;
  if (exp == 0) {
    mag = std::ldexp(static_cast<float>(man), -24);  // zero or subnormal
  } else if (exp == 31) {
    const uint32_t bits = 0x7f800000u | (man << 13);  // Inf, or NaN keeping its payload
    mag = ktier_emu::bit_cast_to<float>(&bits);
  } else {
    const uint32_t bits = ((exp + 112u) << 23) | (man << 13);
    mag = ktier_emu::bit_cast_to<float>(&bits);
  }
  uint32_t out = ktier_emu::bit_cast_to<uint32_t>(&mag) | sign;
  return ktier_emu::bit_cast_to<float>(&out);
}
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }

// f32 -> bf16 toward zero; NaN -> the canonical NaN (as cvt.rz.bf16.f32), not a truncation that
// could turn a NaN with a low payload into an infinity.
inline __nv_bfloat16 __float2bfloat16_rz(float f) {
  if (std::isnan(f)) return __nv_bfloat16{0x7fffu};
  return __nv_bfloat16{static_cast<uint16_t>(ktier_emu::bit_cast_to<uint32_t>(&f) >> 16)};
}
inline float __bfloat162float(__nv_bfloat16 b) {
  const uint32_t bits = static_cast<uint32_t>(b.bits) << 16;
  return ktier_emu::bit_cast_to<float>(&bits);
}

// Device code calls the C math functions unqualified: float arguments must pick the float
// overloads, as in CUDA (the C library's exp(double) would hide a float kernel's precision).
using std::exp;
using std::fabs;
using std::fmax;
using std::fmin;
using std::isfinite;
using std::isnan;
using std::log;
using std::sqrt;
using std::tanh;

#include "cpu/cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

#include <cstdint>
#endif

namespace ktier::cpu {
namespace {

#if defined(__x86_64__) || defined(__i386__)
// XCR0 via XGETBV; only called after CPUID reported OSXSAVE (else the instruction faults).
uint64_t read_xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}
#endif

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    f.avx2 = __builtin_cpu_supports("avx2");
    f.fma = __builtin_cpu_supports("fma");
    f.f16c = __builtin_cpu_supports("f16c");
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
      f.avx512f = (ebx >> 16) & 1;
      f.avx512dq = (ebx >> 17) & 1;
      f.avx512bw = (ebx >> 30) & 1;
      f.avx512vl = (ebx >> 31) & 1;
    }
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) && ((ecx >> 27) & 1)) {  // OSXSAVE
      constexpr uint64_t kZmmState = 0xe6;  // SSE | AVX | opmask | ZMM_Hi256 | Hi16_ZMM
      f.os_avx512 = (read_xcr0() & kZmmState) == kZmmState;
    }
#endif
    return f;
  }();
  return features;
}

}  // namespace ktier::cpu

#include "cpu/exec.h"

namespace ktier::cpu {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return true;
    case Isa::kAvx2: {
#if KTIER_CPU_HAVE_AVX2
      const CpuFeatures& f = cpu_features();
      return f.avx2 && f.fma && f.f16c;
#else
      return false;
#endif
    }
    case Isa::kAvx512: {
#if KTIER_CPU_HAVE_AVX512
      const CpuFeatures& f = cpu_features();
      return isa_supported(Isa::kAvx2) && f.avx512_subsets() && f.os_avx512;
#else
      return false;
#endif
    }
  }
  return false;
}

Isa best_isa() {
  static const Isa best = isa_supported(Isa::kAvx512) ? Isa::kAvx512
                          : isa_supported(Isa::kAvx2) ? Isa::kAvx2
                                                      : Isa::kScalar;
  return best;
}

}  // namespace ktier::cpu

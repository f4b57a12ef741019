#include "cpu/cpu_features.h"

namespace ktier::cpu {

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    f.avx2 = __builtin_cpu_supports("avx2");
    f.fma = __builtin_cpu_supports("fma");
    f.f16c = __builtin_cpu_supports("f16c");
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
  }
  return false;
}

Isa best_isa() {
  static const Isa best = isa_supported(Isa::kAvx2) ? Isa::kAvx2 : Isa::kScalar;
  return best;
}

}  // namespace ktier::cpu

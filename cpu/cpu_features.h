#pragma once
// Run-time CPU feature detection (CPUID). Thread-safe; the result is computed once.
namespace ktier::cpu {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
};

const CpuFeatures& cpu_features();

}  // namespace ktier::cpu

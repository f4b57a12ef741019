#pragma once
// Run-time CPU feature detection (CPUID). Thread-safe; the result is computed once.
namespace ktier::cpu {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  // AVX-512 foundation, byte/word, dword/qword and 128/256-bit forms (CPUID leaf 7).
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512dq = false;
  bool avx512vl = false;
  // XCR0 (XGETBV) has the SSE, AVX, opmask, ZMM_Hi256 and Hi16_ZMM state bits: the OS saves
  // the full zmm state, so AVX-512 instructions may run.
  bool os_avx512 = false;
  // The four AVX-512 subsets the AVX-512 kernels are compiled for (the OS's zmm support aside).
  bool avx512_subsets() const { return avx512f && avx512bw && avx512dq && avx512vl; }
};

const CpuFeatures& cpu_features();

}  // namespace ktier::cpu

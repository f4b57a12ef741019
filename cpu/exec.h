#pragma once
// Execution context of the CPU kernels: which instruction set runs them and which thread pool
// (if any) splits their work. Neither choice changes an output byte (docs/NUMERICS.md).

#include <cstdint>

namespace ktier::cpu {

class ThreadPool;

enum class Isa : uint8_t {
  kScalar,  // the *_ref kernels: portable C++, the ground truth of the numerics contract
  kAvx2,    // the x86/avx2_* kernels (AVX2 + FMA + F16C), byte-identical to kScalar
  kAvx512,  // kAvx2 with AVX-512 linear and MLA cache kernels (x86/avx512_*.cpp); identical too
};

const char* isa_name(Isa isa);
// kScalar always; kAvx2 when this build has the x86 kernels and CPUID reports AVX2, FMA and F16C;
// kAvx512 when kAvx2 is supported, CPUID also reports AVX512F/BW/DQ/VL and the OS saves the
// opmask and zmm registers (XGETBV).
bool isa_supported(Isa isa);
// The fastest supported instruction set (computed once from CPUID; thread-safe).
Isa best_isa();

struct Exec {
  ThreadPool* pool = nullptr;  // null: everything runs on the calling thread
  Isa isa = best_isa();        // must be supported (checked at every op entry)
};

}  // namespace ktier::cpu

#pragma once
// The floating-point environment the CPU contract assumes (NUMERICS.md: round to nearest, no
// flush-to-zero, no denormals-are-zero, K3-MODEL §7.3), made independent of the calling
// program's: a library embedding ktier may run with another rounding mode, FTZ/DAZ or unmasked
// exceptions, which would change output bytes (or trap on a NaN the contract defines).
// x86 MXCSR only; elsewhere these do nothing.

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace ktier::cpu {

// MXCSR's sticky exception flags (bits 0-5): state a computation raises, not control.
inline constexpr uint32_t kFpFlagBits = 0x3f;
// MXCSR at power-on: every exception masked, round to nearest, FTZ and DAZ off.
inline constexpr uint32_t kExactFpControl = 0x1f80;

inline uint32_t fp_control_now() {
#if defined(__x86_64__) || defined(__i386__)
  return _mm_getcsr();
#else
  return 0;
#endif
}

// This thread's control bits set to `control`'s, its own sticky flags kept.
inline void take_fp_control(uint32_t control) {
#if defined(__x86_64__) || defined(__i386__)
  const uint32_t mine = _mm_getcsr();
  if ((mine & ~kFpFlagBits) != (control & ~kFpFlagBits))
    _mm_setcsr((control & ~kFpFlagBits) | (mine & kFpFlagBits));
#else
  (void)control;
#endif
}

// For its lifetime the calling thread runs under kExactFpControl (and so do a ThreadPool's
// workers for the ranges it hands them); the caller's MXCSR is restored as it was on exit.
// Not copyable; nests.
class ExactFpScope {
 public:
  ExactFpScope() : saved_(fp_control_now()) { take_fp_control(kExactFpControl); }
  ~ExactFpScope() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(saved_);
#endif
  }
  ExactFpScope(const ExactFpScope&) = delete;
  ExactFpScope& operator=(const ExactFpScope&) = delete;

 private:
  uint32_t saved_;
};

}  // namespace ktier::cpu

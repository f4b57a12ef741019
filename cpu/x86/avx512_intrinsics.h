#pragma once
// <immintrin.h> for the AVX-512 files (cpu/x86/avx512_*.cpp, built with the AVX-512 flags).
// GCC 12's AVX-512 intrinsics initialise their "undefined" operands from themselves
// (`__m512i __Y = __Y;`), which -Wuninitialized reports at every inlined use (GCC bug 105593,
// fixed in 13). Only the header's own code is covered: the pragmas end right after it.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif

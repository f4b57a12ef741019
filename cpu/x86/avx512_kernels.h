#pragma once
// Internal: the AVX-512 range kernels (cpu/x86/avx512_*.cpp). Only linear has its own kernel;
// kernel_table(Isa::kAvx512) is the AVX2 table with linear_rows replaced (cpu/dispatch.cpp).
// Signatures and contracts: KernelTable in cpu/kernel_table.h.

#include <cstdint>

#include "cpu/kernel_table.h"

namespace ktier::cpu::avx512 {

void linear_rows_avx512(const LinearTask& task, int64_t r0, int64_t r1);

}  // namespace ktier::cpu::avx512

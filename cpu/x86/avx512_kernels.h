#pragma once
// Internal: the AVX-512 range kernels (cpu/x86/avx512_*.cpp). kernel_table(Isa::kAvx512) is the
// AVX2 table with these replaced (cpu/dispatch.cpp): linear, and MLA's two cache-reading steps.
// Signatures and contracts: KernelTable in cpu/kernel_table.h.

#include <cstdint>

#include "cpu/kernel_table.h"

namespace ktier::cpu::avx512 {

void linear_rows_avx512(const LinearTask& task, int64_t r0, int64_t r1, double* scratch);
void mla_scores_avx512(const MlaArgs& a, const MlaPass& p, int64_t s0, int64_t s1,
                       double* scratch);
void mla_mix_avx512(const MlaArgs& a, const MlaPass& p, int64_t c0, int64_t c1, double* scratch);

}  // namespace ktier::cpu::avx512

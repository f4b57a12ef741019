#pragma once
// Internal: the AVX2 range kernels (cpu/x86/avx2_*.cpp) that make up kAvx2Kernels.
// Signatures and contracts: KernelTable in cpu/kernel_table.h.

#include <cstdint>

#include "cpu/kernel_table.h"

namespace ktier::cpu::avx2 {

void linear_rows_avx2(const LinearTask& task, int64_t r0, int64_t r1, double* scratch);
void rmsnorm_rows_avx2(const float* x, const float* gain, int64_t n, double eps, int64_t r0,
                       int64_t r1, float* out);
void l2norm_rows_avx2(const float* x, int64_t n, double eps, int64_t r0, int64_t r1, float* out);
void situ_glu_range_avx2(const float* a, const float* b, double beta1, bool cap_up, double beta2,
                         int64_t i0, int64_t i1, float* out);
void sigmoid_range_avx2(const float* x, int64_t i0, int64_t i1, float* out);
void sigmoid_gate_range_avx2(const float* x, const float* gate, int64_t i0, int64_t i1, float* out);
void add_range_avx2(const float* a, const float* b, int64_t i0, int64_t i1, float* out);
void weighted_sum_range_avx2(const float* const* vec, const float* weight, int k, int64_t i0,
                             int64_t i1, float* out);
void short_conv_channels_avx2(const ShortConvArgs& a, int64_t c0, int64_t c1);
void decay_gate_range_avx2(const DecayGateArgs& a, int64_t i0, int64_t i1);
void recurrence_heads_avx2(const RecurrenceArgs& a, int h0, int h1, double* scratch);
void mla_query_avx2(const MlaArgs& a, const MlaPass& p, int64_t i0, int64_t i1);
void mla_scores_avx2(const MlaArgs& a, const MlaPass& p, int64_t s0, int64_t s1, double* scratch);
void mla_mix_avx2(const MlaArgs& a, const MlaPass& p, int64_t c0, int64_t c1, double* scratch);
void mla_out_avx2(const MlaArgs& a, const MlaPass& p, int64_t i0, int64_t i1, double* scratch);
void attnres_tokens_avx2(const AttnResArgs& a, int64_t t0, int64_t t1, double* scratch);
void router_tokens_avx2(const RouterArgs& a, int64_t t0, int64_t t1, double* scratch);
int64_t argmax_avx2(const float* x, int64_t n);

}  // namespace ktier::cpu::avx2

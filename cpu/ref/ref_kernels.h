#pragma once
// Internal: the scalar `_ref` range kernels (cpu/ref/*.cpp) that make up kRefKernels.
// Signatures and contracts: KernelTable in cpu/kernel_table.h.

#include <cstdint>

#include "cpu/kernel_table.h"

namespace ktier::cpu {

void linear_rows_ref(const LinearTask& task, int64_t r0, int64_t r1, double* scratch);
void rmsnorm_rows_ref(const float* x, const float* gain, int64_t n, double eps, int64_t r0,
                      int64_t r1, float* out);
void l2norm_rows_ref(const float* x, int64_t n, double eps, int64_t r0, int64_t r1, float* out);
void situ_glu_range_ref(const float* a, const float* b, double beta1, bool cap_up, double beta2,
                        int64_t i0, int64_t i1, float* out);
void sigmoid_range_ref(const float* x, int64_t i0, int64_t i1, float* out);
void sigmoid_gate_range_ref(const float* x, const float* gate, int64_t i0, int64_t i1, float* out);
void add_range_ref(const float* a, const float* b, int64_t i0, int64_t i1, float* out);
void weighted_sum_range_ref(const float* const* vec, const float* weight, int k, int64_t i0,
                            int64_t i1, float* out);
void short_conv_channels_ref(const ShortConvArgs& a, int64_t c0, int64_t c1);
void decay_gate_range_ref(const DecayGateArgs& a, int64_t i0, int64_t i1);
void recurrence_heads_ref(const RecurrenceArgs& a, int h0, int h1, double* scratch);
void mla_query_ref(const MlaArgs& a, const MlaPass& p, int64_t i0, int64_t i1);
void mla_scores_ref(const MlaArgs& a, const MlaPass& p, int64_t s0, int64_t s1, double* scratch);
void mla_mix_ref(const MlaArgs& a, const MlaPass& p, int64_t c0, int64_t c1, double* scratch);
void mla_out_ref(const MlaArgs& a, const MlaPass& p, int64_t i0, int64_t i1, double* scratch);
void attnres_tokens_ref(const AttnResArgs& a, int64_t t0, int64_t t1, double* scratch);
void router_tokens_ref(const RouterArgs& a, int64_t t0, int64_t t1, double* scratch);
int64_t argmax_ref(const float* x, int64_t n);

}  // namespace ktier::cpu

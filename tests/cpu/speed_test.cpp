// Rough throughput of the two kernels that dominate decode, in GB/s of weight bytes streamed.
// Disabled by default (it allocates ~160 MB and takes seconds); run with
//   cpu_test --gtest_also_run_disabled_tests --gtest_filter='CpuSpeed.*'

#include <gtest/gtest.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <random>

#include "cpu/kernels.h"

namespace ktier::cpu::test {
namespace {

// Best wall time over reps, and the process CPU time of that rep: on a shared machine the CPU
// time per thread is the better estimate of what the kernel does on an idle core.
struct Timing {
  double wall = 1e30, cpu = 0.0;
};
double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
template <class Fn>
Timing best_of(int reps, Fn&& fn) {
  Timing best;
  for (int i = 0; i < reps; ++i) {
    const double c0 = cpu_now();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (wall < best.wall) best = {wall, cpu_now() - c0};
  }
  return best;
}

TEST(CpuSpeed, DISABLED_Bf16MatvecAndMxfp4Expert) {
  std::mt19937 rng(1);
  const int64_t E = 7168, I = 3072, L = 3584;
  std::vector<uint16_t> bf16(E * E);
  for (auto& h : bf16)
    h = static_cast<uint16_t>(0x3c00 + (rng() & 0x3ff)) ^ static_cast<uint16_t>((rng() & 1) << 15);
  std::vector<uint8_t> p1(I * L / 2), s1(I * L / 32, 121), p3(I * L / 2), s3(I * L / 32, 121),
      p2(L * I / 2), s2(L * I / 32, 121);
  for (auto* v : {&p1, &p2, &p3})
    for (auto& b : *v) b = static_cast<uint8_t>(rng());
  std::vector<float> x(E), u(L), a1(I), a3(I), y(E), y2(L);
  for (auto& v : x) v = static_cast<float>(rng() % 1000) / 1000.0f - 0.5f;
  for (auto& v : u) v = static_cast<float>(rng() % 1000) / 1000.0f - 0.5f;
  const WeightMatrix wb{WeightType::kBF16, bf16.data(), nullptr, E, E};
  const WeightMatrix w1{WeightType::kMxfp4, p1.data(), s1.data(), I, L};
  const WeightMatrix w3{WeightType::kMxfp4, p3.data(), s3.data(), I, L};
  const WeightMatrix w2{WeightType::kMxfp4, p2.data(), s2.data(), L, I};
  const double bf16_bytes = 2.0 * E * E, expert_bytes = 3.0 * (I * L / 2 + I * L / 32);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2}) {
    if (!isa_supported(isa)) continue;
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      const Exec ex{&pool, isa};
      const int reps = isa == Isa::kScalar ? 2 : 5;
      const Timing tb = best_of(reps, [&] { linear(wb, x.data(), 1, y.data(), ex); });
      const Timing te = best_of(reps, [&] {
        const LinearJob up[] = {{w1, u.data(), 1, a1.data()}, {w3, u.data(), 1, a3.data()}};
        linear(up, 2, ex);
        situ_glu(a1.data(), a3.data(), I, 4.0, 25.0, a1.data(), ex);
        linear(w2, a1.data(), 1, y2.data(), ex);
      });
      std::printf(
          "[speed] %-6s %d thread(s): BF16 matvec 7168x7168 %.2f ms wall = %.2f GB/s "
          "(%.2f GB/s per CPU-second); MXFP4 expert (W1+W3 3072x3584, SiTU, W2 3584x3072) "
          "%.2f ms wall = %.2f GB/s (%.2f GB/s per CPU-second)\n",
          isa_name(isa), threads, tb.wall * 1e3, bf16_bytes / tb.wall / 1e9,
          bf16_bytes / tb.cpu / 1e9, te.wall * 1e3, expert_bytes / te.wall / 1e9,
          expert_bytes / te.cpu / 1e9);
    }
  }
}

}  // namespace
}  // namespace ktier::cpu::test

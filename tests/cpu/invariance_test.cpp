// Bitwise invariance of every cpu/ op (NUMERICS.md §1): scalar == AVX2 == AVX-512, and
// 1 == 2 == 3 threads, on fresh random inputs of odd sizes, with outputs poisoned before each run,
// and with NaN/Inf inputs propagating to the same positions; plus the linear op over every tile
// shape of the vector kernels.

#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>

#include "cpu/kernels.h"
#include "cpu/thread_pool.h"
#include "cpu/worker_thread.h"
#include "op_cases.h"
#include "test_support.h"
#include "tests/common/fresh_seed.h"

namespace ktier::cpu::test {
namespace {

void expect_identical(const OpCase& c, const Exec& a, const Exec& b, const std::string& label) {
  const auto out_a = run_poisoned(c, a);
  const auto out_b = run_poisoned(c, b);
  for (size_t i = 0; i < out_a.size(); ++i)
    EXPECT_EQ(compare_bits(out_a[i].data(), out_b[i].data(), c.out_sizes[i]), "")
        << c.name << " (" << label << "), output " << i;
}

// Every vector kernel set against the scalar one: param (isa, with NaN/Inf/subnormal inputs).
class IsaEquivalence : public ::testing::TestWithParam<std::tuple<Isa, bool>> {
 protected:
  void SetUp() override {
    if (!isa_supported(isa())) GTEST_SKIP() << skip_reason(isa());
  }
  Isa isa() const { return std::get<0>(GetParam()); }
  // Fresh inputs each run (the seed printed under the test's name, for KTIER_TEST_SEED).
  CaseOptions options() const {
    CaseOptions opt;
    opt.specials = std::get<1>(GetParam());
    const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
    opt.seed = ktier::test::fresh_seed(
        (std::string(t->test_suite_name()) + "." + t->name()).c_str());
    return opt;
  }
};

TEST_P(IsaEquivalence, EveryOpWritesTheScalarBytes) {
  const auto cases = make_op_cases(options());
  ASSERT_GT(cases.size(), 50u);
  const std::string label = std::string("scalar vs ") + isa_name(isa());
  for (const OpCase& c : cases)
    expect_identical(c, Exec{nullptr, Isa::kScalar}, Exec{nullptr, isa()}, label);
}

TEST_P(IsaEquivalence, LinearWritesTheScalarBytesForEveryTileShape) {
  const auto cases = make_linear_sweep_cases(options());
  ASSERT_GT(cases.size(), 1000u);
  const std::string label = std::string("scalar vs ") + isa_name(isa());
  for (const OpCase& c : cases)
    expect_identical(c, Exec{nullptr, Isa::kScalar}, Exec{nullptr, isa()}, label);
}

INSTANTIATE_TEST_SUITE_P(
    Inputs, IsaEquivalence,
    ::testing::Combine(::testing::Values(Isa::kAvx2, Isa::kAvx512), ::testing::Bool()),
    [](const auto& info) {
      return std::string(isa_name(std::get<0>(info.param))) +
             (std::get<1>(info.param) ? "_WithNanInf" : "_Finite");
    });

class ThreadInvariance : public ::testing::TestWithParam<Isa> {};

TEST_P(ThreadInvariance, OneTwoThreeThreadsWriteIdenticalBytes) {
  const Isa isa = GetParam();
  if (!isa_supported(isa)) GTEST_SKIP() << skip_reason(isa);
  ThreadPool p1(1), p2(2), p3(3);
  CaseOptions opt;
  opt.seed = ktier::test::fresh_seed("ThreadInvariance.OneTwoThreeThreadsWriteIdenticalBytes");
  opt.large = true;
  int threaded = 0;
  for (const OpCase& c : make_op_cases(opt)) {
    if (!c.threaded) continue;
    ++threaded;
    const auto base = run_poisoned(c, Exec{nullptr, isa});
    for (ThreadPool* pool : {&p1, &p2, &p3}) {
      const auto out = run_poisoned(c, Exec{pool, isa});
      for (size_t i = 0; i < out.size(); ++i)
        EXPECT_EQ(compare_bits(base[i].data(), out[i].data(), c.out_sizes[i]), "")
            << c.name << " with " << pool->size() << " threads, output " << i;
    }
  }
  EXPECT_GT(threaded, 20);
}
INSTANTIATE_TEST_SUITE_P(Isas, ThreadInvariance, ::testing::ValuesIn(kAllIsas), IsaParamName());

// MLA runs each token in passes over groups of heads (mla_heads_per_pass): every grouping, at 1
// and 3 threads, writes the bytes of the scalar kernels in one pass. 7 heads: blocks and single
// heads in the score kernel; 150 positions: several mix tiles; 97 latent channels: a partial
// range; rope 20: a 16-lane block and a tail.
TEST_P(ThreadInvariance, MlaHeadGroupingWritesIdenticalBytes) {
  const Isa isa = GetParam();
  if (!isa_supported(isa)) GTEST_SKIP() << skip_reason(isa);
  std::mt19937_64 rng(
      ktier::test::fresh_seed("ThreadInvariance.MlaHeadGroupingWritesIdenticalBytes"));
  MlaDims d;
  d.n_heads = 7;
  d.qk_nope = 13;
  d.qk_rope = 20;  // a whole 16-lane block and a tail
  d.v_head = 6;
  d.kv_lora = 97;
  const int64_t T = 3, n_past = 147, N = n_past + T;
  // Well-scaled inputs (not random_floats' wide exponents): the softmax stays spread over many
  // positions, so a wrong score anywhere shows in the output.
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  auto uniform = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = unit(rng);
    return v;
  };
  const int64_t kv_rows = int64_t{d.n_heads} * (d.qk_nope + d.v_head);
  const std::vector<float> w = uniform(kv_rows * d.kv_lora);
  const WeightMatrix kv_b{WeightType::kF32, w.data(), nullptr, kv_rows, d.kv_lora};
  const std::vector<float> q = uniform(T * d.n_heads * (d.qk_nope + d.qk_rope));
  const std::vector<float> c = uniform(N * d.kv_lora);
  const std::vector<float> r = uniform(N * d.qk_rope);
  const int64_t n_out = T * d.n_heads * d.v_head;
  auto run = [&](int heads_per_pass, const Exec& ex) {
    std::vector<float> out(static_cast<size_t>(n_out));
    poison(out.data(), n_out);
    mla_attention_in_passes(d, q.data(), T, kv_b, c.data(), r.data(), n_past, 0.02, out.data(),
                            heads_per_pass, ex);
    EXPECT_EQ(count_poison(out.data(), n_out), 0) << heads_per_pass << " heads per pass";
    return out;
  };
  const std::vector<float> base = run(d.n_heads, Exec{nullptr, Isa::kScalar});
  ThreadPool p3(3);
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &p3}) {
    for (int g : {1, 2, 3, 6, 7, 100}) {
      const std::vector<float> out = run(g, Exec{pool, isa});
      EXPECT_EQ(compare_bits(base.data(), out.data(), n_out), "")
          << g << " heads per pass, " << (pool ? 3 : 1) << " thread(s)";
    }
  }
  // The default grouping keeps every head in one pass until the scores would pass 64 MiB.
  EXPECT_EQ(mla_heads_per_pass(96, 4096), 96);
  EXPECT_EQ(mla_heads_per_pass(96, int64_t{1} << 20), 8);
  EXPECT_EQ(mla_heads_per_pass(96, int64_t{1} << 30), 1);
  // The buffer a thread keeps is the largest of any call up to n positions: fewer heads per
  // pass past ~87k positions make it shrink again.
  const MlaDims k3{96, 128, 64, 128, 512};
  for (const int64_t n : {int64_t{1000}, int64_t{87381}, int64_t{100000}, int64_t{131072}})
    EXPECT_LE(mla_buffer_bytes(k3, n), mla_buffer_bytes(k3, 131072)) << n;
}

// The pool itself: every index covered exactly once, for odd sizes and grains, nested calls inline.
TEST(ThreadPool, CoversEachIndexOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 17, 1000}) {
      for (int64_t grain : {1, 3, 64, 5000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
          EXPECT_LE(e - b, grain);
          pool.parallel_for(e - b, 1, [&](int64_t bb, int64_t ee) {  // nested: runs inline
            for (int64_t i = b + bb; i < b + ee; ++i) hits[i].fetch_add(1);
          });
        });
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(hits[i].load(), 1) << n << "/" << grain << "/" << i;
      }
    }
  }
}

#if defined(__x86_64__)
// The workers run each call under the caller's MXCSR, set after the pool started or not (a
// thread inherits its creator's only when made): otherwise a denormal result would depend on
// which thread ran its range. Range 0 waits until another thread has started a range, so
// that two threads run ranges, one of them a worker, whatever the scheduling.
TEST(ThreadPool, RangesRunUnderTheCallersFloatingPointControl) {
  ThreadPool pool(3);
  const uint32_t saved = _mm_getcsr();
  for (const uint32_t ftz_daz : {0x8040u, 0u}) {
    _mm_setcsr((saved & ~0x8040u) | ftz_daz);
    std::vector<uint32_t> seen(24, 0xffffffffu);
    std::vector<float> products(24, -1.0f);
    std::atomic<bool> holder_known{false}, another_thread{false};
    std::thread::id holder;
    pool.parallel_for(24, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        if (i == 0) {
          holder = std::this_thread::get_id();
          holder_known.store(true);
          while (!another_thread.load()) std::this_thread::yield();
        } else {
          while (!holder_known.load()) std::this_thread::yield();
          if (std::this_thread::get_id() != holder) another_thread.store(true);
        }
        seen[i] = _mm_getcsr() & 0x8040u;
        volatile float subnormal = 0x1p-140f, one = 1.0f;  // volatile: multiplied here
        products[i] = subnormal * one;
      }
    });
    _mm_setcsr(saved);
    for (size_t i = 0; i < seen.size(); ++i) {
      EXPECT_EQ(seen[i], ftz_daz) << i;
      EXPECT_EQ(products[i], ftz_daz ? 0.0f : 0x1p-140f) << i;
    }
  }
}
#endif

// A range that throws (std::bad_alloc growing a scratch buffer, say) fails the call on its
// caller, whichever thread ran it, once no thread is inside the call; the pool goes on working
// on all its threads (before: a worker's exception ended the process, and one on the caller
// left it marked inside a range, so every later call ran on one thread).
TEST(ThreadPool, AThrowingRangeFailsTheCallOnItsCallerAndThePoolGoesOn) {
  ThreadPool pool(3);
  if (pool.size() < 2) GTEST_SKIP() << "no worker thread started: " << pool.start_error();
  for (int throwing = 0; throwing < 40; throwing += 7) {
    std::atomic<int> inside{0};
    EXPECT_THROW(pool.parallel_for(40, 1,
                                   [&](int64_t b, int64_t) {
                                     inside.fetch_add(1);
                                     std::this_thread::sleep_for(std::chrono::microseconds(200));
                                     inside.fetch_sub(1);
                                     if (b == throwing) {
                                       throw std::runtime_error("range " + std::to_string(b));
                                     }
                                   }),
                 std::runtime_error);
    EXPECT_EQ(inside.load(), 0) << "a range was still running when the call failed";
  }
  // Later calls still spread over the threads (each range waits until two ranges run at once).
  std::atomic<int> running{0}, most{0};
  pool.parallel_for(6, 1, [&](int64_t, int64_t) {
    const int now = running.fetch_add(1) + 1;
    for (int m = most.load(); now > m && !most.compare_exchange_weak(m, now);) {
    }
    for (int spin = 0; spin < 2000 && most.load() < 2; ++spin)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    running.fetch_sub(1);
  });
  EXPECT_GE(most.load(), 2) << "the calls after the throw ran on one thread";
}

// The default stack of a new thread, bytes (0 if unknown).
size_t default_stack_bytes() {
  pthread_attr_t attr;
  size_t bytes = 0;
  if (pthread_getattr_default_np(&attr) != 0) return 0;
  if (pthread_attr_getstacksize(&attr, &bytes) != 0) bytes = 0;
  pthread_attr_destroy(&attr);
  return bytes;
}

// A system that refuses threads (here an address-space limit with room for about four stacks,
// in a child process) leaves a working pool of the workers that started, saying why. Runs in
// the child; returns its exit code (0: as promised).
int pool_under_a_memory_limit(size_t stack_bytes) {
  long pages = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  const rlim_t limit = static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) +
                       4 * static_cast<rlim_t>(stack_bytes);
  rlimit lim{};
  lim.rlim_cur = lim.rlim_max = limit;
  if (pages == 0 || setrlimit(RLIMIT_AS, &lim) != 0) return 3;
  ThreadPool pool(64);
  if (pool.size() == 64 || pool.start_error().empty()) return 4;
  std::vector<std::atomic<int>> hits(1000);
  pool.parallel_for(1000, 7, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
  });
  for (auto& h : hits)
    if (h.load() != 1) return 5;
  return 0;
}

TEST(ThreadPoolDeathTest, RefusedThreadsLeaveASmallerWorkingPool) {
  const size_t stack = default_stack_bytes();
  // 64 small stacks could fit in the slack of any limit set here: the test needs big ones.
  if (stack < (size_t{4} << 20)) GTEST_SKIP() << "default thread stack " << stack << " bytes";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::_Exit(pool_under_a_memory_limit(stack)), ::testing::ExitedWithCode(0), "");
}

// An exception escaping a worker thread's body ends the process with exit 1 and a line naming
// the thread and the cause, not std::terminate's abort; output written before is flushed.
TEST(ThreadPoolDeathTest, AWorkerThatRunsOutOfMemoryExitsOneNamingIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        std::thread t([] { run_worker("test-reaper", [] { throw std::bad_alloc(); }); });
        t.join();
      },
      ::testing::ExitedWithCode(1), "ktier: error: test-reaper thread: out of memory");
  EXPECT_EXIT(run_worker("other", [] { throw std::runtime_error("gone"); }),
              ::testing::ExitedWithCode(1), "ktier: error: other thread: gone");
}

}  // namespace
}  // namespace ktier::cpu::test

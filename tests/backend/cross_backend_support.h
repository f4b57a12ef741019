#pragma once
// Helpers of the backend op tests (cross_backend_test.cpp, conformance_backend_test.cpp): the
// backends they run on and their gtest names, backend arrays, poisoned outputs, and the
// comparison of a backend's output with the CPU reference under per-element tolerances.
//
// Tolerances are derived, not tuned (docs/NUMERICS.md, cuda/README.md): with u = 2^-24, a sum
// of d terms in f32, in any order, is within gamma(d) * sum|terms| of the exact sum
// (gamma(d) = d u / (1 - d u), Higham, Accuracy and Stability, §3.1); per-element formulas
// evaluated in double and rounded once agree to one f32 ulp. Each op's bound composes these.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace ktier::backend {
inline const char* backend_kind_name(DeviceKind k) {
  return k == DeviceKind::kCpu ? "cpu" : "cuda";
}
// gtest prints the parameter with this ("cuda" rather than "1-byte object <01>").
inline void PrintTo(DeviceKind k, std::ostream* os) { *os << backend_kind_name(k); }
}  // namespace ktier::backend

namespace ktier::backend::test {

// The backends an op test runs on, and their gtest names ("cpu", "cuda"):
// INSTANTIATE_TEST_SUITE_P(Backends, Suite, kBackendKinds, BackendKindName()).
inline const auto kBackendKinds = ::testing::Values(DeviceKind::kCpu, DeviceKind::kCuda);
struct BackendKindName {
  std::string operator()(const ::testing::TestParamInfo<DeviceKind>& info) const {
    return backend_kind_name(info.param);
  }
};

inline constexpr double kUnitRoundoff = 0x1p-24;
inline double gamma(double d) { return d * kUnitRoundoff / (1.0 - d * kUnitRoundoff); }
// The spacing of f32 values at |x| (the next float above |x| minus |x|).
inline double ulp(float x) {
  const float a = std::fabs(x);
  return static_cast<double>(std::nextafter(a, std::numeric_limits<float>::infinity())) - a;
}

// A NaN pattern no arithmetic produces: outputs are filled with it before each run, so an
// output a kernel never wrote is caught.
inline constexpr uint8_t kPoisonByte = 0xff;

// Backend memory holding a copy of a host vector (or `n` poisoned elements).
template <class T>
class Array {
 public:
  Array(Backend& b, const std::vector<T>& host) : b_(&b), n_(host.size()) {
    buf_ = take(BackendBuffer::allocate(b, bytes()));
    expect_ok(b.upload(buf_.get(), host.data(), bytes()));
  }
  static Array poisoned(Backend& b, size_t n) {
    Array a(b, n);
    expect_ok(b.fill(a.buf_.get(), kPoisonByte, a.bytes()));
    return a;
  }
  T* data() const { return buf_.template as<T>(); }
  std::vector<T> host() const {
    std::vector<T> out(n_);
    expect_ok(b_->download(out.data(), buf_.get(), bytes()));
    return out;
  }

 private:
  Array(Backend& b, size_t n) : b_(&b), n_(n) { buf_ = take(BackendBuffer::allocate(b, bytes())); }
  size_t bytes() const { return n_ * sizeof(T); }
  static void expect_ok(const Status& s) { ASSERT_TRUE(s.is_ok()) << s.message(); }
  static BackendBuffer take(Result<BackendBuffer> r) {
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    return r.is_ok() ? std::move(*r) : BackendBuffer();
  }
  Backend* b_;
  size_t n_;
  BackendBuffer buf_;
};

// True for the poison's bit pattern (all ones): a NaN whose payload no arithmetic produces (a
// NaN a kernel makes is the default 0x7fc00000 / 0xffc00000, or an input's, and no test input
// holds this one), so an output that keeps it was never written.
inline bool is_poison(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits == 0xffffffffu;
}

// Host floats holding the poison: a reference's output starts so, as the backend's does.
inline std::vector<float> poisoned_host(size_t n) {
  std::vector<float> v(n);
  std::memset(v.data(), kPoisonByte, n * sizeof(float));
  return v;
}

// got agrees with want where: got was written (not the poison; nor want, the reference's), NaN
// exactly where want is NaN, the same infinity where want is infinite, and |got - want| <=
// tol[i] (+ one ulp of want) elsewhere. `exact` demands equal bits (both-NaN counts as equal).
// Returns "" or a description of the first few mismatches.
inline std::string compare(const std::vector<float>& want, const std::vector<float>& got,
                           const std::vector<double>& tol, bool exact) {
  std::string out;
  int shown = 0, bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const float w = want[i], g = got[i];
    bool ok;
    if (is_poison(w) || is_poison(g)) {
      ok = false;
    } else if (std::isnan(w) || std::isnan(g)) {
      ok = std::isnan(w) && std::isnan(g);
    } else if (exact) {
      ok = std::memcmp(&w, &g, sizeof w) == 0;
    } else if (std::isinf(w) || std::isinf(g)) {
      ok = w == g;
    } else {
      ok = std::fabs(static_cast<double>(g) - w) <= tol[i] + ulp(w);
    }
    if (!ok) {
      ++bad;
      if (shown++ < 5)
        out += "  [" + std::to_string(i) + "] want " +
               (is_poison(w) ? std::string("never written") : std::to_string(w)) + " got " +
               (is_poison(g) ? std::string("never written") : std::to_string(g)) + " tol " +
               std::to_string(exact ? 0.0 : tol[i] + ulp(w)) + "\n";
    }
  }
  if (bad) out = std::to_string(bad) + " of " + std::to_string(want.size()) + " differ:\n" + out;
  return out;
}

inline std::vector<float> random_floats(std::mt19937_64& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline int odd_between(std::mt19937_64& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo / 2, (hi - 1) / 2)(rng) * 2 + 1;
}

}  // namespace ktier::backend::test

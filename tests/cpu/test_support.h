#pragma once
// Test helpers for tests/cpu: conformance fixtures (README §1 JSON conventions), tolerance
// checks (README §2) and bit-level comparisons.

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "cpu/kernels.h"

namespace ktier::cpu {
// gtest prints parameters with this: "avx512" rather than "1-byte object <02>".
inline void PrintTo(Isa isa, std::ostream* os) { *os << isa_name(isa); }
}  // namespace ktier::cpu

namespace ktier::cpu::test {

// One tensor of a fixture: shape plus row-major values parsed as double (README §1).
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<double> data;
  int64_t numel() const { return static_cast<int64_t>(data.size()); }
  std::vector<float> f32() const;  // each value converted to f32 once
};

// An ops/*.json (or mxfp4.json) file. Missing files or keys throw, so a test that needs them
// fails (never skips).
class Fixture {
 public:
  static Fixture load_op(const std::string& name);  // conformance_dir()/ops/<name>.json
  static Fixture load_path(const std::filesystem::path& path);
  bool has(const std::string& key) const { return j_.contains(key); }
  Tensor tensor(const std::string& key) const;
  std::vector<float> f32(const std::string& key) const { return tensor(key).f32(); }
  double number(const std::string& key) const;
  const nlohmann::json& json() const { return j_; }

 private:
  nlohmann::json j_;
  std::string name_;
};

// README §2: |got - want| <= abs_tol + rel_tol * |want|, elementwise; worst = max ratio.
struct ToleranceResult {
  double worst_ratio = 0.0;
  int64_t worst_index = -1;
  double got = 0.0, want = 0.0;
  bool shapes_match = true;
};
ToleranceResult check_tolerance(const std::vector<float>& got, const std::vector<double>& want,
                                double abs_tol = 1e-5, double rel_tol = 1e-4);
double max_abs_diff(const std::vector<float>& got, const std::vector<double>& want);

// The router vector (ops/router.json, README §5.8) against a router's `ids` and `weights` [T, k]:
// "" where every row selected the vector's set of experts (in any order), else the first row
// that did not. `got`, `want`: the weights paired by expert id (check_tolerance's inputs).
std::string router_weights_by_id(const Fixture& fx, const std::vector<int32_t>& ids,
                                 const std::vector<float>& weights, int k,
                                 std::vector<float>& got, std::vector<double>& want);

// ops/situ_glu.json's input [rows, 2h] split into the gate half a (its first h columns) and
// the value half b, each [rows, h] in f32.
struct GluHalves {
  int64_t rows = 0, half = 0;
  std::vector<float> a, b;
};
GluHalves glu_halves(const Tensor& in);

// Prints "[conformance] <what>: worst ratio R (README measured M)" so runs can be compared with
// the margins of README §5.
void report_ratio(const std::string& what, const ToleranceResult& r, const std::string& readme);

// Bitwise equality where both-NaN counts as equal (NaN payloads are not part of the contract).
// Returns an empty string when equal, else a description of the first difference.
std::string compare_bits(const float* a, const float* b, int64_t n);

// A NaN bit pattern no arithmetic produces (signalling): outputs are filled with it before each
// run; one still holding it afterwards was never written.
inline constexpr uint32_t kPoisonBits = 0x7f8dead5u;
void poison(float* p, int64_t n);
int64_t count_poison(const float* p, int64_t n);
// n floats holding the poison: an output buffer an element of which, left unwritten, fails any
// tolerance check (a NaN where a number is wanted), however small the wanted value.
std::vector<float> poisoned(int64_t n);

// Every kernel set the library knows, scalar first. Tests that compare or exercise kernel sets
// run over all of them and GTEST_SKIP (with skip_reason) those this CPU or build cannot run.
inline constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512};
// Why `isa` cannot run here (for GTEST_SKIP), e.g. "avx512: the CPU lacks AVX512F/BW/DQ/VL ...".
std::string skip_reason(Isa isa);
// gtest parameter names: "scalar", "avx2", "avx512".
struct IsaParamName {
  template <class ParamInfo>
  std::string operator()(const ParamInfo& info) const {
    return isa_name(info.param);
  }
};

float random_float(std::mt19937_64& rng, float scale = 1.0f);
std::vector<float> random_floats(std::mt19937_64& rng, int64_t n, float scale = 1.0f);

}  // namespace ktier::cpu::test

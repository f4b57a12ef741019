#include "test_support.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "common/test_paths.h"

namespace ktier::cpu::test {

std::vector<float> Tensor::f32() const {
  std::vector<float> out(data.size());
  for (size_t i = 0; i < data.size(); ++i) out[i] = static_cast<float>(data[i]);
  return out;
}

Fixture Fixture::load_path(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("conformance file missing: " + path.string());
  Fixture f;
  f.j_ = nlohmann::json::parse(in);
  f.name_ = path.filename().string();
  return f;
}

Fixture Fixture::load_op(const std::string& name) {
  return load_path(ktier::test::conformance_dir() / "ops" / (name + ".json"));
}

Tensor Fixture::tensor(const std::string& key) const {
  if (!j_.contains(key)) throw std::runtime_error(name_ + ": missing key " + key);
  const auto& t = j_.at(key);
  Tensor out;
  for (const auto& d : t.at("shape")) out.shape.push_back(d.get<int64_t>());
  const auto& data = t.at("data");
  out.data.reserve(data.size());
  for (const auto& v : data) out.data.push_back(v.get<double>());
  int64_t n = 1;
  for (int64_t d : out.shape) n *= d;
  if (n != out.numel()) throw std::runtime_error(name_ + ": " + key + " has a wrong element count");
  return out;
}

double Fixture::number(const std::string& key) const {
  if (!j_.contains(key)) throw std::runtime_error(name_ + ": missing key " + key);
  return j_.at(key).get<double>();
}

ToleranceResult check_tolerance(const std::vector<float>& got, const std::vector<double>& want,
                                double abs_tol, double rel_tol) {
  ToleranceResult r;
  if (got.size() != want.size()) {
    r.shapes_match = false;
    r.worst_ratio = INFINITY;
    return r;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
    double ratio = diff / (abs_tol + rel_tol * std::fabs(want[i]));
    if (std::isnan(ratio)) ratio = INFINITY;
    if (ratio > r.worst_ratio || r.worst_index < 0) {
      r.worst_ratio = ratio;
      r.worst_index = static_cast<int64_t>(i);
      r.got = got[i];
      r.want = want[i];
    }
  }
  return r;
}

double max_abs_diff(const std::vector<float>& got, const std::vector<double>& want) {
  double m = got.size() == want.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    m = std::isnan(d) ? INFINITY : std::max(m, d);
  }
  return m;
}

std::string router_weights_by_id(const Fixture& fx, const std::vector<int32_t>& ids,
                                 const std::vector<float>& weights, int k,
                                 std::vector<float>& got, std::vector<double>& want) {
  const Tensor want_ids = fx.tensor("topk_idx"), want_w = fx.tensor("topk_weight");
  const size_t rows = want_ids.data.size() / static_cast<size_t>(k);
  if (ids.size() != want_ids.data.size() || weights.size() != ids.size())
    return "the router gave " + std::to_string(ids.size()) + " ids for " +
           std::to_string(want_ids.data.size());
  for (size_t t = 0; t < rows; ++t) {
    const auto row = ids.begin() + static_cast<std::ptrdiff_t>(t * k);
    for (int j = 0; j < k; ++j) {
      const int id = static_cast<int>(want_ids.data[t * k + j]);
      const auto at = std::find(row, row + k, id);
      if (at == row + k) return "row " + std::to_string(t) + " lacks expert " + std::to_string(id);
      got.push_back(weights[static_cast<size_t>(at - ids.begin())]);
      want.push_back(want_w.data[t * k + j]);
    }
  }
  return "";
}

GluHalves glu_halves(const Tensor& in) {
  GluHalves h{in.shape.at(0), in.shape.at(1) / 2, {}, {}};
  h.a.reserve(static_cast<size_t>(h.rows * h.half));
  h.b.reserve(h.a.capacity());
  for (int64_t r = 0; r < h.rows; ++r)
    for (int64_t i = 0; i < h.half; ++i) {
      h.a.push_back(static_cast<float>(in.data[r * 2 * h.half + i]));
      h.b.push_back(static_cast<float>(in.data[r * 2 * h.half + h.half + i]));
    }
  return h;
}

void report_ratio(const std::string& what, const ToleranceResult& r, const std::string& readme) {
  std::printf("[conformance] %-34s worst ratio %.4f at %lld (got %.9g want %.9g); README %s\n",
              what.c_str(), r.worst_ratio, static_cast<long long>(r.worst_index), r.got, r.want,
              readme.c_str());
}

std::string compare_bits(const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    uint32_t ba, bb;
    std::memcpy(&ba, &a[i], 4);
    std::memcpy(&bb, &b[i], 4);
    if (ba != bb) {
      std::ostringstream os;
      os << "element " << i << " of " << n << ": " << a[i] << " (0x" << std::hex << ba << ") vs "
         << std::dec << b[i] << " (0x" << std::hex << bb << ")";
      return os.str();
    }
  }
  return {};
}

void poison(float* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(&p[i], &kPoisonBits, 4);
}

std::vector<float> poisoned(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  poison(v.data(), n);
  return v;
}

int64_t count_poison(const float* p, int64_t n) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, &p[i], 4);
    c += b == kPoisonBits;
  }
  return c;
}

std::string skip_reason(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar: always supported";
    case Isa::kAvx2:
      return "avx2: this build has no x86 kernels or the CPU lacks AVX2/FMA/F16C; only the "
             "scalar kernels can run here";
    case Isa::kAvx512:
      return "avx512: this build has no AVX-512 kernels, or the CPU lacks AVX512F/BW/DQ/VL "
             "(or AVX2/FMA/F16C), or the OS does not save zmm state (XCR0)";
  }
  return "unknown instruction set";
}

// Values spread over several binades, both signs; one in eight is far larger or smaller
// (2^+-12..2^+-30), so sums cancel and absorb: a different order or an extra rounding anywhere
// then shows in the f32 result instead of hiding below it.
float random_float(std::mt19937_64& rng, float scale) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-6, 2), wide(12, 30), pick(0, 15);
  const int k = pick(rng);
  const int exp = k == 0 ? wide(rng) : k == 1 ? -wide(rng) : e(rng);
  return scale * std::ldexp(u(rng), exp);
}

std::vector<float> random_floats(std::mt19937_64& rng, int64_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = random_float(rng, scale);
  return v;
}

}  // namespace ktier::cpu::test

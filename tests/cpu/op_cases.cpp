#include "op_cases.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>

#include "common/check.h"
#include "cpu/kernel_table.h"
#include "test_support.h"

namespace ktier::cpu::test {
namespace {

constexpr int64_t kGuard = 8;       // poisoned floats after each output buffer
constexpr float kCancel = 0x1p48f;  // magnitude of the planted cancelling pairs

struct Gen {
  std::mt19937_64 rng;
  bool specials;
  std::vector<float> floats(int64_t n, float scale = 1.0f) {
    std::vector<float> v = random_floats(rng, n, scale);
    if (specials) inject(v);
    return v;
  }
  // NaN, +-Inf and a subnormal at random positions (if the vector is long enough).
  void inject(std::vector<float>& v) {
    if (v.empty()) return;
    const float sp[] = {NAN, INFINITY, -INFINITY, 1e-41f};
    std::uniform_int_distribution<size_t> pos(0, v.size() - 1);
    for (float s : sp)
      if (v.size() > 3) v[pos(rng)] = s;
  }
  std::vector<uint16_t> half_bits(int64_t n, bool bf16) {
    std::vector<uint16_t> v(static_cast<size_t>(n));
    std::uniform_int_distribution<int> sign(0, 1), mant(0, bf16 ? 127 : 1023);
    // exponents near 1.0, with some subnormals (exponent field 0)
    std::uniform_int_distribution<int> exp(bf16 ? 120 : 12, bf16 ? 128 : 16);
    for (auto& h : v) {
      int e = exp(rng);
      if (e == (bf16 ? 120 : 12)) e = 0;
      h = bf16 ? static_cast<uint16_t>(sign(rng) << 15 | e << 7 | mant(rng))
               : static_cast<uint16_t>(sign(rng) << 15 | e << 10 | mant(rng));
    }
    if (specials && n > 3) {
      v[0] = bf16 ? 0x7fc0 : 0x7e00;                           // NaN
      v[static_cast<size_t>(n / 2)] = bf16 ? 0x7f80 : 0x7c00;  // +Inf
    }
    return v;
  }
  std::vector<uint8_t> bytes(int64_t n, int lo, int hi) {
    std::vector<uint8_t> v(static_cast<size_t>(n));
    std::uniform_int_distribution<int> d(lo, hi);
    for (auto& b : v) b = static_cast<uint8_t>(d(rng));
    return v;
  }
};

// Owns the bytes of one random weight matrix of any type.
struct RandomWeight {
  std::vector<float> f32;
  std::vector<uint16_t> half;
  std::vector<uint8_t> packed, scales;
  WeightMatrix view{};
};
std::shared_ptr<RandomWeight> random_weight(Gen& g, WeightType type, int64_t rows, int64_t cols) {
  auto w = std::make_shared<RandomWeight>();
  const void* data = nullptr;
  switch (type) {
    case WeightType::kF32:
      w->f32 = g.floats(rows * cols);
      data = w->f32.data();
      break;
    case WeightType::kBF16:
      w->half = g.half_bits(rows * cols, true);
      data = w->half.data();
      break;
    case WeightType::kF16:
      w->half = g.half_bits(rows * cols, false);
      data = w->half.data();
      break;
    case WeightType::kMxfp4: {
      w->packed = g.bytes(rows * cols / 2, 0, 255);
      w->scales = g.bytes(rows * cols / 32, 110, 140);
      for (size_t i = 0; i < w->scales.size(); i += 7) w->scales[i] = (i % 14 == 0) ? 255 : 0;
      data = w->packed.data();
      break;
    }
  }
  w->view = {type, data, w->scales.empty() ? nullptr : w->scales.data(), rows, cols};
  return w;
}

// Plants an exactly cancelling pair in every row: column j becomes a copy of column i, and each
// token gets x[i] = +B, x[j] = -B with B = 2^48 (so the ulp of the partial sums, ~2^-4, is the size
// of the other terms). The exact dot product is unchanged, but which small terms the +-2^48 partial
// sums absorb depends on the lane each element lands in, so a kernel that assigns lanes or orders
// its sums differently from the contract changes the f32 output grossly instead of in an invisible
// double ulp. MXFP4 needs i and j in one block.
void plant_cancelling_pair(RandomWeight& w, std::vector<float>& x, int64_t T, int64_t i,
                           int64_t j) {
  const int64_t rows = w.view.rows, cols = w.view.cols;
  for (int64_t r = 0; r < rows; ++r) {
    switch (w.view.type) {
      case WeightType::kF32: w.f32[r * cols + j] = w.f32[r * cols + i]; break;
      case WeightType::kBF16:
      case WeightType::kF16: w.half[r * cols + j] = w.half[r * cols + i]; break;
      case WeightType::kMxfp4: {
        uint8_t* row = w.packed.data() + r * cols / 2;
        const int code = 7;  // 6.0 at both i and j: a non-zero pair
        row[i / 2] = (i & 1) ? static_cast<uint8_t>((row[i / 2] & 0x0f) | code << 4)
                             : static_cast<uint8_t>((row[i / 2] & 0xf0) | code);
        row[j / 2] = (j & 1) ? static_cast<uint8_t>((row[j / 2] & 0x0f) | code << 4)
                             : static_cast<uint8_t>((row[j / 2] & 0xf0) | code);
        w.scales[r * cols / 32 + i / 32] = 121;  // a real-looking scale, never the zero block
        break;
      }
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    x[t * cols + i] = kCancel;
    x[t * cols + j] = -kCancel;
  }
}

void store_int(float* dst, int64_t v) {
  const int32_t i = static_cast<int32_t>(v);
  std::memcpy(dst, &i, 4);
}

}  // namespace

std::vector<OpCase> make_op_cases(const CaseOptions& opt) {
  auto g = std::make_shared<Gen>(Gen{std::mt19937_64(opt.seed), opt.specials});
  std::vector<OpCase> cases;
  const std::vector<int64_t> widths =
      opt.large ? std::vector<int64_t>{1000, 4099} : std::vector<int64_t>{1, 17, 54, 97, 33};
  const int64_t rows = opt.large ? 301 : 17;

  // (a, b) linear: every weight type, decode and small batches, plus one mixed multi-job call.
  for (WeightType type :
       {WeightType::kF32, WeightType::kBF16, WeightType::kF16, WeightType::kMxfp4}) {
    const std::vector<int64_t> cols_list =
        type != WeightType::kMxfp4
            ? widths
            : (opt.large ? std::vector<int64_t>{3584} : std::vector<int64_t>{32, 96, 544});
    for (int64_t cols : cols_list) {
      for (int64_t T : {int64_t{1}, int64_t{3}}) {
        auto w = random_weight(*g, type, rows, cols);
        auto x = std::make_shared<std::vector<float>>(g->floats(T * cols));
        if (type == WeightType::kMxfp4)
          plant_cancelling_pair(*w, *x, T, 1, 30);  // block 0, lanes 1 and 6
        else if (cols >= 4)
          plant_cancelling_pair(*w, *x, T, 1, cols - 2);
        cases.push_back({"linear " + std::string(weight_type_name(type)) +
                             " cols=" + std::to_string(cols) + " T=" + std::to_string(T),
                         true,
                         {T * rows},
                         [w, x, T](const Exec& ex, const std::vector<float*>& o) {
                           linear(w->view, x->data(), T, o[0], ex);
                         }});
      }
    }
  }
  {
    const int64_t cols = opt.large ? 1024 : 96;
    auto a = random_weight(*g, WeightType::kBF16, rows, cols);
    auto b = random_weight(*g, WeightType::kMxfp4, rows + 2, cols);
    auto c = random_weight(*g, WeightType::kF16, 5, cols);
    auto x = std::make_shared<std::vector<float>>(g->floats(2 * cols));
    cases.push_back({"linear multi-job mixed types",
                     true,
                     {2 * rows, 2 * (rows + 2), 5},
                     [a, b, c, x](const Exec& ex, const std::vector<float*>& o) {
                       const LinearJob jobs[] = {{a->view, x->data(), 2, o[0]},
                                                 {b->view, x->data(), 2, o[1]},
                                                 {c->view, x->data() + c->view.cols, 1, o[2]}};
                       linear(jobs, 3, ex);
                     }});
  }

  // (c, d) norms.
  for (int64_t n : widths) {
    const int64_t r = opt.large ? 64 : 3;
    auto x = std::make_shared<std::vector<float>>(g->floats(r * n));
    auto gain = std::make_shared<std::vector<float>>(g->floats(n));
    cases.push_back({"rmsnorm n=" + std::to_string(n),
                     true,
                     {r * n, r * n},
                     [x, gain, r, n](const Exec& ex, const std::vector<float*>& o) {
                       rmsnorm(x->data(), gain->data(), r, n, 1e-5, o[0], ex);
                       rmsnorm(x->data(), nullptr, r, n, 1e-6, o[1], ex);
                     }});
    cases.push_back({"l2norm n=" + std::to_string(n),
                     true,
                     {r * n},
                     [x, r, n](const Exec& ex, const std::vector<float*>& o) {
                       l2norm(x->data(), r, n, 1e-6, o[0], ex);
                     }});
  }

  // (e) and the other elementwise ops; inputs span the saturated ranges too.
  for (int64_t n : widths) {
    const int64_t len = opt.large ? 5 * n : n;
    auto a = std::make_shared<std::vector<float>>(g->floats(len, 40.0f));
    auto b = std::make_shared<std::vector<float>>(g->floats(len, 40.0f));
    cases.push_back({"situ_glu/sigmoid/gate/add n=" + std::to_string(len),
                     true,
                     {len, len, len, len, len},
                     [a, b, len](const Exec& ex, const std::vector<float*>& o) {
                       situ_glu(a->data(), b->data(), len, 4.0, 25.0, o[0], ex);
                       situ_glu(a->data(), b->data(), len, 4.0, std::nullopt, o[1], ex);
                       sigmoid(a->data(), len, o[2], ex);
                       sigmoid_gate(b->data(), a->data(), len, o[3], ex);
                       add(a->data(), b->data(), len, o[4], ex);
                     }});
    for (int k : {1, 3, 16}) {
      auto vecs = std::make_shared<std::vector<std::vector<float>>>();
      for (int j = 0; j < k; ++j) vecs->push_back(g->floats(n));
      auto wts = std::make_shared<std::vector<float>>(g->floats(k));
      if (k >= 3) {  // vec 1 cancels vec 0 at 2^48: the sum order decides what is absorbed
        (*wts)[1] = (*wts)[0];
        for (int64_t i = 0; i < n; ++i) (*vecs)[1][i] = -((*vecs)[0][i] = kCancel);
      }
      cases.push_back({"weighted_sum k=" + std::to_string(k) + " n=" + std::to_string(n),
                       false,
                       {n},
                       [vecs, wts, k, n](const Exec& ex, const std::vector<float*>& o) {
                         std::vector<const float*> p;
                         for (const auto& v : *vecs) p.push_back(v.data());
                         weighted_sum(p.data(), wts->data(), k, n, o[0], ex);
                       }});
    }
  }

  // (f) short conv, (g) decay gate, (h) recurrence.
  for (int64_t C : widths) {
    for (int K : {1, 2, 4}) {
      const int64_t T = K == 4 ? 5 : 2;
      auto u = std::make_shared<std::vector<float>>(g->floats(T * C));
      auto w = std::make_shared<std::vector<float>>(g->floats(C * K));
      auto hist = std::make_shared<std::vector<float>>(g->floats((K - 1) * C));
      cases.push_back({"kda_short_conv C=" + std::to_string(C) + " K=" + std::to_string(K),
                       true,
                       {T * C, (K - 1) * C},
                       [u, w, hist, T, C, K](const Exec& ex, const std::vector<float*>& o) {
                         std::copy(hist->begin(), hist->end(), o[1]);
                         kda_short_conv(u->data(), T, C, w->data(), K, o[1], o[0], ex);
                       }});
    }
  }
  for (int64_t D : widths) {
    const int H = opt.large ? 7 : 3;
    const int64_t T = 2, n = T * H * D;
    auto z = std::make_shared<std::vector<float>>(g->floats(n, 8.0f));
    auto A_log = std::make_shared<std::vector<float>>(g->floats(H));
    auto dt = std::make_shared<std::vector<float>>(g->floats(H * D));
    cases.push_back({"kda_decay_gate D=" + std::to_string(D),
                     true,
                     {n, n},
                     [z, A_log, dt, H, D, T](const Exec& ex, const std::vector<float*>& o) {
                       kda_decay_gate(z->data(), T, H, static_cast<int>(D), A_log->data(),
                                      dt->data(), -5.0, o[0], o[1], ex);
                     }});
    // The model asks for alpha alone (g null): the kernels' other path.
    cases.push_back({"kda_decay_gate D=" + std::to_string(D) + " alpha only",
                     true,
                     {n},
                     [z, A_log, dt, H, D, T](const Exec& ex, const std::vector<float*>& o) {
                       kda_decay_gate(z->data(), T, H, static_cast<int>(D), A_log->data(),
                                      dt->data(), -5.0, nullptr, o[0], ex);
                     }});
  }
  for (int64_t Dk : widths) {
    if (opt.large && Dk > 1000) continue;
    const int H = opt.large ? 5 : 3,
              Dv = static_cast<int>(opt.large ? 130 : (Dk % 2 ? Dk : Dk + 3));
    const int64_t T = 3;
    auto q = std::make_shared<std::vector<float>>(g->floats(T * H * Dk));
    auto k = std::make_shared<std::vector<float>>(g->floats(T * H * Dk));
    auto v = std::make_shared<std::vector<float>>(g->floats(T * H * Dv));
    auto al = std::make_shared<std::vector<float>>(g->floats(T * H * Dk));
    auto beta = std::make_shared<std::vector<float>>(g->floats(T * H));
    auto S0 = std::make_shared<std::vector<float>>(g->floats(H * Dk * Dv));
    cases.push_back({"kda_recurrence Dk=" + std::to_string(Dk) + " Dv=" + std::to_string(Dv),
                     true,
                     {T * H * Dv, H * Dk * Dv},
                     [=](const Exec& ex, const std::vector<float*>& o) {
                       std::copy(S0->begin(), S0->end(), o[1]);
                       kda_recurrence(q->data(), k->data(), v->data(), al->data(), beta->data(), T,
                                      H, static_cast<int>(Dk), Dv, 0.25, o[1], o[0], ex);
                     }});
  }

  // (i) MLA over a cache with history: every float type for kv_b, odd latent widths.
  for (int64_t L : opt.large ? std::vector<int64_t>{512} : std::vector<int64_t>{17, 54, 97, 33}) {
    for (WeightType type : {WeightType::kF32, WeightType::kBF16, WeightType::kF16}) {
      MlaDims d;
      d.n_heads = opt.large ? 6 : 3;
      d.qk_nope = 17;
      d.qk_rope = 5;
      d.v_head = 9;
      d.kv_lora = static_cast<int>(L);
      const int64_t T = 3, n_past = 2, N = n_past + T;
      auto w = random_weight(*g, type, static_cast<int64_t>(d.n_heads) * (d.qk_nope + d.v_head), L);
      auto q =
          std::make_shared<std::vector<float>>(g->floats(T * d.n_heads * (d.qk_nope + d.qk_rope)));
      auto c = std::make_shared<std::vector<float>>(g->floats(N * L));
      auto r = std::make_shared<std::vector<float>>(g->floats(N * d.qk_rope));
      cases.push_back({"mla_attention L=" + std::to_string(L) + " " + weight_type_name(type),
                       true,
                       {T * d.n_heads * d.v_head},
                       [=](const Exec& ex, const std::vector<float*>& o) {
                         mla_attention(d, q->data(), T, w->view, c->data(), r->data(), n_past,
                                       1.0 / std::sqrt(22.0), o[0], ex);
                       }});
    }
  }

  // (i') MLA over a long history: several mix tiles, an odd head count (pairs and a single in
  // the score kernel), latent widths with and without whole 32-channel mix ranges.
  for (int64_t L : opt.large ? std::vector<int64_t>{512} : std::vector<int64_t>{97, 64}) {
    for (WeightType type : {WeightType::kF32, WeightType::kBF16}) {
      MlaDims d;
      d.n_heads = opt.large ? 7 : 5;
      d.qk_nope = 19;
      d.qk_rope = 21;  // one whole 16-lane block and a tail
      d.v_head = 11;
      d.kv_lora = static_cast<int>(L);
      const int64_t T = 2, n_past = opt.large ? 300 : 150, N = n_past + T;
      auto w = random_weight(*g, type, static_cast<int64_t>(d.n_heads) * (d.qk_nope + d.v_head), L);
      auto q =
          std::make_shared<std::vector<float>>(g->floats(T * d.n_heads * (d.qk_nope + d.qk_rope)));
      auto c = std::make_shared<std::vector<float>>(g->floats(N * L));
      auto r = std::make_shared<std::vector<float>>(g->floats(N * d.qk_rope));
      cases.push_back({"mla_attention long history L=" + std::to_string(L) + " " +
                           weight_type_name(type),
                       true,
                       {T * d.n_heads * d.v_head},
                       [=](const Exec& ex, const std::vector<float*>& o) {
                         mla_attention(d, q->data(), T, w->view, c->data(), r->data(), n_past,
                                       1.0 / std::sqrt(40.0), o[0], ex);
                       }});
    }
  }

  // (j) AttnRes with 1, 2 and 9 sources.
  for (int64_t n : widths) {
    for (int m : {1, 2, 9}) {
      const int64_t T = opt.large ? 6 : 2;
      auto src = std::make_shared<std::vector<std::vector<float>>>();
      for (int i = 0; i < m; ++i) src->push_back(g->floats(T * n));
      auto f = std::make_shared<std::vector<float>>(g->floats(n));
      if (n >= 4) {  // a cancelling pair in the score dots v_i . f (see plant_cancelling_pair)
        (*f)[n - 2] = -((*f)[1] = kCancel);
        for (auto& v : *src)
          for (int64_t t = 0; t < T; ++t) v[t * n + n - 2] = v[t * n + 1];
      }
      cases.push_back({"attnres m=" + std::to_string(m) + " n=" + std::to_string(n),
                       true,
                       {T * n},
                       [src, f, m, n, T](const Exec& ex, const std::vector<float*>& o) {
                         std::vector<const float*> p;
                         for (const auto& s : *src) p.push_back(s.data());
                         attnres(p.data(), m, n, T, n, f->data(), 1e-5, o[0], ex);
                       }});
    }
  }

  // (k) router with ties (repeated logits) and (l) argmax with ties, -0/+0 and NaN.
  for (int n_exp : {17, 54, 97}) {
    for (int k : {1, 2, 16}) {
      const int64_t T = opt.large ? 9 : 3;
      auto logits = std::make_shared<std::vector<float>>(g->floats(T * n_exp, 4.0f));
      for (int64_t i = 5; i < T * n_exp; i += 5) (*logits)[i] = (*logits)[i - 3];  // ties
      auto bias = std::make_shared<std::vector<float>>(g->floats(n_exp, 0.05f));
      for (int e = 2; e < n_exp; e += 7) (*bias)[e] = 0.0f;
      cases.push_back({"router_topk n=" + std::to_string(n_exp) + " k=" + std::to_string(k),
                       true,
                       {T * k, T * k, T * k, T * k},
                       [=](const Exec& ex, const std::vector<float*>& o) {
                         std::vector<int32_t> ids(T * k);
                         router_topk(logits->data(), bias->data(), T, n_exp, k, true, 2.5,
                                     ids.data(), o[1], ex);
                         for (int64_t i = 0; i < T * k; ++i) store_int(o[0] + i, ids[i]);
                         router_topk(logits->data(), nullptr, T, n_exp, k, false, 1.0, ids.data(),
                                     o[3], ex);
                         for (int64_t i = 0; i < T * k; ++i) store_int(o[2] + i, ids[i]);
                       }});
    }
  }
  for (int64_t n : widths) {
    auto x = std::make_shared<std::vector<float>>(g->floats(n));
    if (n > 10) {
      (*x)[n - 2] = (*x)[3] = 1e30f;  // tie: the lower index wins
      (*x)[1] = NAN;
    }
    auto zeros = std::make_shared<std::vector<float>>(n, -0.0f);
    if (n > 4) (*zeros)[n - 1] = 0.0f;
    cases.push_back({"argmax n=" + std::to_string(n),
                     false,
                     {2},
                     [x, zeros, n](const Exec& ex, const std::vector<float*>& o) {
                       store_int(o[0], argmax(x->data(), n, ex));
                       store_int(o[0] + 1, argmax(zeros->data(), n, ex));
                     }});
  }
  return cases;
}

std::vector<OpCase> make_linear_sweep_cases(const CaseOptions& opt) {
  auto g = std::make_shared<Gen>(Gen{std::mt19937_64(opt.seed ^ 0x5eedull), opt.specials});
  std::vector<OpCase> cases;
  const char* const kScaleModes[] = {"no zero block", "zero block in last row",
                                     "zero blocks every 7th", "extreme scales, no zero block"};
  for (WeightType type :
       {WeightType::kF32, WeightType::kBF16, WeightType::kF16, WeightType::kMxfp4}) {
    const bool mx = type == WeightType::kMxfp4;
    const std::vector<int64_t> cols_list =
        mx ? std::vector<int64_t>{32, 64, 96, 544}
           : std::vector<int64_t>{1, 2, 15, 16, 17, 31, 33, 48, 97};
    int variant = 0;
    for (int64_t cols : cols_list) {
      for (int64_t rows : {1, 2, 3, 4, 5, 8, 9, 13}) {
        for (int64_t T : {1, 2, 3, 4, 5, 7}) {
          auto w = random_weight(*g, type, rows, cols);
          auto x = std::make_shared<std::vector<float>>(g->floats(T * cols));
          std::string name = "linear sweep " + std::string(weight_type_name(type)) +
                             " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
                             " T=" + std::to_string(T);
          if (mx) {
            const int mode = variant++ % 4;
            name += std::string(", ") + kScaleModes[mode];
            const int64_t G = cols / 32;
            std::uniform_int_distribution<int> normal(110, 140), pick(0, 5);
            const uint8_t extreme[] = {0, 1, 2, 127, 253, 254};
            for (size_t i = 0; i < w->scales.size(); ++i) {
              if (mode == 0 || mode == 1) w->scales[i] = static_cast<uint8_t>(normal(g->rng));
              if (mode == 3) w->scales[i] = extreme[pick(g->rng)];
            }
            if (mode == 1) w->scales[(rows - 1) * G] = 255;
            // The pair goes in the last block (lanes 1 and 6), whose scale it sets to a normal
            // one in every row; with a single block that would remove the zero blocks.
            if (G > 1 || mode == 0) plant_cancelling_pair(*w, *x, T, cols - 31, cols - 2);
            if (opt.specials && mode != 0) {  // NaN/Inf under a zero block must not reach y
              for (int64_t b = 0; b < rows * G; ++b) {
                if (w->scales[b] != 255) continue;
                const int64_t c = (b % G) * 32 + (b % 32);
                for (int64_t t = 0; t < T; ++t) (*x)[t * cols + c] = t % 2 ? INFINITY : NAN;
                break;
              }
            }
          } else if (cols >= 4) {
            plant_cancelling_pair(*w, *x, T, 1, cols - 2);
          }
          cases.push_back(
              {name, false, {T * rows}, [w, x, T](const Exec& ex, const std::vector<float*>& o) {
                 linear(w->view, x->data(), T, o[0], ex);
               }});
        }
      }
    }
  }
  // Zero-width float matrices, decode to blocked prefill: every output is +0.
  for (WeightType type : {WeightType::kF32, WeightType::kBF16, WeightType::kF16}) {
    for (int64_t T : {int64_t{1}, int64_t{3}, kLinearWidenMinTokens + 1}) {
      const cpu::WeightMatrix w{type, nullptr, nullptr, 7, 0};
      cases.push_back({"linear zero width " + std::string(weight_type_name(type)) +
                           " T=" + std::to_string(T),
                       false,
                       {T * 7},
                       [w, T](const Exec& ex, const std::vector<float*>& o) {
                         linear(w, nullptr, T, o[0], ex);
                         for (int64_t i = 0; i < T * 7; ++i)
                           EXPECT_EQ(std::signbit(o[0][i]) || o[0][i] != 0.0f, false) << i;
                       }});
    }
  }
  // Prefill shapes: ranges spanning several weight panels (kernel_table.h), float weights over
  // several column slices with a tail and over two token blocks, token groups with a partial
  // last one, rows not a multiple of the row tiles.
  struct PanelCase {
    WeightType type;
    int64_t rows, cols, T;
  };
  for (const PanelCase& pc : {PanelCase{WeightType::kBF16, 67, 3001, kLinearBlockTokens + 5},
                              PanelCase{WeightType::kF32, 37, 2049, 5},
                              PanelCase{WeightType::kF16, 35, 6000, 7},
                              PanelCase{WeightType::kBF16, 37, 7001, 3},
                              PanelCase{WeightType::kMxfp4, 93, 8192, 11},
                              PanelCase{WeightType::kMxfp4, 61, 16384, 6}}) {
    auto w = random_weight(*g, pc.type, pc.rows, pc.cols);
    KTIER_CHECK(pc.rows > linear_panel_rows(LinearTask{w->view, nullptr, pc.T, nullptr}));
    auto x = std::make_shared<std::vector<float>>(g->floats(pc.T * pc.cols));
    if (pc.type == WeightType::kMxfp4 && opt.specials) w->scales[5 * (pc.cols / 32) + 3] = 255;
    plant_cancelling_pair(*w, *x, pc.T, 1, pc.type == WeightType::kMxfp4 ? 30 : pc.cols - 2);
    const int64_t T = pc.T;
    cases.push_back({"linear panels " + std::string(weight_type_name(pc.type)) +
                         " rows=" + std::to_string(pc.rows) + " cols=" + std::to_string(pc.cols) +
                         " T=" + std::to_string(T),
                     false,
                     {T * pc.rows},
                     [w, x, T](const Exec& ex, const std::vector<float*>& o) {
                       linear(w->view, x->data(), T, o[0], ex);
                     }});
  }
  return cases;
}

std::vector<std::vector<float>> run_poisoned(const OpCase& c, const Exec& ex) {
  std::vector<std::vector<float>> bufs;
  std::vector<float*> ptrs;
  for (int64_t n : c.out_sizes) {
    bufs.emplace_back(static_cast<size_t>(n + kGuard));
    poison(bufs.back().data(), n + kGuard);
  }
  for (auto& b : bufs) ptrs.push_back(b.data());
  c.run(ex, ptrs);
  for (size_t i = 0; i < bufs.size(); ++i) {
    const int64_t n = c.out_sizes[i];
    EXPECT_EQ(count_poison(bufs[i].data(), n), 0)
        << c.name << ": output " << i << " not fully written";
    EXPECT_EQ(count_poison(bufs[i].data() + n, kGuard), kGuard)
        << c.name << ": write past output " << i;
    bufs[i].resize(static_cast<size_t>(n));
  }
  return bufs;
}

}  // namespace ktier::cpu::test

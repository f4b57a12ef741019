// config.json reader and validator (K3-MODEL.md §2). See config.h for the contract.
#include "format/config.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <set>
#include <unordered_set>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/check.h"
#include "common/json_text.h"
#include "io/read_file.h"

namespace ktier::format {
namespace {

using json = nlohmann::json;

// A JSON object keys are looked up in, with its dotted path for messages ("" is the root).
struct Scope {
  const json* obj = nullptr;
  std::string path;

  std::string key_path(std::string_view key) const {
    return path.empty() ? std::string(key) : path + "." + std::string(key);
  }
  // nullptr when the key is absent; a JSON null counts as present.
  const json* find(std::string_view key) const {
    if (obj == nullptr || !obj->is_object()) return nullptr;
    auto it = obj->find(key);
    return it == obj->end() ? nullptr : &*it;
  }
};

// Short human description of a JSON value for "got ..." messages.
std::string describe(const json& v) {
  if (v.is_null()) return "null";
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return std::string(v.type_name()) + " " + text;
}

// The shortest text that reads back as `v` (1e300, not 1.0000000000000001e+300).
std::string format_number(double v) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : std::string("?");
}

// Appends the ids of `from` not yet in `to`, in order (a hash set: a hostile list of millions
// of ids costs a pass, not a search per id).
void append_new_ids(std::vector<int64_t>& to, const std::vector<int64_t>& from) {
  std::unordered_set<int64_t> seen(to.begin(), to.end());
  for (const int64_t id : from)
    if (seen.insert(id).second) to.push_back(id);
}

// Collects every problem with the file; nothing is reported until parsing is over (rule 2).
// The first kShownErrors are kept (a damaged list can hold millions of wrong values), the
// rest counted.
class ConfigReader {
 public:
  static constexpr size_t kShownErrors = 25;
  explicit ConfigReader(std::string source) : source_(std::move(source)) {}

  void error(const std::string& key_path, const std::string& what) {
    if (++error_count_ <= kShownErrors) errors_.push_back(source_ + ": " + key_path + ": " + what);
  }
  const std::vector<std::string>& errors() const { return errors_; }
  size_t error_count() const { return error_count_; }

  void missing(const Scope& s, std::string_view key, const std::string& hint = "") {
    std::string what = s.path.empty() ? "missing at the root (required; never defaulted"
                                      : "missing (required; never defaulted";
    if (!hint.empty()) what += "; " + hint;
    error(s.key_path(key), what + ")");
  }

  // Integer from a present value; errors name `path`. Rejects floats such as 4.0 (rule 2).
  std::optional<int64_t> as_int(const json& v, const std::string& path) {
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        error(path, "integer " + v.dump() + " is out of range");
        return std::nullopt;
      }
      return static_cast<int64_t>(u);
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    error(path, "expected an integer, got " + describe(v));
    return std::nullopt;
  }
  std::optional<double> as_number(const json& v, const std::string& path) {
    if (v.is_number()) return v.get<double>();
    error(path, "expected a number, got " + describe(v));
    return std::nullopt;
  }
  std::optional<bool> as_bool(const json& v, const std::string& path) {
    if (v.is_boolean()) return v.get<bool>();
    error(path, "expected true or false, got " + describe(v));
    return std::nullopt;
  }
  std::optional<std::vector<int64_t>> as_int_list(const json& v, const std::string& path) {
    if (!v.is_array()) {
      error(path, "expected an array of integers, got " + describe(v));
      return std::nullopt;
    }
    std::vector<int64_t> out;
    bool ok = true;
    for (size_t i = 0; i < v.size(); ++i) {
      auto x = as_int(v[i], path + "[" + std::to_string(i) + "]");
      if (x) out.push_back(*x); else ok = false;
    }
    if (!ok) return std::nullopt;
    return out;
  }

  // Required keys: absent or null is an error (with `null_reason` if given for null).
  std::optional<int64_t> req_int(const Scope& s, std::string_view key,
                                 const std::string& null_reason = "", const std::string& hint = "") {
    const json* v = s.find(key);
    if (v == nullptr) return missing(s, key, hint), std::nullopt;
    if (v->is_null()) {
      error(s.key_path(key), null_reason.empty() ? "null, expected an integer" : null_reason);
      return std::nullopt;
    }
    return as_int(*v, s.key_path(key));
  }
  std::optional<double> req_number(const Scope& s, std::string_view key) {
    const json* v = s.find(key);
    if (v == nullptr) return missing(s, key), std::nullopt;
    return as_number(*v, s.key_path(key));
  }
  std::optional<bool> req_bool(const Scope& s, std::string_view key) {
    const json* v = s.find(key);
    if (v == nullptr) return missing(s, key), std::nullopt;
    return as_bool(*v, s.key_path(key));
  }
  std::optional<std::vector<int64_t>> req_int_list(const Scope& s, std::string_view key) {
    const json* v = s.find(key);
    if (v == nullptr) return missing(s, key), std::nullopt;
    return as_int_list(*v, s.key_path(key));
  }

  // Optional integer: absent or null -> nullopt without error; another type is an error.
  std::optional<int64_t> opt_int(const Scope& s, std::string_view key) {
    const json* v = s.find(key);
    if (v == nullptr || v->is_null()) return std::nullopt;
    return as_int(*v, s.key_path(key));
  }

 private:
  std::string source_;
  std::vector<std::string> errors_;
  size_t error_count_ = 0;
};

// A SiTU beta: nested reads only the released name; flat accepts the released name or the alias
// (both present -> they must agree). `null_allowed`: explicit null means "no cap" (beta_2 only).
struct Beta {
  bool read = false;  // false: an error was recorded
  bool is_null = false;
  double value = 0;
};

Beta read_beta(ConfigReader& r, const Scope& s, bool flat, std::string_view released,
               std::string_view alias, bool null_allowed) {
  auto read_one = [&](std::string_view key, const json& v) -> Beta {
    if (v.is_null()) {
      if (null_allowed) return Beta{true, true, 0};
      r.error(s.key_path(key), "null, expected a number (beta_1 always caps the gate branch)");
      return Beta{};
    }
    auto x = r.as_number(v, s.key_path(key));
    return x ? Beta{true, false, *x} : Beta{};
  };
  const json* v_rel = s.find(released);
  const json* v_alias = flat ? s.find(alias) : nullptr;
  if (v_rel == nullptr && v_alias == nullptr) {
    r.missing(s, released, flat ? "the flat alias '" + std::string(alias) + "' is also accepted"
                                : std::string());
    return Beta{};
  }
  if (v_rel != nullptr && v_alias != nullptr) {
    Beta a = read_one(released, *v_rel);
    Beta b = read_one(alias, *v_alias);
    if (!a.read || !b.read) return Beta{};
    if (a.is_null != b.is_null || (!a.is_null && a.value != b.value)) {
      r.error(s.key_path(released), "disagrees with its alias '" + std::string(alias) + "' (" +
                                        v_rel->dump() + " vs " + v_alias->dump() + ")");
      return Beta{};
    }
    return a;
  }
  return v_rel != nullptr ? read_one(released, *v_rel) : read_one(alias, *v_alias);
}

// ---- guard fields (§2.4) -------------------------------------------------------------------------

void guard_string(ConfigReader& r, const Scope& s, std::string_view key, std::string_view want,
                  const char* meaning) {
  const json* v = s.find(key);
  if (v == nullptr) return;
  if (v->is_string() && v->get<std::string>() == want) return;
  r.error(s.key_path(key), "is " + v->dump() + " but ktier implements only \"" +
                               std::string(want) + "\" (another value means " + meaning + ")");
}

void guard_bool(ConfigReader& r, const Scope& s, std::string_view key, bool want,
                const char* meaning) {
  const json* v = s.find(key);
  if (v == nullptr) return;
  if (v->is_boolean() && v->get<bool>() == want) return;
  r.error(s.key_path(key), "is " + v->dump() + " but ktier implements only " +
                               (want ? "true" : "false") + " (another value means " + meaning + ")");
}

void guard_one(ConfigReader& r, const Scope& s, std::string_view key, bool null_ok,
               const char* meaning) {
  const json* v = s.find(key);
  if (v == nullptr) return;
  if (null_ok && v->is_null()) return;
  if (v->is_number_integer() && v->get<int64_t>() == 1) return;
  r.error(s.key_path(key), "is " + v->dump() + " but ktier implements only 1" +
                               (null_ok ? std::string(" (or null)") : std::string()) +
                               " (another value means " + meaning + ")");
}

void read_guards(ConfigReader& r, ModelConfig& c, const Scope& model, const Scope& kda,
                 const Scope& root, bool nested) {
  guard_string(r, model, "hidden_act", "situ", "a SwiGLU/SiLU model such as Kimi-Linear");
  guard_bool(r, model, "mla_use_nope", true, "rotary embeddings would be needed");
  guard_string(r, model, "moe_router_activation_func", "sigmoid", "softmax routing");
  guard_string(r, model, "topk_method", "noaux_tc",
               "experts chosen without e_score_correction_bias");
  guard_one(r, model, "num_expert_group", true, "grouped top-k");
  guard_one(r, model, "topk_group", true, "grouped top-k");
  guard_one(r, model, "moe_layer_freq", false, "MoE only on some layers");
  guard_bool(r, kda, "use_full_rank_gate", true, "a low-rank KDA output gate g_a/g_b");
  guard_bool(r, root, "tie_word_embeddings", false, "lm_head shared with the embedding");
  if (nested) guard_bool(r, model, "tie_word_embeddings", false, "lm_head shared with the embedding");

  if (const json* v = model.find("num_nextn_predict_layers"); v != nullptr && !v->is_null()) {
    auto n = r.as_int(*v, model.key_path("num_nextn_predict_layers"));
    if (n && *n < 0) {
      r.error(model.key_path("num_nextn_predict_layers"), "is " + std::to_string(*n) +
                                                             ", must be >= 0");
    } else if (n) {
      c.num_nextn_predict_layers = *n;
      if (*n > 0)
        spdlog::warn("{}: num_nextn_predict_layers = {}: the MTP head is ignored (it does not "
                     "change the main forward pass)", c.source, *n);
    }
  }
}

// ---- token ids and quantization -------------------------------------------------------------------

// eos_token_id: an integer, a list of integers, or null; root first, then text_config (D3).
void read_token_ids(ConfigReader& r, ModelConfig& c, const Scope& root, const Scope* text) {
  auto pick = [&](std::string_view key) -> std::pair<const json*, const Scope*> {
    if (const json* v = root.find(key); v != nullptr && !v->is_null()) return {v, &root};
    if (text != nullptr)
      if (const json* v = text->find(key); v != nullptr && !v->is_null()) return {v, text};
    return {nullptr, nullptr};
  };
  if (auto [v, s] = pick("eos_token_id"); v != nullptr) {
    const std::string path = s->key_path("eos_token_id");
    if (v->is_array()) {
      if (auto ids = r.as_int_list(*v, path)) append_new_ids(c.eos_token_ids, *ids);
    } else if (auto id = r.as_int(*v, path)) {
      c.eos_token_ids = {*id};
    }
    // An id outside the vocabulary can never be generated: generation would never stop at it.
    for (int64_t id : c.eos_token_ids)
      if (c.vocab_size >= 1 && (id < 0 || id >= c.vocab_size))
        r.error(path, "id " + std::to_string(id) + " is outside the vocabulary (0.." +
                          std::to_string(c.vocab_size - 1) + ")");
  }
  if (auto [v, s] = pick("bos_token_id"); v != nullptr) c.bos_token_id = r.as_int(*v, s->key_path("bos_token_id"));
  if (auto [v, s] = pick("pad_token_id"); v != nullptr) c.pad_token_id = r.as_int(*v, s->key_path("pad_token_id"));
}

void read_quantization(ConfigReader& r, ModelConfig& c, const Scope& root, const Scope* text) {
  Scope where = root;
  const json* q = nullptr;
  if (text != nullptr && (q = text->find("quantization_config")) != nullptr && !q->is_null()) {
    where = *text;  // D9: text_config's copy wins over a re-saved root copy
  } else {
    q = root.find("quantization_config");
  }
  if (q == nullptr || q->is_null()) return;
  const std::string qpath = where.key_path("quantization_config");
  if (!q->is_object()) return r.error(qpath, "expected an object, got " + describe(*q));

  QuantizationConfig out;
  out.found_in = qpath;
  const Scope qs{q, qpath};
  auto want_string = [&](const Scope& s, std::string_view key, std::string_view want,
                         std::string& dst) {
    const json* v = s.find(key);
    if (v == nullptr) return r.missing(s, key);
    if (v->is_string() && v->get<std::string>() == want) {
      dst = v->get<std::string>();
      return;
    }
    r.error(s.key_path(key), "is " + v->dump() + " but ktier accepts only \"" + std::string(want) +
                                 "\" (MXFP4 experts, K3-MODEL §7)");
  };
  want_string(qs, "quant_method", "compressed-tensors", out.quant_method);
  want_string(qs, "format", "mxfp4-pack-quantized", out.format);

  const json* groups = qs.find("config_groups");
  if (groups == nullptr) {
    r.missing(qs, "config_groups");
  } else if (!groups->is_object() || groups->size() != 1) {
    r.error(qs.key_path("config_groups"),
            "expected an object with exactly one weight group, got " + describe(*groups));
  } else {
    const std::string gpath = qs.key_path("config_groups") + "." + groups->begin().key();
    const json& g = groups->begin().value();
    const Scope gs{&g, gpath};
    const json* w = gs.find("weights");
    if (!g.is_object()) {
      r.error(gpath, "expected an object, got " + describe(g));
    } else if (w == nullptr) {
      r.missing(gs, "weights");
    } else if (!w->is_object()) {
      r.error(gs.key_path("weights"), "expected an object, got " + describe(*w));
    } else {
      const Scope ws{w, gs.key_path("weights")};
      auto want_int = [&](std::string_view key, int64_t want, int64_t& dst) {
        auto v = r.req_int(ws, key);
        if (!v) return;
        if (*v != want)
          return r.error(ws.key_path(key), "is " + std::to_string(*v) + " but ktier accepts only " +
                                               std::to_string(want));
        dst = *v;
      };
      want_int("num_bits", 4, out.num_bits);
      want_string(ws, "type", "float", out.type);
      want_int("group_size", 32, out.group_size);
      if (auto sym = r.req_bool(ws, "symmetric")) {
        if (!*sym) r.error(ws.key_path("symmetric"), "is false but ktier accepts only true");
        out.symmetric = *sym;
      }
      // Optional (older compressed-tensors configs leave them out), but when given they must
      // describe the stored scales: one per group, fixed at save time.
      if (ws.find("strategy") != nullptr) want_string(ws, "strategy", "group", out.strategy);
      if (const json* dyn = ws.find("dynamic"); dyn != nullptr && *dyn != json(false))
        r.error(ws.key_path("dynamic"), "is " + dyn->dump() +
                                            " but ktier accepts only false (scales stored with "
                                            "the weights)");
    }
    // Activations stay bf16/f32 in ktier: a quantization scheme for them cannot be honoured.
    for (const char* key : {"input_activations", "output_activations"})
      if (const json* a = gs.find(key); a != nullptr && !a->is_null())
        r.error(gs.key_path(key),
                "is " + describe(*a) + " but ktier quantizes weights only (expected null)");
  }
  // A quantized KV cache (its scales stored beside the attention weights) is not built: ktier's
  // caches hold f32, so such a checkpoint would run with numbers it was not made for.
  if (const json* kv = qs.find("kv_cache_scheme"); kv != nullptr && !kv->is_null())
    r.error(qs.key_path("kv_cache_scheme"),
            "is " + describe(*kv) + " but ktier keeps the caches unquantized (expected null)");
  c.quantization = std::move(out);
}

// ---- value rules 3-6 ---------------------------------------------------------------------------------

// Runs after every key was read; `path_of` gives the key's location for messages.
template <typename PathOf>
void check_values(ConfigReader& r, const ModelConfig& c, const PathOf& path_of,
                  const std::set<std::string>& unread) {
  auto ok = [&](const char* key) { return unread.count(key) == 0; };
  auto positive = [&](const char* key, int64_t v) {
    if (ok(key) && v < 1) r.error(path_of(key), "is " + std::to_string(v) + ", must be >= 1");
  };
  positive("hidden_size", c.hidden_size);
  positive("num_hidden_layers", c.num_hidden_layers);
  if (c.max_position_embeddings) positive("max_position_embeddings", *c.max_position_embeddings);
  if (ok("num_hidden_layers") && c.num_hidden_layers > kMaxLayers)
    r.error(path_of("num_hidden_layers"), "is " + std::to_string(c.num_hidden_layers) +
                                              ", more than ktier's limit of " +
                                              std::to_string(kMaxLayers) + " layers");
  positive("vocab_size", c.vocab_size);
  positive("kda_num_heads", c.kda_num_heads);
  positive("kda_head_dim", c.kda_head_dim);
  positive("short_conv_kernel_size", c.short_conv_kernel_size);
  positive("num_attention_heads", c.num_attention_heads);
  positive("q_lora_rank", c.q_lora_rank);
  positive("kv_lora_rank", c.kv_lora_rank);
  positive("v_head_dim", c.v_head_dim);
  positive("num_experts", c.num_experts);
  positive("routed_expert_hidden_size", c.routed_expert_hidden_size);
  positive("moe_intermediate_size", c.moe_intermediate_size);
  positive("attn_res_block_size", c.attn_res_block_size);
  if (ok("qk_nope_head_dim") && c.qk_nope_head_dim < 0)
    r.error(path_of("qk_nope_head_dim"), "is " + std::to_string(c.qk_nope_head_dim) + ", must be >= 0");
  if (ok("qk_rope_head_dim") && c.qk_rope_head_dim < 0)
    r.error(path_of("qk_rope_head_dim"), "is " + std::to_string(c.qk_rope_head_dim) + ", must be >= 0");
  if (ok("qk_nope_head_dim") && ok("qk_rope_head_dim") && c.qk_nope_head_dim == 0 &&
      c.qk_rope_head_dim == 0)  // not the sum: two fields near INT64_MAX would overflow it
    r.error(path_of("qk_nope_head_dim"), "qk_nope_head_dim + qk_rope_head_dim must be >= 1");
  else if (ok("qk_nope_head_dim") && c.qk_nope_head_dim == 0)
    // K3-MODEL.md §2.5 allows it beside a rope part; the absorbed MLA kernels need a no-rope
    // part to absorb (K3 has 128): refused here, not aborted in the first forward.
    r.error(path_of("qk_nope_head_dim"),
            "is 0: ktier's MLA needs a no-rope query part (>= 1; K3's is 128)");
  if (ok("num_shared_experts") && c.num_shared_experts < 0)
    r.error(path_of("num_shared_experts"), "is " + std::to_string(c.num_shared_experts) + ", must be >= 0");
  if (ok("first_k_dense_replace") && ok("num_hidden_layers") &&
      (c.first_k_dense_replace < 0 || c.first_k_dense_replace > c.num_hidden_layers))
    r.error(path_of("first_k_dense_replace"), "is " + std::to_string(c.first_k_dense_replace) +
                                                  ", must be in 0..num_hidden_layers (" +
                                                  std::to_string(c.num_hidden_layers) + ")");
  if (ok("intermediate_size") && c.first_k_dense_replace > 0 && c.intermediate_size < 1)
    r.error(path_of("intermediate_size"), "is " + std::to_string(c.intermediate_size) + ", must be >= 1");
  auto at_most = [&](const char* key, int64_t v, int64_t limit) {
    if (ok(key) && v > limit)
      r.error(path_of(key), "is " + std::to_string(v) + ", more than ktier's limit of " +
                                std::to_string(limit));
  };
  struct Bound {
    const char* key;
    int64_t value, limit;
  };
  for (const Bound& b : {Bound{"hidden_size", c.hidden_size, kMaxWidth},
                         {"vocab_size", c.vocab_size, kMaxWidth},
                         {"kda_head_dim", c.kda_head_dim, kMaxWidth},
                         {"q_lora_rank", c.q_lora_rank, kMaxWidth},
                         {"kv_lora_rank", c.kv_lora_rank, kMaxWidth},
                         {"qk_nope_head_dim", c.qk_nope_head_dim, kMaxWidth},
                         {"qk_rope_head_dim", c.qk_rope_head_dim, kMaxWidth},
                         {"v_head_dim", c.v_head_dim, kMaxWidth},
                         {"routed_expert_hidden_size", c.routed_expert_hidden_size, kMaxWidth},
                         {"moe_intermediate_size", c.moe_intermediate_size, kMaxWidth},
                         {"intermediate_size", c.intermediate_size, kMaxWidth},
                         {"kda_num_heads", c.kda_num_heads, kMaxCount},
                         {"short_conv_kernel_size", c.short_conv_kernel_size, kMaxCount},
                         {"num_attention_heads", c.num_attention_heads, kMaxCount},
                         {"num_experts", c.num_experts, kMaxCount},
                         {"num_shared_experts", c.num_shared_experts, kMaxCount},
                         {"attn_res_block_size", c.attn_res_block_size, kMaxCount}})
    at_most(b.key, b.value, b.limit);

  // Rule 4. JSON text cannot spell inf/NaN, but a config built in memory can hold them. The
  // kernels take these as 32-bit floats: 1e300 would become inf there, and 1e-50 zero.
  auto finite_cmp = [&](const char* key, double v, bool want_positive) {
    if (!ok(key)) return;
    const bool good = std::isfinite(v) && (want_positive ? v > 0 : v < 0);
    if (!good) {
      r.error(path_of(key), "is " + format_number(v) + ", must be finite and " +
                                (want_positive ? "> 0" : "< 0"));
      return;
    }
    const float as_float = static_cast<float>(v);  // what the kernels get
    if (!std::isfinite(as_float) || as_float == 0.0f)
      r.error(path_of(key), "is " + format_number(v) + ", outside what a 32-bit float holds "
                                "(it would be " + (as_float == 0.0f ? "0" : "infinite") + ")");
  };
  finite_cmp("rms_norm_eps", c.rms_norm_eps, true);
  finite_cmp("gate_lower_bound", c.gate_lower_bound, false);
  finite_cmp("activation_situ_beta", c.situ_beta, true);
  if (c.situ_linear_beta) finite_cmp("activation_situ_linear_beta", *c.situ_linear_beta, true);
  finite_cmp("routed_scaling_factor", c.routed_scaling_factor, true);

  // Rule 5: the layer map.
  const int64_t L = c.num_hidden_layers;
  const bool have_L = ok("num_hidden_layers") && L >= 1 && L <= kMaxLayers;
  std::set<int64_t> mla;
  if (ok("full_attn_layers")) {
    const std::string p = path_of("full_attn_layers");
    if (c.full_attn_layers.empty())
      r.error(p, "is empty (ktier needs at least one MLA layer; the list is 1-based)");
    for (size_t i = 0; i < c.full_attn_layers.size(); ++i) {
      const int64_t x = c.full_attn_layers[i];
      if (have_L && (x < 1 || x > L))
        r.error(p, "entry [" + std::to_string(i) + "] = " + std::to_string(x) +
                       " is outside 1.." + std::to_string(L) +
                       " (the list is 1-based; num_hidden_layers = " + std::to_string(L) + ")");
      if (!mla.insert(x).second)
        r.error(p, "entry [" + std::to_string(i) + "] = " + std::to_string(x) + " is a duplicate");
    }
    if (have_L && static_cast<int64_t>(mla.size()) >= L)
      r.error(p, "lists every layer; at least one layer must be KDA");
  }
  if (c.kda_layers && ok("kda_layers") && ok("full_attn_layers") && have_L) {
    const std::string p = path_of("kda_layers");
    std::set<int64_t> kda;
    for (size_t i = 0; i < c.kda_layers->size(); ++i) {
      const int64_t x = (*c.kda_layers)[i];
      if (x < 1 || x > L)
        r.error(p, "entry [" + std::to_string(i) + "] = " + std::to_string(x) + " is outside 1.." +
                       std::to_string(L) + " (the list is 1-based)");
      else if (mla.count(x))
        r.error(p, "entry [" + std::to_string(i) + "] = " + std::to_string(x) +
                       " is also in full_attn_layers");
      if (!kda.insert(x).second)
        r.error(p, "entry [" + std::to_string(i) + "] = " + std::to_string(x) + " is a duplicate");
    }
    // The first few layers neither list covers; the scan stops there, so a huge
    // num_hidden_layers costs no more than the lists' lengths.
    std::string list;
    int listed = 0;
    for (int64_t x = 1; x <= L && listed <= 8; ++x) {
      if (mla.count(x) || kda.count(x)) continue;
      list += listed == 8 ? ", ..." : (listed ? ", " : "") + std::to_string(x);
      ++listed;
    }
    if (listed > 0)
      r.error(p, "together with full_attn_layers does not cover 1.." + std::to_string(L) +
                     " (missing " + list + ")");
  }

  // Rule 6: top-k.
  if (ok("num_experts_per_token")) {
    const int64_t k = c.num_experts_per_token;
    const std::string p = path_of("num_experts_per_token");
    if (k < 1) r.error(p, "is " + std::to_string(k) + ", must be >= 1");
    if (ok("num_experts") && k > c.num_experts)
      r.error(p, "is " + std::to_string(k) + ", larger than num_experts (" +
                     std::to_string(c.num_experts) + ")");
    if (k > kMaxTopK)
      r.error(p, "is " + std::to_string(k) + ", larger than ktier's top-k bound " +
                     std::to_string(kMaxTopK));
  }
}

}  // namespace

const char* config_shape_name(ConfigShape shape) {
  return shape == ConfigShape::kNested ? "nested" : "flat";
}

bool ModelConfig::is_mla(int64_t l) const {
  KTIER_CHECK(l >= 0 && l < static_cast<int64_t>(mla_by_layer.size()));
  return mla_by_layer[static_cast<size_t>(l)];
}
bool ModelConfig::is_dense(int64_t l) const {
  KTIER_CHECK(l >= 0 && l < num_hidden_layers);
  return l < first_k_dense_replace;
}
bool ModelConfig::is_boundary(int64_t l) const {
  KTIER_CHECK(l >= 0 && l < num_hidden_layers && attn_res_block_size > 0);
  return l % attn_res_block_size == 0;
}
int64_t ModelConfig::num_mla_layers() const {
  return std::count(mla_by_layer.begin(), mla_by_layer.end(), true);
}

namespace {

// Why a config with problems may not be Kimi K3's at all: its model_type (root, then
// text_config) is another family's. Empty when each model_type is absent, not a string, or K3's.
// Read only to explain other errors: the K3 fields decide, so a re-saved config that drops or
// renames model_type still loads.
std::string foreign_model_note(const Scope& root, const Scope* text) {
  for (const Scope* s : {&root, text}) {
    if (s == nullptr) continue;
    const json* v = s->find("model_type");
    if (v == nullptr || !v->is_string()) continue;
    const std::string type = v->get<std::string>();
    if (type == "kimi_k3" || type == "kimi_linear") continue;
    std::string note = s->key_path("model_type") + " is \"" + type + "\"";
    const json* arch = root.find("architectures");
    if (arch != nullptr && arch->is_array() && !arch->empty() && (*arch)[0].is_string())
      note += " (" + (*arch)[0].get<std::string>() + ")";
    return note + ", not Kimi K3's \"kimi_k3\" (text_config \"kimi_linear\"): ktier decodes "
                  "Kimi K3-family checkpoints only";
  }
  return "";
}

Result<ModelConfig> parse_config_unguarded(const json& root, const std::string& source_name) {
  ConfigReader r(source_name);
  ModelConfig c;
  c.source = source_name;
  if (!root.is_object())
    return Status::usage(source_name + ": expected a JSON object at the root, got " + describe(root));

  // Rule 1: the shape. A null text_config is an absent one (flat); another non-object is
  // refused by name rather than read as flat (every model field would be "missing").
  const Scope root_scope{&root, ""};
  const json* text = root_scope.find("text_config");
  if (text != nullptr && text->is_null()) text = nullptr;
  if (text != nullptr && !text->is_object())
    return Status::usage(source_name + ": text_config: expected an object (nested shape), got " +
                         describe(*text));
  const bool nested = text != nullptr;
  c.shape = nested ? ConfigShape::kNested : ConfigShape::kFlat;
  const Scope model = nested ? Scope{text, "text_config"} : root_scope;
  Scope kda = root_scope;
  bool kda_ok = true;
  if (nested) {
    const json* lac = model.find("linear_attn_config");
    if (lac == nullptr) {
      kda_ok = false;
      r.missing(model, "linear_attn_config", "the nested shape keeps every KDA field there");
    } else if (!lac->is_object()) {
      kda_ok = false;
      r.error(model.key_path("linear_attn_config"), "expected an object, got " + describe(*lac));
    } else {
      kda = Scope{lac, "text_config.linear_attn_config"};
    }
  } else if (root_scope.find("linear_attn_config") != nullptr) {
    r.error("linear_attn_config",
            "not allowed in the flat shape (flat KDA fields are kda_num_heads, kda_head_dim, ... "
            "at the root; use text_config for the nested shape)");
  }

  // Rule 2: every required key, with its type. `unread` remembers keys that failed so the value
  // rules do not pile a second message onto the same key.
  std::set<std::string> unread;
  auto get_int = [&](const char* name, int64_t& dst, std::optional<int64_t> v) {
    if (v) dst = *v; else unread.insert(name);
  };
  auto get_num = [&](const char* name, double& dst, std::optional<double> v) {
    if (v) dst = *v; else unread.insert(name);
  };
  auto get_bool = [&](const char* name, bool& dst, std::optional<bool> v) {
    if (v) dst = *v; else unread.insert(name);
  };

  get_int("hidden_size", c.hidden_size, r.req_int(model, "hidden_size"));
  get_int("num_hidden_layers", c.num_hidden_layers, r.req_int(model, "num_hidden_layers"));
  get_int("vocab_size", c.vocab_size, r.req_int(model, "vocab_size"));
  get_num("rms_norm_eps", c.rms_norm_eps, r.req_number(model, "rms_norm_eps"));

  if (kda_ok) {
    // Flat: only the kda_* spellings (a bare num_heads/head_dim at a flat root is ambiguous).
    const char* heads_key = nested ? "num_heads" : "kda_num_heads";
    const char* dim_key = nested ? "head_dim" : "kda_head_dim";
    auto ambiguous_hint = [&](const char* bare) -> std::string {
      if (nested || root_scope.find(bare) == nullptr) return "";
      return std::string("a bare '") + bare + "' at a flat root is ambiguous and is not read";
    };
    get_int("kda_num_heads", c.kda_num_heads, r.req_int(kda, heads_key, "", ambiguous_hint("num_heads")));
    get_int("kda_head_dim", c.kda_head_dim, r.req_int(kda, dim_key, "", ambiguous_hint("head_dim")));
    get_int("short_conv_kernel_size", c.short_conv_kernel_size, r.req_int(kda, "short_conv_kernel_size"));
    get_num("gate_lower_bound", c.gate_lower_bound, r.req_number(kda, "gate_lower_bound"));
    if (auto v = r.req_int_list(kda, "full_attn_layers")) c.full_attn_layers = *v;
    else unread.insert("full_attn_layers");
    if (const json* v = kda.find("kda_layers"); v != nullptr && !v->is_null()) {
      c.kda_layers = r.as_int_list(*v, kda.key_path("kda_layers"));
      if (!c.kda_layers) unread.insert("kda_layers");
    }
  } else {
    for (const char* k : {"kda_num_heads", "kda_head_dim", "short_conv_kernel_size",
                          "gate_lower_bound", "full_attn_layers", "kda_layers"})
      unread.insert(k);
  }

  get_int("num_attention_heads", c.num_attention_heads, r.req_int(model, "num_attention_heads"));
  get_int("q_lora_rank", c.q_lora_rank,
          r.req_int(model, "q_lora_rank", "null (no query compression): ktier supports only "
                                          "low-rank MLA queries"));
  get_int("kv_lora_rank", c.kv_lora_rank, r.req_int(model, "kv_lora_rank"));
  get_int("qk_nope_head_dim", c.qk_nope_head_dim, r.req_int(model, "qk_nope_head_dim"));
  get_int("qk_rope_head_dim", c.qk_rope_head_dim, r.req_int(model, "qk_rope_head_dim"));
  get_int("v_head_dim", c.v_head_dim, r.req_int(model, "v_head_dim"));
  get_bool("mla_use_output_gate", c.mla_use_output_gate, r.req_bool(model, "mla_use_output_gate"));

  get_int("num_experts", c.num_experts, r.req_int(model, "num_experts"));
  get_int("num_experts_per_token", c.num_experts_per_token, r.req_int(model, "num_experts_per_token"));
  get_int("num_shared_experts", c.num_shared_experts, r.req_int(model, "num_shared_experts"));
  get_int("routed_expert_hidden_size", c.routed_expert_hidden_size,
          r.req_int(model, "routed_expert_hidden_size",
                    "null (not a latent MoE): ktier implements only the latent MoE"));
  get_int("moe_intermediate_size", c.moe_intermediate_size, r.req_int(model, "moe_intermediate_size"));
  get_num("routed_scaling_factor", c.routed_scaling_factor, r.req_number(model, "routed_scaling_factor"));
  get_bool("moe_renormalize", c.moe_renormalize, r.req_bool(model, "moe_renormalize"));
  get_bool("latent_moe_use_norm", c.latent_moe_use_norm, r.req_bool(model, "latent_moe_use_norm"));
  get_int("first_k_dense_replace", c.first_k_dense_replace, r.req_int(model, "first_k_dense_replace"));
  // I_d is required only when some layer is dense; otherwise it is not read at all.
  if (!unread.count("first_k_dense_replace") && c.first_k_dense_replace > 0)
    get_int("intermediate_size", c.intermediate_size, r.req_int(model, "intermediate_size"));
  else
    unread.insert("intermediate_size");
  get_int("attn_res_block_size", c.attn_res_block_size, r.req_int(model, "attn_res_block_size"));

  const Beta b1 = read_beta(r, model, !nested, "activation_situ_beta", "situ_beta", false);
  if (b1.read) c.situ_beta = b1.value; else unread.insert("activation_situ_beta");
  const Beta b2 = read_beta(r, model, !nested, "activation_situ_linear_beta", "situ_linear_beta", true);
  if (b2.read && !b2.is_null) c.situ_linear_beta = b2.value;
  if (!b2.read) unread.insert("activation_situ_linear_beta");

  read_token_ids(r, c, root_scope, nested ? &model : nullptr);
  c.max_position_embeddings = r.opt_int(model, "max_position_embeddings");
  read_quantization(r, c, root_scope, nested ? &model : nullptr);
  read_guards(r, c, model, kda, root_scope, nested);

  // Rules 3-6. KDA keys live in another object in the nested shape; the flat aliases are the
  // names a flat file actually uses.
  auto path_of = [&](const std::string& key) -> std::string {
    static const std::set<std::string> kda_keys = {"kda_num_heads", "kda_head_dim",
                                                   "short_conv_kernel_size", "gate_lower_bound",
                                                   "full_attn_layers", "kda_layers"};
    if (kda_keys.count(key)) {
      if (nested && key == "kda_num_heads") return kda.key_path("num_heads");
      if (nested && key == "kda_head_dim") return kda.key_path("head_dim");
      return kda.key_path(key);
    }
    if (!nested && key == "activation_situ_beta" && !root_scope.find(key)) return "situ_beta";
    if (!nested && key == "activation_situ_linear_beta" && !root_scope.find(key))
      return "situ_linear_beta";
    return model.key_path(key);
  };
  check_values(r, c, path_of, unread);

  if (!r.errors().empty()) {
    const auto& errs = r.errors();
    const size_t count = r.error_count();
    const std::string foreign = foreign_model_note(root_scope, nested ? &model : nullptr);
    if (count == 1 && foreign.empty()) return Status::usage(errs[0]);
    std::string msg = source_name + ": " + (foreign.empty() ? "" : foreign + "; ") +
                      std::to_string(count) + (count == 1 ? " problem:" : " problems:");
    for (const auto& e : errs) msg += "\n  " + e;
    if (count > errs.size()) msg += "\n  (and " + std::to_string(count - errs.size()) + " more)";
    return Status::usage(msg);
  }

  c.mla_by_layer.assign(static_cast<size_t>(c.num_hidden_layers), false);
  for (int64_t x : c.full_attn_layers) c.mla_by_layer[static_cast<size_t>(x - 1)] = true;
  spdlog::debug("{}: {} config: E={} L={} V={} experts {}/top-{} ({} MLA, {} KDA layers)",
                source_name, config_shape_name(c.shape), c.hidden_size, c.num_hidden_layers,
                c.vocab_size, c.num_experts, c.num_experts_per_token, c.num_mla_layers(),
                c.num_kda_layers());
  return c;
}

}  // namespace

Result<ModelConfig> parse_model_config(const nlohmann::json& root, const std::string& source_name) {
  try {
    return parse_config_unguarded(root, source_name);
  } catch (const std::bad_alloc&) {
    return Status::out_of_memory(source_name + ": out of memory while reading the config");
  } catch (const std::exception& e) {  // a bug in the reader; never escape
    return Status::runtime(source_name + ": internal error while reading the config: " + e.what());
  }
}

namespace {

// A released config nests 4 deep; the checks dump a value they refuse, which recurses once per
// level, so a file of brackets would overflow the stack.
constexpr int kMaxConfigDepth = 64;

// `text` parsed as JSON (any value), or a usage error naming `source_name` and the problem: a
// NUL byte, nesting past kMaxConfigDepth, or the syntax error and where it is.
Result<json> parse_json_text(std::string_view text, const std::string& source_name) {
  if (const std::string nul = json_nul_problem(text); !nul.empty())
    return Status::usage(source_name + ": not valid JSON: it " + nul);
  bool too_deep = false;
  json root = parse_json_depth_bounded(text, kMaxConfigDepth, &too_deep);
  if (too_deep)
    return Status::usage(source_name + ": nested deeper than " + std::to_string(kMaxConfigDepth) +
                         " levels");
  if (root.is_discarded()) {
    const std::string why = json_syntax_error(text);
    return Status::usage(source_name + ": not valid JSON" + (why.empty() ? "" : ": " + why));
  }
  return root;
}

// D3: the stop ids are config.json's eos_token_id and generation_config.json's (an integer, a
// list of integers, or null), when that file is there. Its other keys (sampling defaults) are
// not read.
Status add_generation_config_stop_ids(const std::filesystem::path& file, ModelConfig& c) {
  const std::string name = file.string();
  KTIER_ASSIGN_OR_RETURN(const bool exists, io::path_exists(file));
  if (!exists) return Status::ok();
  KTIER_ASSIGN_OR_RETURN(const std::string text, io::read_regular_file(file, kConfigJsonLimit));
  KTIER_ASSIGN_OR_RETURN(const json root, parse_json_text(text, name));
  if (!root.is_object())
    return Status::usage(name + ": not a JSON object (its top level is " +
                         std::string(root.type_name()) + ")");
  const auto it = root.find("eos_token_id");
  if (it == root.end() || it->is_null()) return Status::ok();
  std::vector<int64_t> ids;
  const json* bad = nullptr;  // the first value that is not an id
  const auto take = [&](const json& v) {
    // An unsigned past int64's range would wrap to a negative id in get<int64_t>().
    constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > kMax)) {
      bad = &v;
      return false;
    }
    ids.push_back(v.get<int64_t>());
    return true;
  };
  const bool ok = it->is_array() ? std::all_of(it->begin(), it->end(), take) : take(*it);
  if (!ok)
    return Status::usage(name + ": eos_token_id: expected an integer or a list of integers, got " +
                         (bad->is_number_integer() ? "integer " + bad->dump() + ", out of range"
                                                   : std::string(bad->type_name())) +
                         (bad != &*it ? " in the list" : ""));
  for (const int64_t id : ids) {
    if (c.vocab_size >= 1 && (id < 0 || id >= c.vocab_size))
      return Status::usage(name + ": eos_token_id: id " + std::to_string(id) +
                           " is outside the vocabulary (0.." + std::to_string(c.vocab_size - 1) +
                           ")");
  }
  append_new_ids(c.eos_token_ids, ids);
  return Status::ok();
}

}  // namespace

Result<ModelConfig> load_model_config(const std::filesystem::path& config_json) {
  const std::string name = config_json.string();
  KTIER_ASSIGN_OR_RETURN(const bool exists, io::path_exists(config_json));
  if (!exists) return Status::usage(name + ": not found (a model directory needs a config.json)");
  KTIER_ASSIGN_OR_RETURN(const std::string text,
                         io::read_regular_file(config_json, kConfigJsonLimit));
  KTIER_ASSIGN_OR_RETURN(ModelConfig c, parse_model_config_text(text, name));
  KTIER_RETURN_IF_ERROR(
      add_generation_config_stop_ids(config_json.parent_path() / "generation_config.json", c));
  return c;
}

Result<ModelConfig> parse_model_config_text(std::string_view text, const std::string& source_name) {
  KTIER_ASSIGN_OR_RETURN(const json root, parse_json_text(text, source_name));
  return parse_model_config(root, source_name);
}

}  // namespace ktier::format

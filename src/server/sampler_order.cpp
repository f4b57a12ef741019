#include "server/sampler_order.h"

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/openai_api.h"

namespace ktier::server {
namespace {

using nlohmann::json;

// The samplers whose place changes ktier's answer, and the rest (named, but neutral).
enum Kind : int { kPenalties, kTopK, kTopP, kMinP, kTemperature, kKinds, kOther = kKinds };
constexpr std::array<const char*, kKinds> kKindNames = {"penalties", "top_k", "top_p", "min_p",
                                                        "temperature"};

// llama.cpp's names (common/sampling.cpp, with its other spellings) and one-letter codes.
std::optional<Kind> kind_of_name(std::string_view name) {
  if (name == "penalties") return kPenalties;
  if (name == "top_k") return kTopK;
  if (name == "top_p" || name == "nucleus") return kTopP;
  if (name == "min_p") return kMinP;
  if (name == "temperature" || name == "temp") return kTemperature;
  for (const char* other : {"dry", "typ_p", "typical_p", "typical", "xtc", "top_n_sigma",
                            "infill", "tfs_z", "tfs"})
    if (name == other) return kOther;
  return std::nullopt;
}

std::optional<Kind> kind_of_code(char code) {
  switch (code) {
    case 'e': return kPenalties;
    case 'k': return kTopK;
    case 'p': return kTopP;
    case 'm': return kMinP;
    case 't': return kTemperature;
    case 'd': case 'y': case 'x': case 's': case 'i': case 'f': return kOther;
    default: return std::nullopt;
  }
}

}  // namespace

Status apply_sampler_order(const json& samplers, runtime::SamplingParams& s) {
  if (samplers.is_null() || (samplers.is_array() && samplers.empty()) ||
      (samplers.is_string() && samplers.get_ref<const std::string&>().empty()))
    return Status::ok();  // nothing asked: ktier's order with every parameter as given
  // The order of the samplers given, as written.
  std::vector<std::string> names;
  std::vector<Kind> kinds;
  const auto add = [&](std::string name, std::optional<Kind> kind) -> Status {
    if (!kind)
      return field_error("samplers", "unknown sampler '" + name + "' (llama.cpp's: penalties, "
                                     "dry, top_k, typ_p, top_p, min_p, xtc, temperature, "
                                     "top_n_sigma; or their letters e d k y p m x t s)");
    names.push_back(std::move(name));
    kinds.push_back(*kind);
    return Status::ok();
  };
  if (samplers.is_string()) {
    const std::string& text = samplers.get_ref<const std::string&>();
    if (text.find(';') == std::string::npos) {
      for (const char c : text) KTIER_RETURN_IF_ERROR(add(std::string(1, c), kind_of_code(c)));
    } else {
      for (size_t at = 0; at <= text.size();) {
        const size_t end = std::min(text.find(';', at), text.size());
        std::string name = text.substr(at, end - at);
        if (!name.empty()) {
          const std::optional<Kind> kind = kind_of_name(name);
          KTIER_RETURN_IF_ERROR(add(std::move(name), kind));
        }
        at = end + 1;
      }
    }
  } else if (samplers.is_array()) {
    for (const json& item : samplers) {
      if (!item.is_string()) return field_error("samplers", "must hold sampler names (strings)");
      const std::string& name = item.get_ref<const std::string&>();
      KTIER_RETURN_IF_ERROR(add(name, kind_of_name(name)));
    }
  } else {
    return field_error("samplers", "must be a string or an array of sampler names");
  }
  std::array<int, kKinds> place;
  place.fill(-1);
  for (size_t i = 0; i < kinds.size(); ++i) {
    if (kinds[i] == kOther) continue;
    if (place[kinds[i]] >= 0)
      return field_error("samplers", std::string(kKindNames[kinds[i]]) + " is given twice");
    place[kinds[i]] = static_cast<int>(i);
  }
  // Left out: not applied, as in llama-server (whose chain holds only the samplers listed).
  if (place[kPenalties] < 0) s.repeat_penalty = 1, s.presence_penalty = 0, s.frequency_penalty = 0;
  if (place[kTopK] < 0) s.top_k = 0;
  if (place[kTopP] < 0) s.top_p = 1;
  if (place[kMinP] < 0) s.min_p = 0;
  if (place[kTemperature] < 0 && s.temperature > 0) s.temperature = 1;
  s.temperature_last = false;
  if (s.temperature == 0) return Status::ok();  // greedy: no sampler's place counts
  // Left out, the temperature is 1, where both orders are one.
  const std::array<bool, kKinds> on = {runtime::penalizes(s), s.top_k > 0, s.top_p < 1,
                                       s.min_p > 0, place[kTemperature] >= 0};
  // Each pair of samplers that are on, in the order ktier runs them (either place of the
  // temperature is decided below).
  const auto must_precede = [&](Kind a, Kind b) -> Status {
    if (!on[a] || !on[b] || place[a] < place[b]) return Status::ok();
    return field_error("samplers", "ktier runs " + std::string(kKindNames[a]) + " before " +
                                       kKindNames[b] + " (its order: penalties, top_k, top_p, "
                                       "min_p, with the temperature before or after both cuts)");
  };
  for (const Kind later : {kTopK, kTopP, kMinP, kTemperature})
    KTIER_RETURN_IF_ERROR(must_precede(kPenalties, later));
  KTIER_RETURN_IF_ERROR(must_precede(kTopK, kTopP));
  KTIER_RETURN_IF_ERROR(must_precede(kTopK, kMinP));
  KTIER_RETURN_IF_ERROR(must_precede(kTopP, kMinP));
  bool before_a_cut = false, after_a_cut = false;
  for (const Kind cut : {kTopP, kMinP}) {
    if (!on[cut] || !on[kTemperature]) continue;
    (place[kTemperature] < place[cut] ? before_a_cut : after_a_cut) = true;
  }
  if (before_a_cut && after_a_cut)
    return field_error("samplers", "the temperature between top_p and min_p is not built (ktier "
                                   "runs it before both cuts or after both)");
  s.temperature_last = after_a_cut;
  return Status::ok();
}

}  // namespace ktier::server

#include "server/sampler_order.h"

#include <array>
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

// The names llama-server takes in an array (llama.cpp's canonical ones: it drops others, such
// as "temp" or "nucleus", without a word, so they are refused here rather than run), and the
// old web UI's "typical_p" and "tfs_z" (its string "top_k;tfs_z;typical_p;top_p;min_p;
// temperature"). kInfill: named, but not built (and not neutral).
enum class Named { kKnown, kUnknown, kInfill };
Named kind_of_name(std::string_view name, Kind& kind) {
  kind = kOther;
  if (name == "penalties") kind = kPenalties;
  else if (name == "top_k") kind = kTopK;
  else if (name == "top_p") kind = kTopP;
  else if (name == "min_p") kind = kMinP;
  else if (name == "temperature") kind = kTemperature;
  else if (name == "infill") return Named::kInfill;
  else if (name != "dry" && name != "typ_p" && name != "typical_p" && name != "xtc" &&
           name != "top_n_sigma" && name != "tfs_z")
    return Named::kUnknown;
  return Named::kKnown;
}

// llama.cpp's one-letter codes (common_sampler_types_from_chars).
Named kind_of_code(char code, Kind& kind) {
  kind = kOther;
  switch (code) {
    case 'e': kind = kPenalties; break;
    case 'k': kind = kTopK; break;
    case 'p': kind = kTopP; break;
    case 'm': kind = kMinP; break;
    case 't': kind = kTemperature; break;
    case 'i': return Named::kInfill;
    case 'd': case 'y': case 'x': case 's': break;
    default: return Named::kUnknown;
  }
  return Named::kKnown;
}

}  // namespace

Status apply_sampler_order(const json& samplers, runtime::SamplingParams& s) {
  if (samplers.is_null()) return Status::ok();  // nothing asked: every parameter as given
  // The samplers given, in their order (an empty list: none, as llama-server's empty chain).
  std::vector<Kind> kinds;
  const auto add = [&](const std::string& name, Named named, Kind kind) -> Status {
    if (named == Named::kInfill)
      return field_error("samplers", "infill is not built in ktier serve");
    if (named == Named::kUnknown)
      return field_error("samplers", "unknown sampler '" + name + "' (llama.cpp's: penalties, "
                                     "dry, top_k, typ_p, top_p, min_p, xtc, temperature, "
                                     "top_n_sigma; or their letters e d k y p m x t s)");
    kinds.push_back(kind);
    return Status::ok();
  };
  Kind kind = kOther;
  if (samplers.is_string()) {
    // Letters, as llama-server reads a string; names joined by ';' (the old web UI's), which it
    // would read letter by letter into another chain, are taken as the names they are.
    const std::string& text = samplers.get_ref<const std::string&>();
    if (text.find(';') == std::string::npos) {
      for (const char c : text) {
        const Named named = kind_of_code(c, kind);
        KTIER_RETURN_IF_ERROR(add(std::string(1, c), named, kind));
      }
    } else {
      for (size_t at = 0; at <= text.size();) {
        const size_t end = std::min(text.find(';', at), text.size());
        const std::string name = text.substr(at, end - at);
        if (!name.empty()) {
          const Named named = kind_of_name(name, kind);
          KTIER_RETURN_IF_ERROR(add(name, named, kind));
        }
        at = end + 1;
      }
    }
  } else if (samplers.is_array()) {
    for (const json& item : samplers) {
      if (!item.is_string()) return field_error("samplers", "must hold sampler names (strings)");
      const std::string& name = item.get_ref<const std::string&>();
      const Named named = kind_of_name(name, kind);
      KTIER_RETURN_IF_ERROR(add(name, named, kind));
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
  // Left out: not applied, as in llama-server (whose chain holds only the samplers listed, and
  // draws at temperature 1 without one: greedy too).
  if (place[kPenalties] < 0) s.repeat_penalty = 1, s.presence_penalty = 0, s.frequency_penalty = 0;
  if (place[kTopK] < 0) s.top_k = 0;
  if (place[kTopP] < 0) s.top_p = 1;
  if (place[kMinP] < 0) s.min_p = 0;
  if (place[kTemperature] < 0) s.temperature = 1;
  s.temperature_last = false;
  // On: changes the answer where it stands. Greedy (temperature 0) takes the top token where
  // the temperature stands, and every cut keeps the top token, so there only the penalties'
  // place counts; a temperature of 1 is no step.
  const bool greedy = s.temperature == 0;
  const std::array<bool, kKinds> on = {runtime::penalizes(s), s.top_k > 0, s.top_p < 1,
                                       s.min_p > 0, greedy || s.temperature != 1};
  const auto must_precede = [&](Kind a, Kind b) -> Status {
    if (!on[a] || !on[b] || place[a] < place[b]) return Status::ok();
    return field_error("samplers", "ktier runs " + std::string(kKindNames[a]) + " before " +
                                       kKindNames[b] + " (its order: penalties, top_k, top_p, "
                                       "min_p, with the temperature before or after both cuts)");
  };
  for (const Kind later : {kTopK, kTopP, kMinP, kTemperature})
    KTIER_RETURN_IF_ERROR(must_precede(kPenalties, later));
  if (greedy) return Status::ok();
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

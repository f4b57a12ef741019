#include "server/openai_api.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "common/check.h"
#include "common/json_text.h"
#include "server/sampler_order.h"
#include "tokenizer/unicode.h"

namespace ktier::server {
namespace {

using nlohmann::json;

// OpenAI allows up to 4 stop texts.
constexpr size_t kMaxStops = 4;

// error_param() reads the field back from this prefix.
constexpr std::string_view kFieldPrefix = "request field \"";

// A number field: absent or null -> nullopt.
Result<std::optional<double>> number_field(const json& body, const char* name) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::optional<double>();
  if (!it->is_number()) return field_error(name, "must be a number");
  const double v = it->get<double>();
  if (!std::isfinite(v)) return field_error(name, "must be finite");
  return std::optional<double>(v);
}

// `value` (of the request field `name`) as a whole number in min..max: an integer, or a float
// with no fraction (2.0) up to 2^53. Compared exactly: 2^63 as an unsigned integer is past
// INT64_MAX, not cast to INT64_MIN.
Result<int64_t> integer_value(const json& value, const char* name, int64_t min, int64_t max) {
  const Status out_of_range =
      field_error(name, "must be in " + std::to_string(min) + ".." + std::to_string(max));
  int64_t v = 0;
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return out_of_range;
    v = static_cast<int64_t>(u);
  } else if (value.is_number_integer()) {
    v = value.get<int64_t>();
  } else if (value.is_number_float()) {
    const double d = value.get<double>();
    if (std::trunc(d) != d) return field_error(name, "must be a whole number");
    // The parser reads an integer past 64 bits as a double: out of range like any other.
    if (!(d >= static_cast<double>(min) && d <= static_cast<double>(max))) return out_of_range;
    // Past 2^53 a double is not the integer written (2^63 + 1 reads as 2^63): refused.
    if (!(d >= -0x1p53 && d <= 0x1p53))
      return field_error(name, "a whole number this large must be written as an integer");
    v = static_cast<int64_t>(d);
  } else {
    return field_error(name, "must be a whole number");
  }
  if (v < min || v > max) return out_of_range;
  return v;
}

// The field `name` as integer_value: absent or null -> nullopt.
Result<std::optional<int64_t>> integer_field(const json& body, const char* name, int64_t min,
                                             int64_t max) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::optional<int64_t>();
  KTIER_ASSIGN_OR_RETURN(const int64_t v, integer_value(*it, name, min, max));
  return std::optional<int64_t>(v);
}

// The chat prompt is K3's own render with thinking off and the generation prompt added (K3-MODEL
// §8.6): the fields of vLLM's, SGLang's and llama-server's that ask for another are refused,
// those that ask for that one pass (enable_thinking and continue_final_message false: with
// the flags above).
Status refuse_other_prompts(const json& body) {
  const auto given = [&](const char* name) {
    const auto it = body.find(name);
    return it != body.end() && !it->is_null() ? &*it : nullptr;
  };
  if (const json* t = given("chat_template"); t && *t != "")
    return field_error("chat_template", "K3's chat format is ktier's own; no template is read");
  if (const json* a = given("add_generation_prompt"); a && !(a->is_boolean() && a->get<bool>()))
    return field_error("add_generation_prompt", "the assistant's turn is always opened (true)");
  static constexpr const char* kThinkingOff = "thinking is off in ktier serve (K3's thinking "
                                              "effort is not built)";
  if (const json* r = given("reasoning_effort"); r && *r != "none")
    return field_error("reasoning_effort", std::string(kThinkingOff) + "; \"none\" only");
  if (const json* t = given("thinking");
      t && *t != false && !(t->is_object() && t->contains("type") && (*t)["type"] == "disabled"))
    return field_error("thinking",
                       std::string(kThinkingOff) + "; false or {\"type\": \"disabled\"} only");
  if (const json* k = given("chat_template_kwargs")) {
    if (!k->is_object()) return field_error("chat_template_kwargs", "must be an object");
    for (const auto& [key, value] : k->items()) {
      if ((key == "thinking" || key == "enable_thinking") &&
          (value.is_null() || value == false))
        continue;
      return field_error("chat_template_kwargs",
                         "\"" + key + "\" is not built (" + kThinkingOff +
                             "; only \"thinking\" or \"enable_thinking\" false pass)");
    }
  }
  return Status::ok();
}

// Fields whose effect is not built: refused unless absent, null or their neutral value.
Status refuse_unsupported(Endpoint endpoint, const json& body) {
  // Samplers of OpenAI's and llama-server's that are not built: their neutral value only.
  struct Neutral {
    const char* name;
    double value;
  };
  // And llama-server's fields of that kind: t_max_predict_ms, n_indent (none asked).
  for (const Neutral n :
       {Neutral{"repetition_penalty", 1}, {"typical_p", 1}, {"tfs_z", 1}, {"mirostat", 0},
        {"dry_multiplier", 0}, {"xtc_probability", 0}, {"dynatemp_range", 0},
        {"top_n_sigma", -1}, {"t_max_predict_ms", 0}, {"n_indent", 0}}) {
    KTIER_ASSIGN_OR_RETURN(const std::optional<double> v, number_field(body, n.name));
    if (v && *v != n.value)
      return field_error(n.name, std::string("not built in ktier serve (") +
                                     json(n.value).dump() + " only)" +
                                     (std::string_view(n.name) == "repetition_penalty"
                                          ? "; give repeat_penalty (llama-server's) instead"
                                          : ""));
  }
  // min_keep: ktier's cuts keep at least one token, never more.
  KTIER_ASSIGN_OR_RETURN(const std::optional<double> min_keep, number_field(body, "min_keep"));
  if (min_keep && *min_keep != 0 && *min_keep != 1)
    return field_error("min_keep", "not built in ktier serve (0 or 1)");
  for (const char* name :
       {"suffix", "tools", "functions", "tool_choice",
        "function_call", "best_of", "grammar", "json_schema", "n_predict",
        "return_tokens", "post_sampling_probs", "enable_thinking", "continue_final_message"}) {
    const auto it = body.find(name);
    if (it == body.end() || it->is_null() || (it->is_boolean() && !it->get<bool>()) ||
        (it->is_array() && it->empty()) || (it->is_object() && it->empty()))
      continue;
    if (std::string_view(name) == "best_of" && it->is_number_integer() && it->get<int64_t>() == 1)
      continue;
    // Strings that ask for nothing: no tool call, no grammar (llama.cpp's web UI sends
    // "grammar": "" with every request), nothing after the completion.
    const std::string_view field(name);
    if (it->is_string() &&
        (((field == "tool_choice" || field == "function_call") && *it == "none") ||
         ((field == "grammar" || field == "suffix") && it->get_ref<const std::string&>().empty())))
      continue;
    if (std::string_view(name) == "n_predict") {
      if (endpoint == Endpoint::kLlamaCompletion) continue;  // its own field
      return field_error(name, "give max_tokens (the OpenAI field) instead, or POST /completion");
    }
    return field_error(name, "not built in ktier serve");
  }
  KTIER_RETURN_IF_ERROR(refuse_other_prompts(body));
  if (const auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
    const auto type = it->is_object() ? it->find("type") : it->end();
    if (!it->is_object() || type == it->end() || *type != "text")
      return field_error("response_format", "only {\"type\": \"text\"} is built");
  }
  KTIER_ASSIGN_OR_RETURN(const std::optional<int64_t> n,
                         integer_field(body, "n", 1, std::numeric_limits<int32_t>::max()));
  if (n && *n != 1) return field_error("n", "one choice per request only (1)");
  return Status::ok();
}

// Log-probabilities as each endpoint asks: chat `logprobs` true with `top_logprobs` N,
// completions `logprobs` N, /completion `n_probs` N (0: none); the others' fields refused.
Result<std::optional<int64_t>> parse_logprobs(Endpoint endpoint, const json& body) {
  const auto given = [&](const char* name) {
    const auto it = body.find(name);
    return it != body.end() && !it->is_null() && !(it->is_boolean() && !it->get<bool>()) &&
           !(it->is_number() && it->get<double>() == 0);
  };
  const char* field = endpoint == Endpoint::kChatCompletions ? "top_logprobs"
                      : endpoint == Endpoint::kCompletions   ? "logprobs"
                                                             : "n_probs";
  for (const char* other : {"logprobs", "top_logprobs", "n_probs"})
    if (given(other) && std::string_view(other) != field &&
        !(endpoint == Endpoint::kChatCompletions && std::string_view(other) == "logprobs"))
      return field_error(other, std::string("not a field of ") + endpoint_name(endpoint) +
                                    ": give \"" + field + "\"");
  // Completions' logprobs is a number; false (as chat's) is none too.
  if (const auto it = body.find(field); it != body.end() && *it == false)
    return std::optional<int64_t>();
  KTIER_ASSIGN_OR_RETURN(const std::optional<int64_t> n,
                         integer_field(body, field, 0, kMaxTopLogprobs));
  if (endpoint == Endpoint::kLlamaCompletion)
    return n && *n > 0 ? n : std::optional<int64_t>();
  if (endpoint == Endpoint::kCompletions) return n;
  KTIER_ASSIGN_OR_RETURN(const bool logprobs, bool_field(body, "logprobs", false));
  if (n && *n > 0 && !logprobs) return field_error("top_logprobs", "needs \"logprobs\": true");
  return logprobs ? std::optional<int64_t>(n.value_or(0)) : std::optional<int64_t>();
}

Result<std::string> message_text(const json& content, const std::string& field) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return field_error(field, "must be a string or an array of parts");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string at = field + "[" + std::to_string(i) + "]";
    const auto type = part.is_object() ? part.find("type") : part.end();
    if (!part.is_object() || type == part.end() || *type != "text")
      return field_error(at, "only {\"type\": \"text\", \"text\": ...} parts are built");
    const auto t = part.find("text");
    if (t == part.end() || !t->is_string()) return field_error(at + ".text", "must be a string");
    if (i > 0) text += '\n';  // the parts' separator of vLLM's renderer
    text += t->get<std::string>();
  }
  return text;
}

Result<std::vector<tok::ChatMessage>> parse_messages(const json& body) {
  const auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty())
    return field_error("messages", "a non-empty array of messages is required");
  std::vector<tok::ChatMessage> messages;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return field_error(at, "must be an object");
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      return field_error(at + ".role", "must be a string");
    tok::ChatMessage message;
    if (*role == "user") {
      message.role = tok::ChatMessage::Role::kUser;
    } else if (*role == "assistant") {
      message.role = tok::ChatMessage::Role::kAssistant;
      if (const auto calls = m.find("tool_calls");
          calls != m.end() && !calls->is_null() && !calls->empty())
        return field_error(at + ".tool_calls", "tools are not built in ktier serve");
    } else if (*role == "system" || *role == "developer") {
      return field_error(at + ".role",
                         "system messages are not built: K3's format for them is in the "
                         "release's encoding_k3.py, which K3-MODEL.md does not reproduce");
    } else {
      return field_error(at + ".role", "must be \"user\" or \"assistant\"");
    }
    const auto content = m.find("content");
    if (content == m.end() || content->is_null())
      return field_error(at + ".content", "is required");
    KTIER_ASSIGN_OR_RETURN(message.text, message_text(*content, at + ".content"));
    messages.push_back(std::move(message));
  }
  if (messages.back().role != tok::ChatMessage::Role::kUser)
    return field_error("messages", "the last message must be the user's (the answer follows it)");
  return messages;
}

// A completion's prompt: text (a string, or an array of one string), token ids (an array of
// integers, or an array of one such array: a batch of one, as lm-eval-harness sends it, as
// OpenAI's and llama-server's; checked against the vocabulary by Service::prepare), or ids and
// texts mixed in one array (llama-server's).
Status parse_prompt(const json& body, CompletionRequest& r) {
  const auto found = body.find("prompt");
  const char* what = "must be a string, an array of one string, or an array of token ids (texts "
                     "may be mixed in)";
  if (found == body.end()) return field_error("prompt", what);
  const json* p = &*found;
  if (p->is_array() && p->size() == 1 && (*p)[0].is_array()) p = &(*p)[0];
  if (!(p->is_string() || p->is_array())) return field_error("prompt", what);
  if (p->is_string()) {
    r.prompt = p->get<std::string>();
    return Status::ok();
  }
  if (p->size() == 1 && (*p)[0].is_string()) {
    r.prompt = (*p)[0].get<std::string>();
    return Status::ok();
  }
  if (p->empty()) return field_error("prompt", "empty (no token to run)");
  // Texts only with ids (texts alone are a batch, split_prompt_batch's, or refused).
  const bool has_id =
      std::any_of(p->begin(), p->end(), [](const json& e) { return e.is_number(); });
  for (const json& e : *p) {
    if (has_id && e.is_string()) {
      r.prompt_pieces.emplace_back(e.get<std::string>());
      continue;
    }
    if (!e.is_number()) return field_error("prompt", what);
    KTIER_ASSIGN_OR_RETURN(const int64_t v,
                           integer_value(e, "prompt", 0, std::numeric_limits<int32_t>::max()));
    r.prompt_pieces.emplace_back(static_cast<int32_t>(v));
  }
  return Status::ok();
}

// logit_bias: OpenAI's object of token ids (as strings) to biases, or llama-server's array of
// [id, bias] pairs; a bias of false (llama-server's) is -Inf, never drawn. Biases are finite
// (OpenAI bounds them to [-100, 100]; llama-server does not); ids are checked against the
// vocabulary by Service::prepare. Token texts (llama-server's other form) are refused.
Result<std::vector<std::pair<int32_t, float>>> parse_logit_bias(const json& body) {
  std::vector<std::pair<int32_t, float>> out;
  const auto it = body.find("logit_bias");
  if (it == body.end() || it->is_null()) return out;
  const char* what = "must be an object of token ids to biases ({\"15043\": -100}) or an array "
                     "of [id, bias] pairs (a bias false: never drawn)";
  const auto add = [&](int64_t id, const json& bias) -> Status {
    if (bias.is_boolean() && !bias.get<bool>()) {
      out.emplace_back(static_cast<int32_t>(id), -std::numeric_limits<float>::infinity());
      return Status::ok();
    }
    if (!bias.is_number() || !std::isfinite(bias.get<double>()) ||
        std::abs(bias.get<double>()) > std::numeric_limits<float>::max())
      return field_error("logit_bias", std::string(what) + ": token " + std::to_string(id) +
                                           "'s bias is not a number within float range");
    out.emplace_back(static_cast<int32_t>(id), bias.get<float>());
    return Status::ok();
  };
  constexpr int64_t kMaxId = std::numeric_limits<int32_t>::max();
  if (it->is_object()) {
    for (const auto& [key, bias] : it->items()) {
      int64_t id = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id > kMaxId)
        return field_error("logit_bias", std::string(what) + ": \"" + key +
                                             "\" is not a token id");
      KTIER_RETURN_IF_ERROR(add(id, bias));
    }
    return out;
  }
  if (!it->is_array()) return field_error("logit_bias", what);
  for (const json& pair : *it) {
    if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number())
      return field_error("logit_bias", what);
    KTIER_ASSIGN_OR_RETURN(const int64_t id, integer_value(pair[0], "logit_bias", 0, kMaxId));
    KTIER_RETURN_IF_ERROR(add(id, pair[1]));
  }
  return out;
}

// At most kMaxStops texts (OpenAI's bound) unless `any_number` (llama-server's /completion).
Result<std::vector<std::string>> parse_stop(const json& body, bool any_number) {
  const auto it = body.find("stop");
  std::vector<std::string> stop;
  if (it == body.end() || it->is_null()) return stop;
  if (it->is_string()) {
    stop.push_back(it->get<std::string>());
  } else if (it->is_array() && (any_number || it->size() <= kMaxStops)) {
    for (const json& s : *it) {
      if (!s.is_string()) return field_error("stop", "must be a string or an array of strings");
      stop.push_back(s.get<std::string>());
    }
  } else {
    return field_error("stop", "must be a string or an array of at most 4 strings");
  }
  for (const std::string& s : stop)
    if (s.empty()) return field_error("stop", "an empty text would stop before any token");
  return stop;
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json head_json(Endpoint endpoint, const ResponseHead& head, bool chunk) {
  const char* object = endpoint == Endpoint::kCompletions ? "text_completion"
                       : chunk                            ? "chat.completion.chunk"
                                                          : "chat.completion";
  return {{"id", head.id}, {"object", object}, {"created", head.created}, {"model", head.model}};
}

}  // namespace

Result<json> parse_body_object(std::string_view body) {
  if (const std::string nul = json_nul_problem(body); !nul.empty())
    return Status::usage("the request body is not valid JSON: it " + nul);
  // A few hundred KB of brackets overflowed a connection thread's stack when a deep value was
  // copied (a batch's body per prompt): a body nested past kMaxJsonDepth is refused unbuilt.
  bool too_deep = false;
  const json j = parse_json_depth_bounded(body, kMaxJsonDepth, &too_deep);
  if (j.is_discarded()) {
    const std::string why = json_syntax_error(body);
    return Status::usage("the request body is not valid JSON" + (why.empty() ? "" : ": " + why));
  }
  if (too_deep)
    return Status::usage("the request body nests values deeper than " +
                         std::to_string(kMaxJsonDepth) + " levels");
  if (!j.is_object()) return Status::usage("the request body must be a JSON object");
  return j;
}

Result<bool> bool_field(const json& body, const char* name, bool fallback, const char* shown) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return field_error(shown ? shown : name, "must be true or false");
  return it->get<bool>();
}

Result<std::vector<json>> split_prompt_batch(const json& j, size_t max_copied_bytes) {
  KTIER_CHECK(j.is_object());
  std::vector<json> bodies;
  const auto prompt = j.find("prompt");
  if (prompt == j.end() || !prompt->is_array() || prompt->size() < 2) return bodies;
  // Each a string or an array of ids, texts mixed in or not (an array of numbers, or of numbers
  // and strings, is one prompt; anything else is refused as one, by parse_request).
  for (const json& p : *prompt)
    if (!p.is_string() &&
        !(p.is_array() && std::all_of(p.begin(), p.end(), [](const json& e) {
          return e.is_number() || e.is_string();
        })))
      return bodies;
  KTIER_ASSIGN_OR_RETURN(const bool stream, bool_field(j, "stream", false));
  if (stream)
    return field_error("prompt", "a batch of prompts is answered whole only (not streamed)");
  json rest = j;  // the fields the prompts share, copied once (not the batch with each prompt)
  rest.erase("prompt");
  // Each prompt's body holds its own copy of them: a small body of many prompts and a large
  // ignored field would otherwise take their product in memory before anything is checked.
  const size_t shared_bytes = rest.dump().size();
  if (shared_bytes > max_copied_bytes / prompt->size())
    return field_error("prompt", "a batch of " + std::to_string(prompt->size()) +
                                     " prompts would copy the request's other fields (" +
                                     std::to_string(shared_bytes) + " bytes) once each, past " +
                                     std::to_string(max_copied_bytes) +
                                     " bytes: send fewer prompts or smaller fields");
  for (const json& p : *prompt) {
    json& one = bodies.emplace_back(rest);
    one["prompt"] = p;
  }
  return bodies;
}

nlohmann::json batch_response(std::vector<nlohmann::json> answers) {
  KTIER_CHECK(!answers.empty());
  json choices = json::array();
  Usage usage;
  for (json& a : answers) {
    json choice = std::move(a["choices"][0]);
    choice["index"] = choices.size();
    for (const char* per_prompt : {"timings", "ktier"}) {
      if (!a.contains(per_prompt)) continue;
      choice[per_prompt] = std::move(a[per_prompt]);
      a.erase(per_prompt);  // the top level (the last answer's) keeps no one prompt's figures
    }
    choices.push_back(std::move(choice));
    const json& u = a["usage"];
    usage.prompt_tokens += u["prompt_tokens"].get<int64_t>();
    usage.completion_tokens += u["completion_tokens"].get<int64_t>();
    usage.cached_tokens += u["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  }
  json out = std::move(answers.back());
  out["choices"] = std::move(choices);
  out["usage"] = usage_json(usage);
  return out;
}

Result<CompletionRequest> parse_request(Endpoint endpoint, const json& j,
                                        const RequestDefaults& defaults) {
  KTIER_CHECK(j.is_object());
  KTIER_RETURN_IF_ERROR(refuse_unsupported(endpoint, j));
  CompletionRequest r;
  r.endpoint = endpoint;
  if (endpoint == Endpoint::kChatCompletions) {
    KTIER_ASSIGN_OR_RETURN(r.messages, parse_messages(j));
  } else {
    KTIER_RETURN_IF_ERROR(parse_prompt(j, r));
  }
  KTIER_ASSIGN_OR_RETURN(r.echo, bool_field(j, "echo", false));
  if (r.echo && endpoint != Endpoint::kCompletions)
    return field_error("echo", std::string("not a field of ") + endpoint_name(endpoint) +
                                   " (POST /v1/completions takes it)");
  // max_completion_tokens (OpenAI's newer name) wins where both are given, as in llama-server
  // (clients send both); each is checked. llama-server's n_predict wins where it is given. 0
  // with echo: the prompt's logprobs only (lm-eval-harness). -1 (or -2): until a stop id or
  // the context's end, as llama-server reads max_tokens (its n_predict).
  const auto generation_limit = [&](const char* name) -> Result<std::optional<int64_t>> {
    KTIER_ASSIGN_OR_RETURN(const std::optional<int64_t> v,
                           integer_field(j, name, -2, std::numeric_limits<int32_t>::max()));
    if (v && *v == 0 && !r.echo)
      return field_error(name, "must be -1, -2 (until the context's end) or in 1..2147483647 "
                               "(0 only with echo: the prompt's logprobs)");
    return v;
  };
  KTIER_ASSIGN_OR_RETURN(const std::optional<int64_t> max_tokens, generation_limit("max_tokens"));
  KTIER_ASSIGN_OR_RETURN(const std::optional<int64_t> max_completion_tokens,
                         generation_limit("max_completion_tokens"));
  const std::optional<int64_t> limit = max_completion_tokens ? max_completion_tokens : max_tokens;
  r.to_context_end = limit && *limit < 0;
  r.max_tokens = r.to_context_end ? std::nullopt : limit;
  if (endpoint == Endpoint::kLlamaCompletion) {
    // 0: the prompt runs (its state kept for the next request), nothing is generated.
    KTIER_ASSIGN_OR_RETURN(const std::optional<int64_t> n_predict,
                           integer_field(j, "n_predict", -2, std::numeric_limits<int32_t>::max()));
    if (n_predict) {  // wins over max_tokens (and its -1) where given
      r.to_context_end = *n_predict < 0;
      r.max_tokens = r.to_context_end ? std::nullopt : n_predict;
    }
  }
  r.sampling = defaults.sampling;
  for (const OpenAiBound& b : kOpenAiBounds) {
    KTIER_ASSIGN_OR_RETURN(const std::optional<double> v, number_field(j, b.field));
    if (v && !(*v >= b.min && *v <= b.max))
      return field_error(b.field,
                         "must be in " + std::to_string(b.min) + ".." + std::to_string(b.max));
    if (v) r.sampling.*b.value = *v;
  }
  KTIER_ASSIGN_OR_RETURN(const std::optional<double> top_p, number_field(j, "top_p"));
  // 0 keeps the most likely token only, as OpenAI's range and llama.cpp's sampler have it.
  if (top_p && !(*top_p >= 0 && *top_p <= 1)) return field_error("top_p", "must be in [0, 1]");
  if (top_p) r.sampling.top_p = *top_p;
  KTIER_ASSIGN_OR_RETURN(const std::optional<double> min_p, number_field(j, "min_p"));
  if (min_p && !(*min_p >= 0 && *min_p <= 1)) return field_error("min_p", "must be in [0, 1]");
  if (min_p) r.sampling.min_p = *min_p;
  // llama-server's penalties (OpenAI's two are in kOpenAiBounds).
  KTIER_ASSIGN_OR_RETURN(const std::optional<double> repeat_penalty,
                         number_field(j, "repeat_penalty"));
  if (repeat_penalty && !(*repeat_penalty > 0))
    return field_error("repeat_penalty", "must be a number > 0 (1 = off)");
  if (repeat_penalty) r.sampling.repeat_penalty = *repeat_penalty;
  KTIER_ASSIGN_OR_RETURN(const std::optional<int64_t> repeat_last_n,
                         integer_field(j, "repeat_last_n", -1,
                                       std::numeric_limits<int32_t>::max()));
  if (repeat_last_n) r.sampling.repeat_last_n = *repeat_last_n;
  // A negative top_k is off, as 0: vLLM's default is -1 and llama-server reads <= 0 as off, so
  // clients written for either send it.
  KTIER_ASSIGN_OR_RETURN(const std::optional<int64_t> top_k,
                         integer_field(j, "top_k", std::numeric_limits<int32_t>::min(),
                                       std::numeric_limits<int32_t>::max()));
  if (top_k) r.sampling.top_k = std::max<int64_t>(*top_k, 0);
  // llama-server's sampler order (its web UI sends one with every request).
  if (const auto it = j.find("samplers"); it != j.end())
    KTIER_RETURN_IF_ERROR(apply_sampler_order(*it, r.sampling));
  // OpenAI's seed is a signed 64-bit integer; its bits seed the generator as --seed does.
  KTIER_ASSIGN_OR_RETURN(const std::optional<int64_t> seed,
                         integer_field(j, "seed", std::numeric_limits<int64_t>::min(),
                                       std::numeric_limits<int64_t>::max()));
  if (seed) r.sampling.seed = static_cast<uint64_t>(*seed);  // -1: kRandomSeed, random
  r.sampling.seed = runtime::resolve_seed(r.sampling.seed);
  KTIER_ASSIGN_OR_RETURN(r.sampling.logit_bias, parse_logit_bias(j));
  KTIER_ASSIGN_OR_RETURN(r.ignore_eos, bool_field(j, "ignore_eos", false));
  KTIER_ASSIGN_OR_RETURN(r.stop, parse_stop(j, endpoint == Endpoint::kLlamaCompletion));
  KTIER_ASSIGN_OR_RETURN(r.logprobs, parse_logprobs(endpoint, j));
  KTIER_ASSIGN_OR_RETURN(r.stream, bool_field(j, "stream", false));
  if (const auto so = j.find("stream_options"); so != j.end() && !so->is_null()) {
    if (!so->is_object()) return field_error("stream_options", "must be an object");
    if (!r.stream)  // as OpenAI: options of a stream on an answer sent whole
      return field_error("stream_options", "only allowed when stream is true");
    KTIER_ASSIGN_OR_RETURN(r.include_usage, bool_field(*so, "include_usage", false,
                                                       "stream_options.include_usage"));
  }
  if (const auto m = j.find("model"); m != j.end() && !m->is_null() && !m->is_string())
    return field_error("model", "must be a string");
  return r;
}

const char* endpoint_name(Endpoint endpoint) {
  switch (endpoint) {
    case Endpoint::kCompletions:
      return "/v1/completions";
    case Endpoint::kChatCompletions:
      return "/v1/chat/completions";
    case Endpoint::kLlamaCompletion:
      return "/completion";
  }
  return "?";
}

const char* finish_reason_name(FinishReason r) {
  return r == FinishReason::kStop ? "stop" : "length";
}

nlohmann::json completion_response(Endpoint endpoint, const ResponseHead& head,
                                   const std::string& text, FinishReason finish,
                                   const Usage& usage, const nlohmann::json& extra,
                                   const nlohmann::json& logprobs) {
  json j = head_json(endpoint, head, false);
  json choice = {{"index", 0}, {"finish_reason", finish_reason_name(finish)}};
  if (endpoint == Endpoint::kCompletions)
    choice["text"] = text;
  else
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  choice["logprobs"] = logprobs;
  j["choices"] = json::array({choice});
  j["usage"] = usage_json(usage);
  for (const auto& [key, value] : extra.items()) j[key] = value;
  return j;
}

nlohmann::json stream_chunk(Endpoint endpoint, const ResponseHead& head, const std::string& text,
                            std::optional<FinishReason> finish, const nlohmann::json& logprobs) {
  json j = head_json(endpoint, head, true);
  json choice = {{"index", 0},
                 {"finish_reason", finish ? json(finish_reason_name(*finish)) : json(nullptr)}};
  if (endpoint == Endpoint::kCompletions)
    choice["text"] = text;
  else
    choice["delta"] = finish ? json::object() : json{{"content", text}};
  choice["logprobs"] = logprobs;
  j["choices"] = json::array({choice});
  return j;
}

nlohmann::json stream_role_chunk(const ResponseHead& head) {
  json j = head_json(Endpoint::kChatCompletions, head, true);
  j["choices"] = json::array({{{"index", 0},
                               {"delta", {{"role", "assistant"}, {"content", ""}}},
                               {"logprobs", nullptr},
                               {"finish_reason", nullptr}}});
  return j;
}

nlohmann::json stream_usage_chunk(Endpoint endpoint, const ResponseHead& head, const Usage& usage,
                                  const nlohmann::json& extra) {
  json j = head_json(endpoint, head, true);
  j["choices"] = json::array();
  j["usage"] = usage_json(usage);
  for (const auto& [key, value] : extra.items()) j[key] = value;
  return j;
}

nlohmann::json logprobs_json(Endpoint endpoint, std::span<const AnswerToken> tokens) {
  // JSON has no -Inf: vLLM's stand-in for an impossible token.
  const auto number = [](double logprob) { return std::fmax(logprob, -9999.0); };
  const auto logprob = [&](const TokenLogprob& t, bool scored) {
    return scored ? json(number(t.logprob)) : json(nullptr);
  };
  const auto bytes = [](const std::string& b) {
    json out = json::array();
    for (const char c : b) out.push_back(static_cast<unsigned char>(c));
    return out;
  };
  const auto entry = [&](const TokenLogprob& t, bool scored) {
    json e = {{"token", valid_utf8(t.bytes)},
              {"logprob", logprob(t, scored)},
              {"bytes", bytes(t.bytes)}};
    if (endpoint == Endpoint::kLlamaCompletion) e["id"] = t.id;
    return e;
  };
  if (endpoint == Endpoint::kCompletions) {
    // OpenAI's legacy form: top_logprobs maps text to logprob, the sampled token always in it.
    json out = {{"tokens", json::array()}, {"token_logprobs", json::array()},
                {"top_logprobs", json::array()}, {"text_offset", json::array()}};
    for (const AnswerToken& a : tokens) {
      out["tokens"].push_back(valid_utf8(a.token.bytes));
      out["token_logprobs"].push_back(logprob(a.token, a.scored));
      // The sampled token first: an alternative whose text is the same does not replace it.
      json top = {{valid_utf8(a.token.bytes), number(a.token.logprob)}};
      for (const TokenLogprob& t : a.top) top.emplace(valid_utf8(t.bytes), number(t.logprob));
      out["top_logprobs"].push_back(a.scored ? std::move(top) : json(nullptr));
      out["text_offset"].push_back(a.text_offset);
    }
    return out;
  }
  json content = json::array();
  for (const AnswerToken& a : tokens) {
    json e = entry(a.token, a.scored);
    e["top_logprobs"] = a.scored ? json::array() : json(nullptr);
    for (const TokenLogprob& t : a.top) e["top_logprobs"].push_back(entry(t, true));
    content.push_back(std::move(e));
  }
  if (endpoint == Endpoint::kLlamaCompletion) return content;
  return {{"content", std::move(content)}};
}

Status check_openai_bounds(const runtime::SamplingParams& p) {
  for (const OpenAiBound& b : kOpenAiBounds)
    if (!(p.*b.value >= b.min && p.*b.value <= b.max))
      return Status::usage(std::string(b.flag) + " must be in " + std::to_string(b.min) + ".." +
                           std::to_string(b.max) + " (OpenAI's range)");
  return Status::ok();
}

Status field_error(const std::string& field, const std::string& what) {
  return Status::usage(std::string(kFieldPrefix) + field + "\": " + what);
}

std::optional<std::string> error_param(const Status& s) {
  const std::string& m = s.message();
  if (s.code() != ExitCode::kUsage || m.rfind(kFieldPrefix, 0) != 0) return std::nullopt;
  const size_t end = m.find('"', kFieldPrefix.size());
  if (end == std::string::npos) return std::nullopt;
  return m.substr(kFieldPrefix.size(), end - kFieldPrefix.size());
}

nlohmann::json error_body(const std::string& message, const std::string& type,
                          const std::optional<std::string>& code,
                          const std::optional<std::string>& param) {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param ? json(*param) : json(nullptr)},
            {"code", code ? json(*code) : json(nullptr)}}}};
}

std::string valid_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  for (size_t i = 0; i < bytes.size();) {
    const tok::DecodedCp d = tok::decode_utf8(p + i, bytes.size() - i);
    if (d.cp == tok::kInvalidCp) {
      out += "\xEF\xBF\xBD";
      i += tok::utf8_maximal_subpart(p + i, bytes.size() - i);
    } else {
      out.append(bytes.substr(i, d.len));
      i += d.len;
    }
  }
  return out;
}

std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_event(const nlohmann::json& j) {
  return "data: " + dump(j) + "\n\n";
}

}  // namespace ktier::server

#include "cli/strata_options.h"

#include "format/config.h"
#include "strata/replay.h"
#include "strata/trace_format.h"

namespace ktier::cli {

void add_strata_options(CLI::App* sub, StrataArgs& a) {
  sub->add_option("--policy", a.policy,
                  "Expert RAM tier placement with --pack/--ram/--preset or in GPU mode: "
                  "temperature, lru, lfu or static "
                  "(static needs --profile); never changes the output")
      ->capture_default_str();
  sub->add_option("--lookahead", a.lookahead,
                  "Router lookahead depth: predict and prefetch the experts of the next D layers "
                  "(with --pack/--ram/--preset or in GPU mode: a memory-mapped checkpoint reads "
                  "nothing ahead, and only run --trace records the predictions); 0 = off. "
                  "Default: 1, or 0 (with a warning) where the budget of --ram/--preset "
                  "(or --vram) holds the rest but not lookahead's routers and slots; a depth "
                  "given is kept (at most the layers after the first; none with --policy "
                  "static, which never prefetches: said in a warning), or refused below its "
                  "minimum");
  sub->add_flag("--no-lookahead-refresh", a.no_refresh,
               "Do not predict layer L+1's experts again after layer L's FFN (the refresh: on by "
               "default with --lookahead >= 1; it sees layer L's routed experts, which the "
               "predictions made after layer L's attention cannot)");
  sub->add_option("--profile", a.profile,
                  "A trace recorded earlier (run --trace) seeding the policy's temperatures "
                  "(and the ranking of --policy static)");
}

Status apply_strata_options(const StrataArgs& a, runtime::EngineOptions& eo) {
  Result<strata::PolicyKind> policy = strata::parse_policy(a.policy);
  if (!policy.is_ok() && a.policy != "belady" && a.policy != "all")
    return Status::usage("--policy: unknown policy '" + a.policy +
                         "' (choose from temperature, lru, lfu or static)");
  if (!policy.is_ok() || *policy == strata::PolicyKind::kBelady)
    return Status::usage("--policy " + a.policy + " is for `ktier trace replay` only (it needs " +
                         "the future); a run takes temperature, lru, lfu or static");
  eo.policy = *policy;
  eo.lookahead = a.lookahead;
  eo.lookahead_refresh = !a.no_refresh;
  if (a.profile.empty()) return Status::ok();
  // The profile must describe this model's experts: its keys index the policy's.
  KTIER_ASSIGN_OR_RETURN(const format::ModelConfig cfg,
                         format::load_model_config(eo.model_dir / "config.json"));
  strata::TraceHeader model;
  model.num_layers = static_cast<uint32_t>(cfg.num_hidden_layers);
  model.experts_per_layer = static_cast<uint32_t>(cfg.num_experts);
  model.first_moe_layer = static_cast<uint32_t>(cfg.first_k_dense_replace);
  KTIER_ASSIGN_OR_RETURN(strata::ReplayInputs seeds,
                         strata::ReplayInputs::from_profile(a.profile, model,
                                                            strata::kDefaultHalfLifeTokens,
                                                            "--profile"));
  eo.temperature_seed = std::move(seeds.temperature_seed);
  eo.static_ranking = std::move(seeds.static_ranking);
  if (eo.policy == strata::PolicyKind::kStatic && eo.static_ranking.empty())
    return Status::usage("--profile " + a.profile +
                         ": the trace holds no routed requests, nothing to rank for --policy "
                         "static");
  return Status::ok();
}

}  // namespace ktier::cli

#pragma once
// llama-server's `samplers` field (the sampler chain's order; llama.cpp's web UI sends it with
// every request, "edkypmxt" by default) mapped onto the two orders ktier's sampler has
// (runtime/sampler.h): the Hugging Face order, and llama.cpp's, temperature last.
//
// As in llama-server, a sampler the list leaves out is not applied: its parameter is made
// neutral (penalties off, top_k 0, top_p 1, min_p 0, temperature 1 — greedy too: llama-server
// then draws at temperature 1; an empty list leaves out all). Of those left, the ones that
// change the answer must come in an order ktier runs: penalties first, top_k before top_p and
// min_p, top_p before min_p, and the temperature before both cuts
// (SamplingParams::temperature_last false) or after both (true); greedy (temperature 0) needs
// only the penalties first. Samplers ktier lacks (DRY, typical-p, XTC, top-n-sigma, tail-free)
// may be named: their own fields are refused unless neutral (openai_api.cpp), so their place
// changes nothing; infill, which has no field, is refused.

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "runtime/sampler.h"

namespace ktier::server {

// `samplers`: a string of llama.cpp's one-letter codes ("edkypmxt"), a string of names joined
// by ';' (the old web UI's "top_k;tfs_z;typical_p;top_p;min_p;temperature"), or an array of
// llama.cpp's canonical names (others, such as "temp", llama-server drops silently: refused
// here). null: nothing asked. Called once `sampling` holds the request's parameters. Errors:
// Status::usage naming the field (an unknown sampler, infill, a name given twice, or an order
// ktier cannot run, saying which it can).
Status apply_sampler_order(const nlohmann::json& samplers, runtime::SamplingParams& sampling);

}  // namespace ktier::server

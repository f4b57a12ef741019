#pragma once
// llama-server's `samplers` field (the sampler chain's order; llama.cpp's web UI sends it with
// every request, "edkypmxt" by default) mapped onto the two orders ktier's sampler has
// (runtime/sampler.h): the Hugging Face order, and llama.cpp's, temperature last.
//
// As in llama-server, a sampler the list leaves out is not applied: its parameter is made
// neutral (penalties off, top_k 0, top_p 1, min_p 0, temperature 1 where it was above 0).
// Of those left, the ones that change the answer must come in an order ktier runs: penalties
// first, top_k before top_p and min_p, top_p before min_p, and the temperature before both cuts
// (SamplingParams::temperature_last false) or after both (true). Samplers ktier lacks (DRY,
// typical-p, XTC, top-n-sigma, tail-free, infill) may be named: their own fields are refused
// unless neutral (openai_api.cpp), so their place changes nothing.

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "runtime/sampler.h"

namespace ktier::server {

// `samplers`: a string of llama.cpp's one-letter codes ("edkypmxt"), a string of names joined
// by ';' ("top_k;top_p;temperature"), or an array of names. Called once `sampling` holds the
// request's parameters. Errors: Status::usage naming the field (an unknown sampler, a name
// given twice, or an order ktier cannot run, saying which it can).
Status apply_sampler_order(const nlohmann::json& samplers, runtime::SamplingParams& sampling);

}  // namespace ktier::server

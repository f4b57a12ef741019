#pragma once
// config.json and generation_config.json of a synthetic checkpoint, in the released nested shape
// (K3-MODEL.md §2.2): a root wrapper (model_type "kimi_k3", architectures, bos/eos/pad ids,
// dtype, tie_word_embeddings) around `text_config` (model_type "kimi_linear", every field of
// §2.3 and every guard field of §2.4 with its K3 value), `text_config.linear_attn_config` (the
// KDA fields, 1-based full_attn_layers and kda_layers) and, when experts are MXFP4,
// `text_config.quantization_config` (compressed-tensors, one group: num_bits 4, type float,
// strategy group, group_size 32, symmetric true, format mxfp4-pack-quantized, the release's
// ignore list). Like the raw release, text_config has no head_dim and no rope_theta.
// vision_config and the media placeholder fields are left out: a synthetic checkpoint has no
// vision tower. Both files are written with sorted keys and 2-space indent, as transformers'
// save_pretrained does.

#include <string>

#include "synth/shape.h"
#include "synth/tokenizer_gen.h"

namespace ktier::synth {

std::string config_json(const SynthShape& shape, ExpertFormat format, const SynthVocab& vocab);
std::string generation_config_json(const SynthVocab& vocab);

}  // namespace ktier::synth

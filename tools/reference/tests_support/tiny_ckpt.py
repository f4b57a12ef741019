"""Test-only writer of tiny K3-shaped checkpoints in the released layout.

Written independently of the C++ ``ktier synth`` (which makes the goldens' checkpoints), for
k3ref's own tests: nested config.json, one shard per decoder layer (shard k holds layer k-1)
plus a final model-level shard, names with the released six-digit total,
``model.safetensors.index.json``, released tensor names (§4-5), MXFP4 or plain-float routed
experts. It also exercises the accepted variants of §5.10 (F16/F32/BF16 mixes, [E] res_proj,
[C,K] conv weights, zero-padded A_log).
"""

from __future__ import annotations

import json
import os
import struct
from typing import Dict, Optional, Tuple

import numpy as np

from k3ref.mxfp4 import dequant_mxfp4, quantize_codes_to_packed

Tensor = Tuple[str, np.ndarray]  # (safetensors dtype, array holding the stored values/bits)

# The conformance tiny shape (conformance README §3), flat spelling.
TINY_FLAT = {
    "hidden_size": 128, "num_hidden_layers": 13, "vocab_size": 256, "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False, "kda_num_heads": 4, "kda_head_dim": 16,
    "short_conv_kernel_size": 4, "gate_lower_bound": -5.0, "num_attention_heads": 4,
    "q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 24, "qk_rope_head_dim": 8,
    "v_head_dim": 16, "mla_use_output_gate": True, "num_experts": 8, "num_experts_per_token": 2,
    "num_shared_experts": 2, "routed_expert_hidden_size": 64, "moe_intermediate_size": 48,
    "routed_scaling_factor": 1.0, "moe_renormalize": True, "latent_moe_use_norm": True,
    "first_k_dense_replace": 1, "intermediate_size": 96, "attn_res_block_size": 3,
    "situ_beta": 4.0, "situ_linear_beta": 25.0, "full_attn_layers": [4, 8, 12, 13],
}

# MXFP4 needs every expert input width to be a multiple of 32 (§7.1); the conformance shape's
# I = 48 makes w2 ([latent, I]) unpackable, so MXFP4 test checkpoints use I = 64 instead.
# This is the only deviation from the conformance shape.
TINY_FLAT_MXFP4 = dict(TINY_FLAT, moe_intermediate_size=64)

QUANT_CONFIG = {
    "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {"group_0": {
        "targets": ["Linear"], "input_activations": None,
        "weights": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32,
                    "symmetric": True, "dynamic": False, "scale_dtype": "torch.uint8"}}},
    "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
               "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"],
}

_KDA_KEYS = {"kda_num_heads": "num_heads", "kda_head_dim": "head_dim",
             "short_conv_kernel_size": "short_conv_kernel_size",
             "gate_lower_bound": "gate_lower_bound", "full_attn_layers": "full_attn_layers"}


def nested_config(flat: dict, with_quant: bool = True) -> dict:
    """Flat test config -> the released nested shape (root wrapper, text_config,
    linear_attn_config, quantization_config inside text_config)."""
    L = flat["num_hidden_layers"]
    tc = {"model_type": "kimi_linear", "hidden_act": "situ", "mla_use_nope": True,
          "moe_router_activation_func": "sigmoid", "num_expert_group": 1, "topk_group": 1,
          "moe_layer_freq": 1, "num_nextn_predict_layers": 0, "tie_word_embeddings": False,
          # transformers-style bogus head_dim: must NOT be read as the KDA head dim (D6).
          "head_dim": flat["hidden_size"] // flat["num_attention_heads"]}
    lac = {"use_full_rank_gate": True}
    for k, v in flat.items():
        if k in _KDA_KEYS:
            lac[_KDA_KEYS[k]] = v
        elif k == "situ_beta":
            tc["activation_situ_beta"] = v
        elif k == "situ_linear_beta":
            tc["activation_situ_linear_beta"] = v
        elif k == "tie_word_embeddings":
            continue
        else:
            tc[k] = v
    lac["kda_layers"] = [i for i in range(1, L + 1) if i not in flat["full_attn_layers"]]
    tc["linear_attn_config"] = lac
    if with_quant:
        tc["quantization_config"] = QUANT_CONFIG
    V = flat["vocab_size"]
    return {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
            "tie_word_embeddings": False, "dtype": "bfloat16",
            # tiny vocab: put the "special" ids at the top of the table, like K3 does.
            "bos_token_id": V - 4, "eos_token_id": V - 3, "pad_token_id": V - 1,
            "text_config": tc, "vision_config": {}}


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float -> BF16 bit patterns, round to nearest even (finite inputs only)."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return b.astype(np.uint16)


def write_safetensors(path: str, tensors: Dict[str, Tensor], metadata: Optional[dict] = None) -> None:
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dtype, arr) in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)  # released headers are space-padded to a multiple of 8
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for raw in blobs:
            f.write(raw)


def _f32(a) -> Tensor:
    return ("F32", np.asarray(a, dtype="<f4"))


def _bf16(a) -> Tensor:
    return ("BF16", to_bf16_bits(a))


def _f16(a) -> Tensor:
    return ("F16", np.asarray(a, dtype="<f2"))


def make_tiny_tensors(flat: dict, seed: int = 0, experts: str = "mxfp4") -> Dict[str, Tensor]:
    """Random weights for the given (flat) config, released names. experts: 'mxfp4' or
    'float' (plain F32 holding exactly the dequantised MXFP4 values of the same seed)."""
    rng = np.random.default_rng(seed)
    c = flat
    E, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    H, D, K = c["kda_num_heads"], c["kda_head_dim"], c["short_conv_kernel_size"]
    C = H * D
    Hm, dn, dr, dv = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    qlr, kvlr = c["q_lora_rank"], c["kv_lora_rank"]
    Ne, lat, I = c["num_experts"], c["routed_expert_hidden_size"], c["moe_intermediate_size"]
    mla_layers = {x - 1 for x in c["full_attn_layers"]}

    def mat(o, i, gain=1.0):
        return rng.standard_normal((o, i)) * (gain / np.sqrt(i))

    def gain(n):
        return 1.0 + 0.1 * rng.standard_normal(n)

    t: Dict[str, Tensor] = {}
    M = "language_model.model."
    for l in range(L):
        p = f"{M}layers.{l}."
        # Variants of §5.10 spread over layers: F16 gains on layer 2, [E]-shaped res_proj on
        # layer 1, [C,K] conv weights on layer 2.
        gfmt = _f16 if l == 2 else _bf16
        t[p + "input_layernorm.weight"] = gfmt(gain(E))
        t[p + "post_attention_layernorm.weight"] = gfmt(gain(E))
        for r in ("self_attention_res", "mlp_res"):
            t[p + f"{r}_norm.weight"] = _bf16(gain(E))
            proj = 0.1 * rng.standard_normal(E)
            t[p + f"{r}_proj.weight"] = _bf16(proj if l == 1 else proj.reshape(1, E))
        a = p + "self_attn."
        if l in mla_layers:
            t[a + "q_a_proj.weight"] = _bf16(mat(qlr, E))
            t[a + "q_a_layernorm.weight"] = _bf16(gain(qlr))
            t[a + "q_b_proj.weight"] = _bf16(mat(Hm * (dn + dr), qlr))
            t[a + "kv_a_proj_with_mqa.weight"] = _bf16(mat(kvlr + dr, E))
            t[a + "kv_a_layernorm.weight"] = _bf16(gain(kvlr))
            t[a + "kv_b_proj.weight"] = _bf16(mat(Hm * (dn + dv), kvlr))
            t[a + "g_proj.weight"] = _bf16(mat(Hm * dv, E))
            t[a + "o_proj.weight"] = _bf16(mat(E, Hm * dv))
        else:
            for n in ("q", "k", "v", "g"):
                t[a + f"{n}_proj.weight"] = _bf16(mat(C, E))
            for n in ("q", "k", "v"):
                w = 0.5 * rng.standard_normal((C, 1, K))
                t[a + f"{n}_conv1d.weight"] = _f32(w.reshape(C, K) if l == 2 else w)
            t[a + "f_a_proj.weight"] = _bf16(mat(D, E))
            t[a + "f_b_proj.weight"] = _bf16(mat(C, D))
            A = np.zeros(max(D, H))  # like the release: padded to D with an exact-zero tail
            A[:H] = np.linspace(-0.4, 1.2, H)
            t[a + "A_log"] = _f32(A)
            t[a + "dt_bias"] = _f32(0.5 * rng.standard_normal(C))
            t[a + "b_proj.weight"] = _bf16(mat(H, E))
            t[a + "o_norm.weight"] = _f32(gain(D))
            t[a + "o_proj.weight"] = _bf16(mat(E, C))
        if l < c["first_k_dense_replace"]:
            Id = c["intermediate_size"]
            t[p + "mlp.gate_proj.weight"] = _bf16(mat(Id, E, 2.0))
            t[p + "mlp.up_proj.weight"] = _bf16(mat(Id, E, 2.0))
            t[p + "mlp.down_proj.weight"] = _bf16(mat(E, Id))
        else:
            b = p + "block_sparse_moe."
            t[b + "gate.weight"] = _bf16(mat(Ne, E))
            t[b + "gate.e_score_correction_bias"] = _f32(0.05 * rng.standard_normal(Ne))
            t[b + "routed_expert_down_proj.weight"] = _bf16(mat(lat, E))
            t[b + "routed_expert_norm.weight"] = _bf16(gain(lat))
            t[b + "routed_expert_up_proj.weight"] = _bf16(mat(E, lat))
            Is = I * c["num_shared_experts"]
            t[b + "shared_experts.gate_proj.weight"] = _bf16(mat(Is, E, 2.0))
            t[b + "shared_experts.up_proj.weight"] = _bf16(mat(Is, E, 2.0))
            t[b + "shared_experts.down_proj.weight"] = _bf16(mat(E, Is))
            # Experts in lexicographic name order, as the release stores them (§3.5).
            for e in sorted(range(Ne), key=str):
                for w, (rows, cols) in (("w1", (I, lat)), ("w2", (lat, I)), ("w3", (I, lat))):
                    if cols % 32:
                        raise ValueError(f"expert input width {cols} is not a multiple of 32")
                    codes = rng.integers(0, 16, size=(rows, cols), dtype=np.uint8)
                    # ~2^-5 .. 2^-3 steps: values of order 1/sqrt(fan_in), like a trained layer
                    scale = rng.integers(121, 124, size=(rows, cols // 32), dtype=np.uint8)
                    if l == 1 and e == 0 and w == "w1":
                        scale[0, 0] = 255  # D12 zero block, exercised once
                    packed = quantize_codes_to_packed(codes)
                    en = f"{b}experts.{e}.{w}."
                    if experts == "mxfp4":
                        t[en + "weight_packed"] = ("U8", packed)
                        t[en + "weight_scale"] = ("U8", scale)
                    elif experts == "float":
                        t[en + "weight"] = _f32(dequant_mxfp4(packed, scale))
                    else:
                        raise ValueError(experts)
    t[M + "embed_tokens.weight"] = _bf16(rng.standard_normal((V, E)))
    t[M + "norm.weight"] = _bf16(gain(E))
    t[M + "output_attn_res_norm.weight"] = _bf16(gain(E))
    t[M + "output_attn_res_proj.weight"] = _bf16(0.1 * rng.standard_normal((1, E)))
    t["language_model.lm_head.weight"] = _bf16(mat(V, E, 4.0))
    return t


def write_checkpoint(directory: str, flat: dict = TINY_FLAT_MXFP4, seed: int = 0, experts: str = "mxfp4",
                     config_shape: str = "nested") -> str:
    """Write a released-layout checkpoint; returns the directory."""
    os.makedirs(directory, exist_ok=True)
    tensors = make_tiny_tensors(flat, seed, experts)
    L = flat["num_hidden_layers"]
    n_shards = L + 1
    shard_of = {}
    for name in tensors:
        if name.startswith("language_model.model.layers."):
            shard_of[name] = int(name.split(".")[3]) + 1
        else:
            shard_of[name] = n_shards
    weight_map, total = {}, 0
    for k in range(1, n_shards + 1):
        fname = f"model-{k:05d}-of-{n_shards:06d}.safetensors"
        # Released order inside a shard: trunk tensors first, then experts (lexicographic).
        names = [n for n in tensors if shard_of[n] == k]
        names.sort(key=lambda n: (".experts." in n, n if ".experts." in n else ""))
        write_safetensors(os.path.join(directory, fname), {n: tensors[n] for n in names})
        for n in names:
            weight_map[n] = fname
            total += tensors[n][1].nbytes
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    cfg = nested_config(flat, with_quant=(experts == "mxfp4")) if config_shape == "nested" else dict(flat)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return directory

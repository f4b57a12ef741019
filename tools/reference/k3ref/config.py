"""config.json reader (K3-MODEL §2).

Two shapes (§2.1): *nested* iff the root has an object member ``text_config``; otherwise
*flat*. Lookup rule D6: in the nested shape KDA keys come only from
``text_config.linear_attn_config``, model keys only from ``text_config``, tokenizer ids from
the root falling back to ``text_config``; there is never a fallback between objects for model
fields, and the flat-only aliases are not read in the nested shape. No field that changes
arithmetic has a default (D7); every problem is collected and reported in one ConfigError.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

# The reference's own bound on top-k (§2.5 rule 6). Generous; it only guards against
# obviously broken configs (K3 uses 16).
MAX_TOP_K = 64

# KDA fields that live in linear_attn_config in the nested shape (D6).
_KDA_KEYS = ("num_heads", "head_dim", "short_conv_kernel_size", "gate_lower_bound",
             "full_attn_layers", "kda_layers", "use_full_rank_gate")


class ConfigError(ValueError):
    def __init__(self, problems: List[str]):
        self.problems = list(problems)
        super().__init__("invalid config:\n  " + "\n  ".join(self.problems))


@dataclass
class K3Config:
    shape: str  # "nested" or "flat"
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    rms_norm_eps: float
    kda_num_heads: int
    kda_head_dim: int
    short_conv_kernel_size: int
    gate_lower_bound: float
    full_attn_layers: List[int]  # 1-based, as in the file
    num_attention_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    mla_use_output_gate: bool
    num_experts: int
    num_experts_per_token: int
    num_shared_experts: int
    routed_expert_hidden_size: int
    moe_intermediate_size: int
    routed_scaling_factor: float
    moe_renormalize: bool
    latent_moe_use_norm: bool
    first_k_dense_replace: int
    intermediate_size: Optional[int]
    attn_res_block_size: int
    situ_beta: float
    situ_linear_beta: Optional[float]  # None = no cap on the up branch
    kda_layers: Optional[List[int]] = None
    eos_token_id: Any = None
    bos_token_id: Optional[int] = None
    pad_token_id: Optional[int] = None
    max_position_embeddings: Optional[int] = None
    quantization_config: Optional[dict] = None
    num_nextn_predict_layers: int = 0
    notes: List[str] = field(default_factory=list)

    # ---- layer map (§2.6) ----
    def is_mla(self, l: int) -> bool:
        return (l + 1) in self.full_attn_layers

    def is_dense(self, l: int) -> bool:
        return l < self.first_k_dense_replace

    def is_boundary(self, l: int) -> bool:
        return l % self.attn_res_block_size == 0

    def layer_map(self) -> str:
        """One letter per layer: K = KDA, M = MLA."""
        return "".join("M" if self.is_mla(l) else "K" for l in range(self.num_hidden_layers))

    @property
    def kda_width(self) -> int:
        return self.kda_num_heads * self.kda_head_dim

    @property
    def mla_qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def special_ids(self) -> List[int]:
        ids = []
        for v in (self.bos_token_id, self.pad_token_id):
            if isinstance(v, int):
                ids.append(v)
        if isinstance(self.eos_token_id, int):
            ids.append(self.eos_token_id)
        elif isinstance(self.eos_token_id, list):
            ids.extend(x for x in self.eos_token_id if isinstance(x, int))
        return ids

    def summary(self) -> Dict[str, Any]:
        return {
            "shape": self.shape,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "kda_num_heads": self.kda_num_heads,
            "kda_head_dim": self.kda_head_dim,
            "short_conv_kernel_size": self.short_conv_kernel_size,
            "gate_lower_bound": self.gate_lower_bound,
            "full_attn_layers": list(self.full_attn_layers),
            "layer_map": self.layer_map(),
            "num_attention_heads": self.num_attention_heads,
            "q_lora_rank": self.q_lora_rank,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "v_head_dim": self.v_head_dim,
            "mla_use_output_gate": self.mla_use_output_gate,
            "num_experts": self.num_experts,
            "num_experts_per_token": self.num_experts_per_token,
            "num_shared_experts": self.num_shared_experts,
            "routed_expert_hidden_size": self.routed_expert_hidden_size,
            "moe_intermediate_size": self.moe_intermediate_size,
            "routed_scaling_factor": self.routed_scaling_factor,
            "moe_renormalize": self.moe_renormalize,
            "latent_moe_use_norm": self.latent_moe_use_norm,
            "first_k_dense_replace": self.first_k_dense_replace,
            "intermediate_size": self.intermediate_size,
            "attn_res_block_size": self.attn_res_block_size,
            "situ_beta": self.situ_beta,
            "situ_linear_beta": self.situ_linear_beta,
            "mla_eps_lowrank": 1e-6,
            "kda_l2norm_eps": 1e-6,
        }


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool))


def load_config(path: str) -> K3Config:
    with open(path, "r", encoding="utf-8") as f:
        try:
            obj = json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError([f"{path}: not valid JSON: {e}"]) from None
    return parse_config(obj)


def parse_config(obj: Any) -> K3Config:
    problems: List[str] = []
    if not isinstance(obj, dict):
        raise ConfigError(["config root is not a JSON object"])

    nested = isinstance(obj.get("text_config"), dict)
    # A null text_config is an absent one (flat, as the engine reads it); another non-object
    # is refused rather than read as flat.
    if obj.get("text_config") is not None and not nested:
        problems.append("root.text_config is present but not an object")
    if nested:
        tc = obj["text_config"]
        lac = tc.get("linear_attn_config")
        if not isinstance(lac, dict):
            raise ConfigError(["text_config.linear_attn_config missing or not an object"])
        model_src, model_where = tc, "text_config"
        kda_src, kda_where = lac, "text_config.linear_attn_config"
        kda_names = {"num_heads": "num_heads", "head_dim": "head_dim"}
    else:
        model_src, model_where = obj, "root"
        kda_src, kda_where = obj, "root"
        # Bare num_heads/head_dim at a flat root are ambiguous and deliberately not read.
        kda_names = {"num_heads": "kda_num_heads", "head_dim": "kda_head_dim"}

    def get(src, where, key, kind, required=True, nullable=False):
        if key not in src:
            if required:
                problems.append(f"missing required key {key!r} in {where}")
            return None
        v = src[key]
        if v is None:
            if nullable:
                return None
            problems.append(f"key {key!r} in {where} is null")
            return None
        ok = {"int": _is_int, "num": _is_num, "bool": lambda x: isinstance(x, bool),
              "intlist": lambda x: isinstance(x, list) and all(_is_int(i) for i in x)}[kind](v)
        if not ok:
            problems.append(f"key {key!r} in {where} has wrong type ({type(v).__name__}, want {kind})")
            return None
        return float(v) if kind == "num" else v

    def model(key, kind, required=True, nullable=False):
        return get(model_src, model_where, key, kind, required, nullable)

    def kda(key, kind, required=True):
        return get(kda_src, kda_where, kda_names.get(key, key), kind, required)

    E = model("hidden_size", "int")
    L = model("num_hidden_layers", "int")
    V = model("vocab_size", "int")
    eps = model("rms_norm_eps", "num")
    Hk = kda("num_heads", "int")
    D = kda("head_dim", "int")
    K = kda("short_conv_kernel_size", "int")
    gmin = kda("gate_lower_bound", "num")
    fal = kda("full_attn_layers", "intlist")
    kdl = kda("kda_layers", "intlist", required=False)
    Hm = model("num_attention_heads", "int")
    if model_src.get("q_lora_rank", 0) is None:
        problems.append(f"q_lora_rank in {model_where} is null (no query compression): not K3")
        qlr = None
    else:
        qlr = model("q_lora_rank", "int")
    kvlr = model("kv_lora_rank", "int")
    nope = model("qk_nope_head_dim", "int")
    rope = model("qk_rope_head_dim", "int")
    vh = model("v_head_dim", "int")
    gate = model("mla_use_output_gate", "bool")
    Ne = model("num_experts", "int")
    topk = model("num_experts_per_token", "int")
    nsh = model("num_shared_experts", "int")
    if model_src.get("routed_expert_hidden_size", 0) is None:
        problems.append(f"routed_expert_hidden_size in {model_where} is null: not a latent MoE")
        lat = None
    else:
        lat = model("routed_expert_hidden_size", "int")
    inter = model("moe_intermediate_size", "int")
    rsf = model("routed_scaling_factor", "num")
    renorm = model("moe_renormalize", "bool")
    lnorm = model("latent_moe_use_norm", "bool")
    fkd = model("first_k_dense_replace", "int")
    idense = model("intermediate_size", "int", required=bool(fkd))
    S = model("attn_res_block_size", "int")

    # SiTU betas: released names everywhere; the short aliases only in the flat shape.
    def beta(released, alias, nullable):
        have_r = released in model_src
        have_a = (not nested) and alias in model_src
        if not have_r and not have_a:
            problems.append(f"missing required key {released!r}"
                            + ("" if nested else f" (or alias {alias!r})") + f" in {model_where}")
            return None
        vals = []
        for k, present in ((released, have_r), (alias, have_a)):
            if present:
                vals.append(get(model_src, model_where, k, "num", True, nullable))
        if len(vals) == 2 and vals[0] != vals[1]:
            problems.append(f"{released!r} and alias {alias!r} disagree ({vals[0]} vs {vals[1]})")
        return vals[0]

    b1 = beta("activation_situ_beta", "situ_beta", nullable=False)
    b2 = beta("activation_situ_linear_beta", "situ_linear_beta", nullable=True)

    # ---- §2.5 rule 3, 4: sizes and ranges ----
    def pos(name, v):
        if v is not None and v < 1:
            problems.append(f"{name} must be >= 1, got {v}")

    for name, v in (("hidden_size", E), ("num_hidden_layers", L), ("vocab_size", V),
                    ("KDA num_heads", Hk), ("KDA head_dim", D), ("short_conv_kernel_size", K),
                    ("num_attention_heads", Hm), ("q_lora_rank", qlr), ("kv_lora_rank", kvlr),
                    ("v_head_dim", vh), ("num_experts", Ne), ("routed_expert_hidden_size", lat),
                    ("moe_intermediate_size", inter), ("attn_res_block_size", S),
                    ("intermediate_size", idense if fkd else 1)):
        pos(name, v)
    if nope is not None and rope is not None and (nope < 0 or rope < 0 or nope + rope < 1):
        problems.append(f"qk_nope_head_dim + qk_rope_head_dim must be >= 1 (got {nope} + {rope})")
    if nsh is not None and nsh < 0:
        problems.append(f"num_shared_experts must be >= 0, got {nsh}")
    if fkd is not None and L is not None and not 0 <= fkd <= L:
        problems.append(f"first_k_dense_replace must be in 0..{L}, got {fkd}")
    if eps is not None and not (math.isfinite(eps) and eps > 0):
        problems.append(f"rms_norm_eps must be finite and > 0, got {eps}")
    if gmin is not None and not (math.isfinite(gmin) and gmin < 0):
        problems.append(f"gate_lower_bound must be finite and < 0, got {gmin}")
    for name, v in (("activation_situ_beta", b1), ("activation_situ_linear_beta", b2),
                    ("routed_scaling_factor", rsf)):
        if v is not None and not (math.isfinite(v) and v > 0):
            problems.append(f"{name} must be finite and > 0, got {v}")

    # ---- rule 5: layer map ----
    if fal is not None and L is not None:
        if not fal:
            problems.append("full_attn_layers is empty")
        bad = [x for x in fal if not 1 <= x <= L]
        if bad:
            problems.append(f"full_attn_layers entries {bad} outside 1..{L} (the list is 1-based)")
        if len(set(fal)) != len(fal):
            problems.append("full_attn_layers has duplicate entries")
        if len(set(fal)) >= L:
            problems.append("full_attn_layers covers every layer (at least one KDA layer required)")
        if kdl is not None:
            if set(kdl) & set(fal):
                problems.append("kda_layers and full_attn_layers overlap")
            if set(kdl) | set(fal) != set(range(1, L + 1)) or len(kdl) + len(fal) != L:
                problems.append("kda_layers and full_attn_layers together are not exactly {1..L}")

    # ---- rule 6: top-k ----
    if topk is not None and Ne is not None:
        if not 1 <= topk <= Ne:
            problems.append(f"num_experts_per_token {topk} must be in 1..num_experts ({Ne})")
        if topk > MAX_TOP_K:
            problems.append(f"num_experts_per_token {topk} exceeds the reference bound {MAX_TOP_K}")

    # ---- rule 7: quantization_config (text_config first, else root: D9) ----
    qc = None
    if nested and "quantization_config" in obj["text_config"]:
        qc = obj["text_config"]["quantization_config"]
    elif "quantization_config" in obj:
        qc = obj["quantization_config"]
    if qc is not None:
        problems.extend(_check_quant(qc))

    # ---- rule 8: guard fields (present with another value -> refuse) ----
    notes: List[str] = []

    def guard(src, where, key, ok, want):
        if key in src and not ok(src[key]):
            problems.append(f"guard field {key!r} in {where} = {src[key]!r}; only {want} is supported")

    guard(model_src, model_where, "hidden_act", lambda v: v == "situ", '"situ"')
    guard(model_src, model_where, "mla_use_nope", lambda v: v is True, "true")
    guard(model_src, model_where, "moe_router_activation_func", lambda v: v == "sigmoid", '"sigmoid"')
    guard(model_src, model_where, "num_expert_group", lambda v: v is None or (_is_int(v) and v == 1), "1")
    guard(model_src, model_where, "topk_group", lambda v: v is None or (_is_int(v) and v == 1), "1")
    guard(model_src, model_where, "moe_layer_freq", lambda v: _is_int(v) and v == 1, "1")
    guard(kda_src, kda_where, "use_full_rank_gate", lambda v: v is True, "true")
    guard(obj, "root", "tie_word_embeddings", lambda v: v is False, "false")
    if nested:
        guard(model_src, model_where, "tie_word_embeddings", lambda v: v is False, "false")
    nextn = model_src.get("num_nextn_predict_layers", 0)
    if not _is_int(nextn) or nextn < 0:
        problems.append(f"num_nextn_predict_layers must be a non-negative integer, got {nextn!r}")
        nextn = 0
    elif nextn > 0:
        notes.append(f"num_nextn_predict_layers = {nextn}: MTP head ignored (does not change the forward)")

    # Tokenizer ids: root first, then text_config.
    def tok(key):
        if key in obj:
            return obj[key]
        if nested:
            return obj["text_config"].get(key)
        return None

    if problems:
        raise ConfigError(problems)
    return K3Config(
        shape="nested" if nested else "flat",
        hidden_size=E, num_hidden_layers=L, vocab_size=V, rms_norm_eps=eps,
        kda_num_heads=Hk, kda_head_dim=D, short_conv_kernel_size=K, gate_lower_bound=gmin,
        full_attn_layers=list(fal), kda_layers=list(kdl) if kdl is not None else None,
        num_attention_heads=Hm, q_lora_rank=qlr, kv_lora_rank=kvlr, qk_nope_head_dim=nope,
        qk_rope_head_dim=rope, v_head_dim=vh, mla_use_output_gate=gate,
        num_experts=Ne, num_experts_per_token=topk, num_shared_experts=nsh,
        routed_expert_hidden_size=lat, moe_intermediate_size=inter, routed_scaling_factor=rsf,
        moe_renormalize=renorm, latent_moe_use_norm=lnorm, first_k_dense_replace=fkd,
        intermediate_size=idense, attn_res_block_size=S, situ_beta=b1,
        situ_linear_beta=b2,
        eos_token_id=tok("eos_token_id"), bos_token_id=tok("bos_token_id"),
        pad_token_id=tok("pad_token_id"),
        max_position_embeddings=model_src.get("max_position_embeddings"),
        quantization_config=qc, num_nextn_predict_layers=nextn, notes=notes,
    )


def _check_quant(qc: Any) -> List[str]:
    p: List[str] = []
    if not isinstance(qc, dict):
        return ["quantization_config is not an object"]
    if qc.get("quant_method") != "compressed-tensors":
        p.append(f"quantization_config.quant_method {qc.get('quant_method')!r} != 'compressed-tensors'")
    if qc.get("format") != "mxfp4-pack-quantized":
        p.append(f"quantization_config.format {qc.get('format')!r} != 'mxfp4-pack-quantized'")
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or len(groups) != 1:
        p.append("quantization_config.config_groups must hold exactly one group")
        return p
    w = next(iter(groups.values()))
    w = w.get("weights") if isinstance(w, dict) else None
    if not isinstance(w, dict):
        p.append("quantization_config group has no 'weights' object")
        return p
    for key, want in (("num_bits", 4), ("type", "float"), ("group_size", 32), ("symmetric", True)):
        if w.get(key) != want or isinstance(w.get(key), bool) != isinstance(want, bool):
            p.append(f"quantization_config weights.{key} = {w.get(key)!r}, want {want!r}")
    return p

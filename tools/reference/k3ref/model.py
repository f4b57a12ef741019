"""Whole-model forward (K3-MODEL §6.2, §6.7, §6.8) and checkpoint -> weights (§4, §5).

``Model.forward(ids, state)`` consumes T tokens at positions state.n .. state.n+T-1,
layer-major, updates the per-sequence state and returns float64 logits [T, V]. A decode step
is simply forward with T = 1, so "prefill then decode" and "one long prefill" run the same
code; they agree to float64 rounding (not bit for bit: batched and single-row matmuls may
sum in different orders).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .config import K3Config, load_config
from .mxfp4 import dequant_mxfp4
from .ops import (F64, KDAState, MLACache, attnres, dense_mlp, fold_res, kda_layer,
                  linear, mla, moe, rmsnorm)
from .ops import (conv_weight_2d, kda_decay, kda_recurrence, l2norm, router, shortconv,  # noqa: F401
                  situ_glu, softmax)
from .safetensors_io import FLOAT_DTYPES, Checkpoint

# re-exported for callers that only import k3ref.model
__all__ = ["Model", "ModelWeights", "LayerWeights", "SeqState", "load_model", "decoder_layer",
           "rmsnorm", "situ_glu", "shortconv", "kda_decay", "kda_recurrence", "kda_layer",
           "router", "attnres", "mla", "moe", "dense_mlp", "l2norm", "softmax"]

M = "language_model.model."


def P(l: int) -> str:
    return f"{M}layers.{l}."


class WeightError(ValueError):
    pass


@dataclass
class LayerWeights:
    is_mla: bool
    is_dense: bool
    input_layernorm: torch.Tensor
    post_attention_layernorm: torch.Tensor
    f_attn: torch.Tensor  # folded AttnRes scoring vector before attention
    f_mlp: torch.Tensor  # ... before the FFN
    attn: Dict[str, torch.Tensor]  # canonical KDA or MLA keys (see ops.py)
    ffn: Dict[str, torch.Tensor]  # dense: gate/up/down; MoE: canonical MoE keys
    experts: Optional["ExpertStore"] = None


class ExpertStore:
    """Routed experts of one layer. MXFP4 experts are dequantised lazily (float64) on first
    use and kept; plain-float experts are widened on first use."""

    def __init__(self, ckpt: Checkpoint, layer: int, packed: bool):
        self.ckpt, self.layer, self.packed = ckpt, layer, packed
        self._cache: Dict[int, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def _matrix(self, e: int, w: str) -> torch.Tensor:
        base = f"{P(self.layer)}block_sparse_moe.experts.{e}.{w}."
        if self.packed:
            return torch.from_numpy(dequant_mxfp4(self.ckpt.numpy(base + "weight_packed"),
                                                  self.ckpt.numpy(base + "weight_scale")))
        return self.ckpt.torch64(base + "weight")

    def __call__(self, e: int):
        if e not in self._cache:
            self._cache[e] = (self._matrix(e, "w1"), self._matrix(e, "w2"), self._matrix(e, "w3"))
        return self._cache[e]


@dataclass
class ModelWeights:
    cfg: K3Config
    embed: torch.Tensor  # [V, E]
    norm: torch.Tensor  # [E]
    f_out: torch.Tensor  # [E]
    lm_head: torch.Tensor  # [V, E]
    layers: List[LayerWeights]
    experts_packed: Optional[bool] = None  # None when there is no MoE layer


_EXPERT_RE = re.compile(r"^language_model\.model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\."
                        r"(w[123])\.(weight|weight_packed|weight_scale)$")


def load_weights(ckpt: Checkpoint, cfg: K3Config) -> ModelWeights:
    """Read and cross-check every tensor the config implies (§2.5 rule 9, §5.8, §5.10).
    All problems are collected and raised together."""
    problems: List[str] = []
    used = set()
    E, V, L = cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers

    def get(name: str, shape: Sequence[int], alt_shapes: Sequence[Sequence[int]] = ()) -> Optional[torch.Tensor]:
        if name not in ckpt:
            problems.append(f"missing tensor {name}")
            return None
        used.add(name)
        info = ckpt.info(name)
        if info.dtype not in FLOAT_DTYPES:
            problems.append(f"{name}: dtype {info.dtype} not accepted (F32/BF16/F16 only)")
            return None
        if list(info.shape) != list(shape) and not any(list(info.shape) == list(a) for a in alt_shapes):
            problems.append(f"{name}: shape {list(info.shape)}, expected {list(shape)}"
                            + (f" or {[list(a) for a in alt_shapes]}" if alt_shapes else ""))
            return None
        return ckpt.torch64(name)

    def get_A_log(name: str, H: int) -> Optional[torch.Tensor]:
        # D1: any shape with >= H elements; first H are the per-head values; tail must be 0.
        if name not in ckpt:
            problems.append(f"missing tensor {name}")
            return None
        used.add(name)
        info = ckpt.info(name)
        if info.dtype not in FLOAT_DTYPES:
            problems.append(f"{name}: dtype {info.dtype} not accepted")
            return None
        a = ckpt.torch64(name).reshape(-1)
        if a.numel() < H:
            problems.append(f"{name}: {a.numel()} elements < {H} heads")
            return None
        if a.numel() > H and bool((a[H:] != 0).any()):
            problems.append(f"{name}: elements {H}..{a.numel() - 1} must all be exactly 0 (D1)")
            return None
        return a[:H].clone()

    embed = get(M + "embed_tokens.weight", [V, E])
    norm = get(M + "norm.weight", [E])
    on = get(M + "output_attn_res_norm.weight", [E])
    op = get(M + "output_attn_res_proj.weight", [1, E], [[E]])
    lm_head = get("language_model.lm_head.weight", [V, E])

    H, D, K = cfg.kda_num_heads, cfg.kda_head_dim, cfg.short_conv_kernel_size
    C = H * D
    Hm, dn, dr, dv = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    qlr, kvlr = cfg.q_lora_rank, cfg.kv_lora_rank
    Ne, lat, I = cfg.num_experts, cfg.routed_expert_hidden_size, cfg.moe_intermediate_size

    # Packed vs plain experts: decided per tensor name, never mixed in one checkpoint (§5.8).
    names = ckpt.keys()
    packed_names = [n for n in names if n.endswith(".weight_packed") or n.endswith(".weight_scale")]
    for n in packed_names:
        if not _EXPERT_RE.match(n):
            problems.append(f"packed tensor outside the routed experts: {n}")
    any_packed = any(_EXPERT_RE.match(n) and n.endswith("weight_packed") for n in names)
    any_plain = any((m := _EXPERT_RE.match(n)) and m.group(4) == "weight" for n in names)
    if any_packed and any_plain:
        problems.append("checkpoint mixes MXFP4 and plain-float routed experts")
    if any_packed and cfg.quantization_config is None:
        problems.append("checkpoint has weight_packed tensors but config has no quantization_config")
    experts_packed = any_packed if cfg.first_k_dense_replace < L else None

    layers: List[LayerWeights] = []
    for l in range(L):
        p = P(l)
        ln_in = get(p + "input_layernorm.weight", [E])
        ln_post = get(p + "post_attention_layernorm.weight", [E])
        san = get(p + "self_attention_res_norm.weight", [E])
        sap = get(p + "self_attention_res_proj.weight", [1, E], [[E]])
        mrn = get(p + "mlp_res_norm.weight", [E])
        mrp = get(p + "mlp_res_proj.weight", [1, E], [[E]])
        a = p + "self_attn."
        if cfg.is_mla(l):
            attn = {
                "q_a_proj": get(a + "q_a_proj.weight", [qlr, E]),
                "q_a_layernorm": get(a + "q_a_layernorm.weight", [qlr]),
                "q_b_proj": get(a + "q_b_proj.weight", [Hm * (dn + dr), qlr]),
                "kv_a_proj_with_mqa": get(a + "kv_a_proj_with_mqa.weight", [kvlr + dr, E]),
                "kv_a_layernorm": get(a + "kv_a_layernorm.weight", [kvlr]),
                "kv_b_proj": get(a + "kv_b_proj.weight", [Hm * (dn + dv), kvlr]),
                "o_proj": get(a + "o_proj.weight", [E, Hm * dv]),
            }
            if cfg.mla_use_output_gate:
                attn["g_proj"] = get(a + "g_proj.weight", [Hm * dv, E])
        else:
            attn = {
                "q_proj": get(a + "q_proj.weight", [C, E]),
                "k_proj": get(a + "k_proj.weight", [C, E]),
                "v_proj": get(a + "v_proj.weight", [C, E]),
                "q_conv": _conv(get(a + "q_conv1d.weight", [C, 1, K], [[C, K]])),
                "k_conv": _conv(get(a + "k_conv1d.weight", [C, 1, K], [[C, K]])),
                "v_conv": _conv(get(a + "v_conv1d.weight", [C, 1, K], [[C, K]])),
                "f_a": get(a + "f_a_proj.weight", [D, E]),
                "f_b": get(a + "f_b_proj.weight", [C, D]),
                "A_log": get_A_log(a + "A_log", H),
                "dt_bias": get(a + "dt_bias", [C]),
                "b_proj": get(a + "b_proj.weight", [H, E]),
                "g_proj": get(a + "g_proj.weight", [C, E]),
                "o_norm": get(a + "o_norm.weight", [D]),
                "o_proj": get(a + "o_proj.weight", [E, C]),
            }
        store = None
        if cfg.is_dense(l):
            Id = cfg.intermediate_size
            ffn = {
                "gate": get(p + "mlp.gate_proj.weight", [Id, E]),
                "up": get(p + "mlp.up_proj.weight", [Id, E]),
                "down": get(p + "mlp.down_proj.weight", [E, Id]),
            }
        else:
            b = p + "block_sparse_moe."
            ffn = {
                "gate": get(b + "gate.weight", [Ne, E]),
                "e_score_correction_bias": get(b + "gate.e_score_correction_bias", [Ne]),
                "down": get(b + "routed_expert_down_proj.weight", [lat, E]),
                "up": get(b + "routed_expert_up_proj.weight", [E, lat]),
            }
            if cfg.latent_moe_use_norm:
                ffn["norm"] = get(b + "routed_expert_norm.weight", [lat])
            if cfg.num_shared_experts > 0:
                Is = I * cfg.num_shared_experts
                ffn["shared_gate"] = get(b + "shared_experts.gate_proj.weight", [Is, E])
                ffn["shared_up"] = get(b + "shared_experts.up_proj.weight", [Is, E])
                ffn["shared_down"] = get(b + "shared_experts.down_proj.weight", [E, Is])
            for e in range(Ne):
                for wname, shape in (("w1", [I, lat]), ("w2", [lat, I]), ("w3", [I, lat])):
                    _check_expert(ckpt, f"{b}experts.{e}.{wname}.", shape, problems, used)
            store = ExpertStore(ckpt, l, bool(any_packed))
        layers.append(LayerWeights(
            is_mla=cfg.is_mla(l), is_dense=cfg.is_dense(l),
            input_layernorm=ln_in, post_attention_layernorm=ln_post,
            f_attn=fold_res(san, sap) if san is not None and sap is not None else None,
            f_mlp=fold_res(mrn, mrp) if mrn is not None and mrp is not None else None,
            attn=attn, ffn=ffn, experts=store))

    # No unknown tensor under the layers prefix (MTP layers >= L are ignored if configured).
    for n in names:
        if n.startswith(M + "layers.") and n not in used:
            m = re.match(r"^language_model\.model\.layers\.(\d+)\.", n)
            if m and int(m.group(1)) >= L and cfg.num_nextn_predict_layers > 0:
                continue
            problems.append(f"unexpected tensor {n}")
    if problems:
        raise WeightError("checkpoint does not match config:\n  " + "\n  ".join(problems[:50])
                          + (f"\n  ... and {len(problems) - 50} more" if len(problems) > 50 else ""))
    return ModelWeights(cfg=cfg, embed=embed, norm=norm, f_out=fold_res(on, op), lm_head=lm_head,
                        layers=layers, experts_packed=experts_packed)


def _conv(w: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if w is None else conv_weight_2d(w)


def _check_expert(ckpt: Checkpoint, base: str, shape: List[int], problems: List[str], used: set) -> None:
    """One expert matrix: either weight_packed+weight_scale (U8) or a plain float .weight."""
    pk, sc, pl = base + "weight_packed", base + "weight_scale", base + "weight"
    has_pk, has_sc, has_pl = pk in ckpt, sc in ckpt, pl in ckpt
    if has_pl and (has_pk or has_sc):
        problems.append(f"{base}: both packed and plain weights present")
        return
    if has_pl:
        used.add(pl)
        info = ckpt.info(pl)
        if info.dtype not in FLOAT_DTYPES or list(info.shape) != shape:
            problems.append(f"{pl}: {info.dtype} {list(info.shape)}, expected float {shape}")
        return
    if not has_pk or not has_sc:
        problems.append(f"{base}: missing weight (need weight_packed+weight_scale or weight)")
        return
    used.update((pk, sc))
    if shape[1] % 32:
        problems.append(f"{base}: MXFP4 needs the input width {shape[1]} to be a multiple of 32")
        return
    ip, is_ = ckpt.info(pk), ckpt.info(sc)
    if ip.dtype != "U8" or is_.dtype not in ("U8", "F8_E8M0"):
        problems.append(f"{base}: packed/scale dtypes {ip.dtype}/{is_.dtype}, expected U8")
    if list(ip.shape) != [shape[0], shape[1] // 2] or list(is_.shape) != [shape[0], shape[1] // 32]:
        problems.append(f"{base}: packed {list(ip.shape)} / scale {list(is_.shape)} do not encode {shape}")


# ---------------------------------------------------------------------------------------------
# §6.2 one decoder layer

def decoder_layer(Pres: torch.Tensor, bank: List[torch.Tensor], lw: LayerWeights, cfg: K3Config,
                  layer_idx: int, state=None):
    """One decoder layer for T tokens. Pres [T,E] is the running block partial sum P, bank the
    AttnRes bank (list of [T,E], oldest first). Returns (P, bank, new attention state).

    Boundary rule: the attention input is mixed from the OLD bank plus P before P is pushed;
    then P is pushed and restarts as the attention output alone (assignment, not 0 + y)."""
    eps = cfg.rms_norm_eps
    bank = list(bank)
    a_in = Pres if not bank else attnres(bank + [Pres], lw.f_attn, eps)
    boundary = cfg.is_boundary(layer_idx)
    if boundary:
        bank.append(Pres)
        Pres = None
    x = rmsnorm(a_in, lw.input_layernorm, eps)
    if lw.is_mla:
        y, state = mla(x, lw.attn, cfg.num_attention_heads, cfg.qk_nope_head_dim,
                       cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank, state,
                       use_output_gate=cfg.mla_use_output_gate)
    else:
        y, state = kda_layer(x, lw.attn, cfg.kda_num_heads, cfg.kda_head_dim,
                             cfg.gate_lower_bound, eps, state)
    Pres = y if Pres is None else Pres + y
    f_in = attnres(bank + [Pres], lw.f_mlp, eps)  # the bank is never empty here
    xf = rmsnorm(f_in, lw.post_attention_layernorm, eps)
    if lw.is_dense:
        z = dense_mlp(xf, lw.ffn["gate"], lw.ffn["up"], lw.ffn["down"], cfg.situ_beta, cfg.situ_linear_beta)
    else:
        z = moe(xf, lw.ffn, lw.experts, cfg.num_experts_per_token, cfg.moe_renormalize,
                cfg.routed_scaling_factor, cfg.latent_moe_use_norm, eps, cfg.situ_beta,
                cfg.situ_linear_beta)
    return Pres + z, bank, state


# ---------------------------------------------------------------------------------------------
# §6.1 per-sequence state and the model

@dataclass
class SeqState:
    layers: list  # KDAState or MLACache per layer
    n: int = 0  # tokens consumed

    def clone(self) -> "SeqState":
        return SeqState([s.clone() for s in self.layers], self.n)


class Model:
    def __init__(self, weights: ModelWeights):
        self.w = weights
        self.cfg = weights.cfg

    def new_state(self) -> SeqState:
        c = self.cfg
        layers = []
        for l in range(c.num_hidden_layers):
            if c.is_mla(l):
                layers.append(MLACache.empty(c.kv_lora_rank, c.qk_rope_head_dim))
            else:
                layers.append(KDAState.zeros(c.kda_num_heads, c.kda_head_dim, c.short_conv_kernel_size))
        return SeqState(layers, 0)

    def forward(self, ids: Sequence[int], state: Optional[SeqState] = None, checksums: bool = False):
        """Consume ids at positions state.n..; returns logits [T, V] float64 (and, with
        checksums=True, a [T, L, 2] tensor of (sum, sum|.|) of P after each layer).
        The state is updated in place (a fresh one is used if None)."""
        c = self.cfg
        if state is None:
            state = self.new_state()
        ids = [int(i) for i in ids]
        for i in ids:
            if not 0 <= i < c.vocab_size:
                raise ValueError(f"token id {i} outside 0..{c.vocab_size - 1}")
        T = len(ids)
        Pres = self.w.embed[torch.tensor(ids, dtype=torch.int64)]  # no scaling
        bank: List[torch.Tensor] = []
        sums = torch.zeros(T, c.num_hidden_layers, 2, dtype=F64)
        for l, lw in enumerate(self.w.layers):
            Pres, bank, state.layers[l] = decoder_layer(Pres, bank, lw, c, l, state.layers[l])
            if checksums:
                sums[:, l, 0] = Pres.sum(dim=1)
                sums[:, l, 1] = Pres.abs().sum(dim=1)
        h_out = attnres(bank + [Pres], self.w.f_out, c.rms_norm_eps)
        logits = linear(rmsnorm(h_out, self.w.norm, c.rms_norm_eps), self.w.lm_head)
        state.n += T
        return (logits, sums) if checksums else logits

    def step(self, token: int, state: SeqState) -> torch.Tensor:
        """One decode step; returns logits [V]."""
        return self.forward([token], state)[0]


def load_model(directory: str) -> Model:
    cfg = load_config(os.path.join(directory, "config.json"))
    return Model(load_weights(Checkpoint(directory), cfg))


def argmax_lowest(row: torch.Tensor) -> int:
    """Greedy choice: the maximum, lowest index on ties (§6.7)."""
    m = row.max()
    return int(torch.nonzero(row == m)[0, 0])

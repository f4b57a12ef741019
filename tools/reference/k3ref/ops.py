"""The operations of the K3 forward pass (K3-MODEL §6), in float64, usable one at a time.

Conventions shared by every function here:
* tensors are torch.float64; callers convert inputs (``as64``);
* a token axis T comes first where there is one; a weight W [out, in] acts as ``x @ W.T``;
* state goes in and comes out explicitly (no hidden globals), so processing T tokens at once
  and T single tokens in sequence run the same code and must agree;
* nothing is fused or reordered for speed: each line mirrors a line of the spec.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

F64 = torch.float64

# Named constants from the spec (§6.9).
KDA_L2NORM_EPS = 1e-6  # inside the root of the SUM of squares (D4)
MLA_LOWRANK_EPS = 1e-6  # q_a_layernorm / kv_a_layernorm (D2)
ROUTER_RENORM_EPS = 1e-20  # added to the top-k weight sum (D5)


def as64(x) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.to(F64)
    return torch.as_tensor(np.asarray(x, dtype=np.float64), dtype=F64)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """y[..., o] = sum_i W[o, i] x[..., i]; no bias anywhere in the text model (§0)."""
    return x @ w.T


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x)


def silu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


# ---------------------------------------------------------------------------------------------
# §6.0 primitives

def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """w[i] * x[i] / sqrt(mean_j x[j]^2 + eps), over the last axis. Gain multiplies directly."""
    ms = (x * x).mean(dim=-1, keepdim=True)
    return w * (x / torch.sqrt(ms + eps))


def l2norm(x: torch.Tensor, eps: float = KDA_L2NORM_EPS) -> torch.Tensor:
    """x / sqrt(sum_j x[j]^2 + eps) over the last axis (sum, not mean; eps inside the root)."""
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def situ_glu(a: torch.Tensor, b: torch.Tensor, beta1: float, beta2: Optional[float]) -> torch.Tensor:
    """[b1*tanh(a/b1) * sigmoid(a)] * [b2*tanh(b/b2)]. The sigmoid sees the UNcapped a.
    beta2 None means "no cap on the up branch" (config null)."""
    gate = beta1 * torch.tanh(a / beta1) * torch.sigmoid(a)
    up = b if beta2 is None else beta2 * torch.tanh(b / beta2)
    return gate * up


def softmax(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    m = s.max(dim=dim, keepdim=True).values
    e = torch.exp(s - m)
    return e / e.sum(dim=dim, keepdim=True)


def attnres(sources: Sequence[torch.Tensor], f: torch.Tensor, eps: float) -> torch.Tensor:
    """AttnRes aggregator AR(v_0..v_{m-1}; f) (§6.0). Sources are raw [..., E] vectors in order
    B[0], ..., B[-1], P. Scores use gain-free RMS-normalised keys; the output mixes the RAW
    sources. One source returns that source exactly."""
    if len(sources) == 1:
        return sources[0]
    v = torch.stack(list(sources), dim=0)  # [m, ..., E]
    keys = v / torch.sqrt((v * v).mean(dim=-1, keepdim=True) + eps)
    s = (keys * f).sum(dim=-1)  # [m, ...]
    alpha = softmax(s, dim=0)
    return (alpha.unsqueeze(-1) * v).sum(dim=0)


def fold_res(norm_w: torch.Tensor, proj_w: torch.Tensor) -> torch.Tensor:
    """Scoring vector f = res_norm.weight * res_proj.weight (§5.11); proj may be [1,E] or [E]."""
    return norm_w.reshape(-1) * proj_w.reshape(-1)


# ---------------------------------------------------------------------------------------------
# §6.3 KDA pieces

def conv_weight_2d(w: torch.Tensor) -> torch.Tensor:
    """Accept [C,1,K] or [C,K] (§5.10); return [C,K]."""
    if w.dim() == 3:
        if w.shape[1] != 1:
            raise ValueError(f"conv weight {tuple(w.shape)}: middle dim must be 1")
        return w[:, 0, :]
    if w.dim() == 2:
        return w
    raise ValueError(f"conv weight must be [C,1,K] or [C,K], got {tuple(w.shape)}")


def shortconv(u: torch.Tensor, w: torch.Tensor, history: Optional[torch.Tensor] = None
              ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv + SiLU over T tokens.

    u [T, C] pre-conv inputs; w [C, K] or [C,1,K]; history [C, K-1] = the last K-1 pre-conv
    inputs, oldest first (zeros at sequence start). Tap K-1 multiplies the current input, tap 0
    the oldest. Returns (out [T, C], new history [C, K-1])."""
    w = conv_weight_2d(w)
    C, K = w.shape
    T = u.shape[0]
    if history is None:
        history = torch.zeros(C, K - 1, dtype=F64)
    full = torch.cat([history.T, u], dim=0)  # [K-1+T, C]; full[t + K-1] is token t
    y = torch.zeros(T, C, dtype=F64)
    for j in range(K):
        y = y + w[:, j] * full[j:j + T]
    new_hist = full[T:].T.clone() if K > 1 else torch.zeros(C, 0, dtype=F64)
    return silu(y), new_hist


def kda_decay(z: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, g_min: float,
              num_heads: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Lower-bound decay (§6.3 step 6, D8). z [..., H*D] is W_fb(W_fa x) WITHOUT dt_bias.
    A_log is per HEAD (first H values used), dt_bias per CHANNEL.
    Returns (g, alpha), each [..., H, D]."""
    H = num_heads
    zz = z.reshape(*z.shape[:-1], H, -1)
    db = dt_bias.reshape(H, -1)
    A = torch.exp(A_log.reshape(-1)[:H]).reshape(H, 1)
    g = g_min * torch.sigmoid(A * (zz + db))
    return g, torch.exp(g)


def kda_recurrence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alpha: torch.Tensor,
                   beta: torch.Tensor, q_scale: float, state: Optional[torch.Tensor] = None
                   ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Delta-rule recurrence, sequential over T, all heads at once (§6.3 step 7).

    q, k [T,H,Dk] (q UNscaled; multiplied by q_scale here), v [T,H,Dv], alpha [T,H,Dk],
    beta [T,H]; state [H,Dk,Dv] (row = key channel). Per token: decay rows, read u = k.S from
    the decayed state, delta write, output from the updated state.
    Returns (out [T,H,Dv], final state)."""
    T, H, Dk = k.shape
    Dv = v.shape[-1]
    S = torch.zeros(H, Dk, Dv, dtype=F64) if state is None else state.clone()
    out = torch.empty(T, H, Dv, dtype=F64)
    for t in range(T):
        S = alpha[t].unsqueeze(-1) * S                                  # 1. decay rows
        u = torch.einsum("hi,hij->hj", k[t], S)                          # 2. read
        S = S + k[t].unsqueeze(-1) * (beta[t].reshape(H, 1, 1)
                                      * (v[t] - u).unsqueeze(1))         # 3. delta write
        out[t] = torch.einsum("hi,hij->hj", q[t] * q_scale, S)           # 4. output
    return out, S


@dataclass
class KDAState:
    S: torch.Tensor  # [H, D, D]
    conv_q: torch.Tensor  # [C, K-1] pre-conv history, oldest first
    conv_k: torch.Tensor
    conv_v: torch.Tensor

    @staticmethod
    def zeros(H: int, D: int, K: int) -> "KDAState":
        C = H * D
        z = lambda: torch.zeros(C, K - 1, dtype=F64)  # noqa: E731
        return KDAState(torch.zeros(H, D, D, dtype=F64), z(), z(), z())

    def clone(self) -> "KDAState":
        return KDAState(self.S.clone(), self.conv_q.clone(), self.conv_k.clone(), self.conv_v.clone())


# Canonical KDA weight keys: q_proj k_proj v_proj g_proj o_proj b_proj f_a f_b
# q_conv k_conv v_conv A_log dt_bias o_norm  (checkpoint names: README §4).

def kda_layer(x: torch.Tensor, w: dict, num_heads: int, head_dim: int, g_min: float,
              rms_eps: float, state: Optional[KDAState] = None) -> Tuple[torch.Tensor, KDAState]:
    """Whole KDA block on the already-normed input x [T, E] (§6.3 steps 1-9)."""
    H, D = num_heads, head_dim
    T = x.shape[0]
    K = conv_weight_2d(w["q_conv"]).shape[1]
    st = KDAState.zeros(H, D, K) if state is None else state
    # 1-2: projections and causal short conv with carried history.
    q, hq = shortconv(linear(x, w["q_proj"]), w["q_conv"], st.conv_q)
    k, hk = shortconv(linear(x, w["k_proj"]), w["k_conv"], st.conv_k)
    v, hv = shortconv(linear(x, w["v_proj"]), w["v_conv"], st.conv_v)
    # 3-4: heads (channel c = h*D + d), L2-normalise q and k only.
    q = l2norm(q.reshape(T, H, D))
    k = l2norm(k.reshape(T, H, D))
    v = v.reshape(T, H, D)
    # 5: write strength, one per head.
    beta = torch.sigmoid(linear(x, w["b_proj"]))  # [T, H]
    # 6: decay gate.
    z = linear(linear(x, w["f_a"]), w["f_b"])
    _, alpha = kda_decay(z, w["A_log"], w["dt_bias"], g_min, H)
    # 7: recurrence.
    o, S = kda_recurrence(q, k, v, alpha, beta, 1.0 / math.sqrt(D), st.S)
    # 8: head-wise RMSNorm (shared gain), then the sigmoid gate on W_g x.
    o = rmsnorm(o, w["o_norm"], rms_eps).reshape(T, H * D)
    y = o * torch.sigmoid(linear(x, w["g_proj"]))
    # 9: output projection.
    return linear(y, w["o_proj"]), KDAState(S, hq, hk, hv)


# ---------------------------------------------------------------------------------------------
# §6.4 gated NoPE MLA

@dataclass
class MLACache:
    c: torch.Tensor  # [N, kv_lora] normalised latent per past position
    r: torch.Tensor  # [N, rope] raw (never rotated) rope-slot key per past position

    @staticmethod
    def empty(kv_lora: int, rope: int) -> "MLACache":
        return MLACache(torch.zeros(0, kv_lora, dtype=F64), torch.zeros(0, rope, dtype=F64))

    def clone(self) -> "MLACache":
        return MLACache(self.c.clone(), self.r.clone())


# Canonical MLA weight keys: q_a_proj q_a_layernorm q_b_proj kv_a_proj_with_mqa
# kv_a_layernorm kv_b_proj o_proj g_proj (g_proj absent when the output gate is off).

def mla(x: torch.Tensor, w: dict, num_heads: int, qk_nope: int, qk_rope: int, v_head: int,
        kv_lora: int, cache: Optional[MLACache] = None, eps_lowrank: float = MLA_LOWRANK_EPS,
        use_output_gate: bool = True) -> Tuple[torch.Tensor, MLACache]:
    """MLA for T new tokens at positions N0..N0+T-1, N0 = cache length (§6.4).

    Expanded formulation (k/v re-expanded from the cached latent each call). Token t attends
    over cache positions 0..N0+t. Softmax scale 1/sqrt(qk_nope + qk_rope)."""
    H, dn, dr, dv = num_heads, qk_nope, qk_rope, v_head
    T = x.shape[0]
    cache = MLACache.empty(kv_lora, dr) if cache is None else cache
    N0 = cache.c.shape[0]
    # 1. queries through the low-rank path.
    cq = rmsnorm(linear(x, w["q_a_proj"]), w["q_a_layernorm"], eps_lowrank)
    q = linear(cq, w["q_b_proj"]).reshape(T, H, dn + dr)
    q_n, q_r = q[..., :dn], q[..., dn:]
    # 2. latent + shared rope-slot key; append to the cache.
    kv = linear(x, w["kv_a_proj_with_mqa"])
    c_new = rmsnorm(kv[:, :kv_lora], w["kv_a_layernorm"], eps_lowrank)
    r_new = kv[:, kv_lora:]
    cache = MLACache(torch.cat([cache.c, c_new], 0), torch.cat([cache.r, r_new], 0))
    N = N0 + T
    # 3. per-head up-projections: rows h*(dn+dv) .. : first dn = W_UK,h, next dv = W_UV,h.
    wkv = w["kv_b_proj"].reshape(H, dn + dv, kv_lora)
    k_n = torch.einsum("hjc,sc->shj", wkv[:, :dn], cache.c)  # [N, H, dn]
    v_all = torch.einsum("hjc,sc->shj", wkv[:, dn:], cache.c)  # [N, H, dv]
    # 4-5. scores over all cached positions, causal mask, softmax.
    scale = 1.0 / math.sqrt(dn + dr)
    scores = (torch.einsum("thj,shj->ths", q_n, k_n)
              + torch.einsum("thj,sj->ths", q_r, cache.r)) * scale  # [T, H, N]
    pos = torch.arange(N).reshape(1, 1, N)
    limit = (N0 + torch.arange(T)).reshape(T, 1, 1)
    scores = scores.masked_fill(pos > limit, float("-inf"))
    pi = softmax(scores, dim=-1)
    # 6. weighted values.
    o = torch.einsum("ths,shj->thj", pi, v_all).reshape(T, H * dv)
    # 7. sigmoid output gate (no norm), output projection.
    if use_output_gate:
        o = o * torch.sigmoid(linear(x, w["g_proj"]))
    return linear(o, w["o_proj"]), cache


# ---------------------------------------------------------------------------------------------
# §6.5 / §6.6 FFNs

def dense_mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
              beta1: float, beta2: Optional[float]) -> torch.Tensor:
    return linear(situ_glu(linear(x, gate), linear(x, up), beta1, beta2), down)


def router(x: torch.Tensor, gate_w: torch.Tensor, bias: torch.Tensor, top_k: int,
           renormalize: bool, scaling: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sigmoid router (§6.6 steps 1-3, D5). Selection by the biased score c = sigmoid(l) + bias,
    sorted by decreasing c with ties to the lower expert index; weights from the UNbiased
    sigmoid, renormalised (+1e-20) only when renormalize and k > 1, then scaled.
    Returns (ids [T,k] int64, weights [T,k] float64)."""
    s = torch.sigmoid(linear(x, gate_w))  # [T, Ne]
    c = s + bias
    T = x.shape[0]
    idx = torch.empty(T, top_k, dtype=torch.int64)
    for t in range(T):
        order = sorted(range(c.shape[1]), key=lambda e: (-float(c[t, e]), e))
        idx[t] = torch.tensor(order[:top_k], dtype=torch.int64)
    wts = torch.gather(s, 1, idx)
    if renormalize and top_k > 1:
        wts = wts / (wts.sum(dim=1, keepdim=True) + ROUTER_RENORM_EPS)
    return idx, wts * scaling


# Canonical MoE weight keys: gate e_score_correction_bias down up norm (optional)
# shared_gate shared_up shared_down (absent when num_shared_experts == 0).
ExpertFn = Callable[[int], Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # e -> (w1, w2, w3)


def moe(x: torch.Tensor, w: dict, experts: ExpertFn, top_k: int, renormalize: bool,
        scaling: float, use_latent_norm: bool, rms_eps: float, beta1: float,
        beta2: Optional[float], return_routing: bool = False):
    """Stable latent MoE on the normed FFN input x [T, E] (§6.6).

    Routed experts run in the latent space, in selection order, their weighted outputs summed
    into one latent u; u is RMS-normalised ONCE (not per expert), projected up, and the
    unweighted shared expert on the full-width x is added."""
    idx, wts = router(x, w["gate"], w["e_score_correction_bias"], top_k, renormalize, scaling)
    u_in = linear(x, w["down"])  # [T, latent]
    T = x.shape[0]
    u = torch.zeros_like(u_in)
    for t in range(T):
        acc = torch.zeros(u_in.shape[1], dtype=F64)
        for j in range(top_k):
            w1, w2, w3 = experts(int(idx[t, j]))
            a = situ_glu(linear(u_in[t], w1), linear(u_in[t], w3), beta1, beta2)
            acc = acc + wts[t, j] * linear(a, w2)
        u[t] = acc
    if use_latent_norm:
        u = rmsnorm(u, w["norm"], rms_eps)
    y = linear(u, w["up"])
    if "shared_gate" in w:
        y = y + dense_mlp(x, w["shared_gate"], w["shared_up"], w["shared_down"], beta1, beta2)
    return (y, idx, wts) if return_routing else y


def experts_from_list(w1: List[torch.Tensor], w2: List[torch.Tensor], w3: List[torch.Tensor]) -> ExpertFn:
    return lambda e: (w1[e], w2[e], w3[e])

"""The float64 reference against shared/conformance (README there: §2 tolerances, §4 key
mapping, §5 per-op rules, §6 MXFP4, §9 configs).

The conformance directory is ../shared/conformance relative to the repository root, or
$KTIER_CONFORMANCE_DIR. A missing directory FAILS every test here (never a silent skip).
Each check records its worst ratio; the table is printed at the end of the run. The README's
measured float64 margin is printed next to ours ("README f64 ...") and must be ours to the digits
the README gives (expect_readme_margin: it was measured by a float64 implementation too, and a
misreading that still passes the tolerance lands elsewhere).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from k3ref.config import ConfigError, load_config, parse_config
from k3ref.model import LayerWeights, decoder_layer
from k3ref.mxfp4 import dequant_mxfp4
from k3ref.ops import (as64, attnres, conv_weight_2d, fold_res, kda_decay,
                       kda_layer, kda_recurrence, mla, moe, rmsnorm, router, shortconv, situ_glu)

ATOL, RTOL = 1e-5, 1e-4  # MANIFEST tolerance (re-read and checked below)

EXPECTED_OPS = {"MANIFEST.json", "attnres.json", "kda_decay.json", "kda_layer1.json",
                "kda_layer8.json", "kda_recur1.json", "kda_recur8.json", "layer_kda.json",
                "layer_mla.json", "mla.json", "moe.json", "rmsnorm.json", "router.json",
                "shortconv.json", "situ_glu.json"}


def conformance_dir() -> Path:
    # The user's variable first (as the GoogleTest cases read it), then the folder CTest was
    # configured with (-DKTIER_CONFORMANCE_DIR), then the one beside the checkout.
    for name in ("KTIER_CONFORMANCE_DIR", "KTIER_CONFIGURED_CONFORMANCE_DIR"):
        env = os.environ.get(name)
        if env:
            return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "conformance"


@pytest.fixture(scope="module")
def conf() -> Path:
    d = conformance_dir()
    if not (d / "ops" / "MANIFEST.json").is_file():
        pytest.fail(f"conformance directory not found at {d} (set KTIER_CONFORMANCE_DIR); "
                    f"these tests must not be skipped", pytrace=False)
    return d


_cache = {}


def load_case(conf: Path, name: str) -> dict:
    p = conf / "ops" / name if not name.startswith("/") else Path(name)
    if p not in _cache:
        with open(p) as f:
            _cache[p] = json.load(f)
    return _cache[p]


class Case:
    """Accessor: tensors as float64 torch (dropping a leading batch-of-one axis if asked)."""

    def __init__(self, d: dict):
        self.d = d

    def t(self, key: str, squeeze0: bool = False) -> torch.Tensor:
        v = self.d[key]
        a = torch.tensor(v["data"], dtype=torch.float64).reshape(v["shape"])
        if squeeze0:
            assert a.shape[0] == 1, (key, a.shape)
            a = a[0]
        return a

    def __getitem__(self, k):
        return self.d[k]


@pytest.fixture(scope="module")
def cfg(conf):
    return parse_config(load_case(conf, "MANIFEST.json")["config"])


def ratio(got, want, atol=ATOL, rtol=RTOL) -> float:
    got, want = as64(got), as64(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(((got - want).abs() / (atol + rtol * want.abs())).max())


def expect_readme_margin(case, what, r, readme: str):
    """The README's float64 figure, as written there ("0.50"), is ours to its digits: within half
    a unit of its last digit, plus 1 % for the README's own float64 run (kda_layer8: 0.4948 here,
    "0.50" there)."""
    half_unit = 0.5 * 10.0 ** -len(readme.split(".")[1])
    assert abs(r - float(readme)) <= half_unit + 0.01 * float(readme), \
        f"{case} {what}: worst ratio {r:.4g} is not the README's float64 margin {readme}"


def check(report, case, what, got, want, readme: str | None = None, atol=ATOL, rtol=RTOL):
    r = ratio(got, want, atol, rtol)
    report(case, what, r, "" if readme is None else f"README f64 {readme}")
    assert r <= 1.0, f"{case} {what}: worst ratio {r:.3g} > 1"
    if readme is not None:
        expect_readme_margin(case, what, r, readme)
    return r


# ---------------------------------------------------------------------------------------------

def test_fixture_inventory(conf):
    """Every ops/*.json is exercised by a test below; a new fixture must get one."""
    present = {p.name for p in (conf / "ops").glob("*.json")}
    assert present == EXPECTED_OPS, f"ops/ changed: new {present - EXPECTED_OPS}, gone {EXPECTED_OPS - present}"
    tol = load_case(conf, "MANIFEST.json")["tolerance"]
    assert tol == {"fp32_abs": ATOL, "fp32_rel": RTOL}


def test_files_are_the_readme_copies(conf):
    """README: the files are byte-for-byte copies, listed with their SHA-256 (an edited or
    regenerated copy, or a directory from elsewhere, is not the reference)."""
    listed = re.findall(r"^([0-9a-f]{64})  (\S+)$", (conf / "README.md").read_text(), re.M)
    assert len(listed) >= 23, f"the README's SHA-256 list has {len(listed)} files"
    for digest, name in listed:
        assert hashlib.sha256((conf / name).read_bytes()).hexdigest() == digest, name
    present = {str(p.relative_to(conf)) for p in conf.rglob("*") if p.is_file()} - {"README.md"}
    assert present == {name for _, name in listed}


def test_manifest_config_flat(conf):
    c = parse_config(load_case(conf, "MANIFEST.json")["config"])
    assert c.shape == "flat"
    want = dict(hidden_size=128, num_hidden_layers=13, vocab_size=256, rms_norm_eps=1e-5,
                kda_num_heads=4, kda_head_dim=16, short_conv_kernel_size=4, gate_lower_bound=-5.0,
                num_attention_heads=4, q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=24,
                qk_rope_head_dim=8, v_head_dim=16, mla_use_output_gate=True, num_experts=8,
                num_experts_per_token=2, num_shared_experts=2, routed_expert_hidden_size=64,
                moe_intermediate_size=48, routed_scaling_factor=1.0, moe_renormalize=True,
                latent_moe_use_norm=True, first_k_dense_replace=1, intermediate_size=96,
                attn_res_block_size=3, situ_beta=4.0, situ_linear_beta=25.0,
                full_attn_layers=[4, 8, 12, 13])
    for k, v in want.items():
        assert getattr(c, k) == v, (k, getattr(c, k), v)
    assert c.layer_map() == "KKKMKKKMKKKMM"
    assert [l for l in range(13) if c.is_boundary(l)] == [0, 3, 6, 9, 12]
    assert [l for l in range(13) if c.is_dense(l)] == [0]


@pytest.mark.parametrize("name,needles", [
    ("bad_layer_index.json", ["full_attn_layers", "999"]),
    ("bad_topk.json", ["num_experts_per_token", "128"]),
    ("no_layermap.json", ["full_attn_layers", "missing"]),
])
def test_bad_configs_rejected(conf, name, needles):
    with pytest.raises(ConfigError) as ei:
        load_config(str(conf / "cfg" / name))
    msg = str(ei.value)
    for n in needles:
        assert n in msg, f"{name}: rejection does not name the defect: {msg}"


def test_rmsnorm(conf, report):
    c = Case(load_case(conf, "rmsnorm.json"))
    check(report, "rmsnorm", "out", rmsnorm(c.t("in"), c.t("weight"), c["eps"]), c.t("out"), "0.006")


def test_situ_glu(conf, report, cfg):
    c = Case(load_case(conf, "situ_glu.json"))
    x = c.t("in")
    got = situ_glu(x[:, :8], x[:, 8:], c["beta"], c["linear_beta"])
    check(report, "situ_glu", "out", got, c.t("out"), "0.003")
    assert float(got.abs().max()) <= c["max_abs"] * (1 + 1e-12)
    assert (c["beta"], c["linear_beta"]) == (cfg.situ_beta, cfg.situ_linear_beta)


def test_shortconv(conf, report):
    c = Case(load_case(conf, "shortconv.json"))
    w = c.t("weight")
    out, hist = shortconv(c.t("in", True), w, None)
    check(report, "shortconv", "out", out, c.t("out", True), "0.006")
    want_hist = c.t("state_after", True)  # [C, K-1], oldest first
    assert torch.equal(hist, want_hist), "state_after must be an exact copy of the last 3 inputs"
    report("shortconv", "state_after (exact)", 0.0, "exact")
    out2, _ = shortconv(c.t("in_next", True), w, hist)
    check(report, "shortconv", "out_next", out2, c.t("out_next", True), "0.005")


def test_kda_decay(conf, report):
    c = Case(load_case(conf, "kda_decay.json"))
    z = c.t("z", True)  # [4 tokens, 64]
    g, alpha = kda_decay(z, c.t("A_log"), c.t("dt_bias"), c["lower_bound"], 4)
    for name, got in (("g", g), ("alpha", alpha)):
        want = c.t(name, True)
        m = float((got - want).abs().max())
        readme = "0.053" if name == "g" else "0.011"
        report("kda_decay", f"{name} max|d|/1e-5", m / 1e-5, "README f64 " + readme)
        assert m <= 1e-5, f"kda_decay {name}: max abs {m:.3g}"
        expect_readme_margin("kda_decay", name, m / 1e-5, readme)
    assert int((alpha == 1.0).sum()) == c["n_alpha_saturated_at_1"]
    assert alpha.numel() == c["n_alpha_total"]


@pytest.mark.parametrize("name,margin", [("kda_recur1.json", "0.006"), ("kda_recur8.json", "0.047")])
def test_kda_recurrence(conf, report, name, margin):
    c = Case(load_case(conf, name))
    out, S = kda_recurrence(c.t("q"), c.t("k"), c.t("v"), c.t("alpha"), c.t("beta"), c["q_scale"])
    case = name[:-5]
    check(report, case, "out", out, c.t("out"), margin)
    check(report, case, "state_out", S, c.t("state_out"))


def kda_weights(c: Case) -> dict:
    w = {k: c.t(k) for k in ("q_proj", "k_proj", "v_proj", "g_proj", "o_proj", "b_proj", "f_a", "f_b",
                             "A_log", "dt_bias", "o_norm")}
    for k in ("q_conv", "k_conv", "v_conv"):
        w[k] = conv_weight_2d(c.t(k))
    return w


@pytest.mark.parametrize("name,margin", [("kda_layer1.json", "0.016"), ("kda_layer8.json", "0.50")])
def test_kda_layer(conf, report, name, margin):
    c = Case(load_case(conf, name))
    w = kda_weights(c)
    x = c.t("in", True)
    H, D = c["H"], c["d_k"]
    out, st = kda_layer(x, w, H, D, c["lower_bound"], c["rms_eps"])
    case = name[:-5]
    check(report, case, "out", out, c.t("out", True), margin)
    check(report, case, "state_out", st.S, c.t("state_out", True))
    if c["T"] > 1:
        # Self-check (README §5.6): one token at a time, carrying S and the conv history.
        s = None
        outs = []
        for t in range(c["T"]):
            o, s = kda_layer(x[t:t + 1], w, H, D, c["lower_bound"], c["rms_eps"], s)
            outs.append(o)
        inc = torch.cat(outs)
        check(report, case, "out (token by token)", inc, c.t("out", True), margin)
        d = float((inc - out).abs().max() / out.abs().max())
        report(case, "incremental vs batched (rel, x1e12)", d * 1e12, "float64 rounding only")
        assert d <= 1e-12
        assert float((s.S - st.S).abs().max()) <= 1e-12


def test_router(conf, report, cfg):
    c = Case(load_case(conf, "router.json"))
    idx, wts = router(c.t("in"), c.t("gate_weight"), c.t("bias"), c["top_k"], cfg.moe_renormalize,
                      cfg.routed_scaling_factor)
    want_idx = c.t("topk_idx").to(torch.int64)
    want_w = c.t("topk_weight")
    worst = 0.0
    for r in range(idx.shape[0]):
        assert set(idx[r].tolist()) == set(want_idx[r].tolist()), f"row {r}: selected sets differ"
        for j, e in enumerate(idx[r].tolist()):
            jj = want_idx[r].tolist().index(e)
            worst = max(worst, ratio(wts[r, j:j + 1], want_w[r, jj:jj + 1]))
    report("router", "weights by id", worst, "README f64 0.002")
    assert worst <= 1.0
    expect_readme_margin("router", "weights by id", worst, "0.002")
    # The bias must matter: selection without it differs in 5 of 6 rows.
    idx0, _ = router(c.t("in"), c.t("gate_weight"), 0 * c.t("bias"), c["top_k"], True, 1.0)
    changed = sum(set(idx0[r].tolist()) != set(idx[r].tolist()) for r in range(idx.shape[0]))
    assert changed == c["rows_where_bias_changed_selection"]


def test_attnres(conf, report, cfg):
    c = Case(load_case(conf, "attnres.json"))
    bank = c.t("block_residual")  # [4, 8, 128]
    Pp = c.t("prefix_sum")
    srcs = [bank[:, i] for i in range(bank.shape[1])] + [Pp]
    assert len(srcs) == c["n_sources"]
    f = fold_res(c.t("norm_weight"), c.t("proj_weight"))
    check(report, "attnres", "out (f computed)", attnres(srcs, f, c["eps"]), c.t("out"), "0.025")
    check(report, "attnres", "out (fold_hint)", attnres(srcs, c.t("fold_hint"), c["eps"]), c.t("out"), "0.025")


def mla_weights(c: Case, prefix: str = "", suffix: str = "_weight") -> dict:
    keys = ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm",
            "kv_b_proj", "o_proj", "g_proj")
    return {k: c.t(prefix + k + suffix) for k in keys}


def test_mla(conf, report, cfg):
    c = Case(load_case(conf, "mla.json"))
    w = mla_weights(c)
    x = c.t("in", True)
    args = (c["n_heads"], c["qk_nope"], c["qk_rope"], c["v_head"], c["kv_lora"])
    assert math.isclose(c["scale"], 1 / math.sqrt(c["qk_nope"] + c["qk_rope"]), rel_tol=1e-12)
    out, cache = mla(x, w, *args)  # eps_lowrank = 1e-6 (D2)
    check(report, "mla", "out (eps_lr 1e-6, D2)", out, c.t("out", True), "0.12")
    check(report, "mla", "kv_latent", cache.c, c.t("kv_latent", True))
    check(report, "mla", "k_rope", cache.r, c.t("k_rope", True))
    out5, _ = mla(x, w, *args, eps_lowrank=c["rms_eps"])
    check(report, "mla", "out (eps_lr 1e-5, generator's)", out5, c.t("out", True), "0.09")
    # Self-check: prefill 3 positions, then 3 single decode steps through the cache.
    o1, cache = mla(x[:3], w, *args)
    outs = [o1]
    for t in range(3, 6):
        o, cache = mla(x[t:t + 1], w, *args, cache=cache)
        outs.append(o)
    inc = torch.cat(outs)
    check(report, "mla", "out (prefill 3 + decode 3)", inc, c.t("out", True), "0.12")
    d = float((inc - out).abs().max() / out.abs().max())
    report("mla", "incremental vs batched (rel, x1e12)", d * 1e12, "float64 rounding only")
    assert d <= 1e-12


def moe_weights(c: Case, p: str = ""):
    w = {"gate": c.t(p + "gate_weight"), "e_score_correction_bias": c.t(p + "e_score_correction_bias"),
         "down": c.t(p + "down_weight"), "up": c.t(p + "up_weight"), "norm": c.t(p + "norm_weight"),
         "shared_gate": c.t(p + "shared_w1_weight"), "shared_up": c.t(p + "shared_w3_weight"),
         "shared_down": c.t(p + "shared_w2_weight")}
    n = 0
    while f"{p}experts_{n}_w1_weight" in c.d:
        n += 1
    ex = [(c.t(f"{p}experts_{e}_w1_weight"), c.t(f"{p}experts_{e}_w2_weight"),
           c.t(f"{p}experts_{e}_w3_weight")) for e in range(n)]
    return w, (lambda e: ex[e]), n


def test_moe(conf, report):
    c = Case(load_case(conf, "moe.json"))
    w, experts, n = moe_weights(c)
    assert n == c["n_experts"]
    got = moe(c.t("in", True), w, experts, c["top_k"], bool(c["renorm"]), c["routed_scale"],
              bool(c["latent_norm"]), c["rms_eps"], c["situ_b1"], c["situ_b2"])
    want = c.t("out", True)
    strict = ratio(got, want)
    report("moe", "out, strict manifest rule", strict, "KNOWN DEVIATION (README: f64 1.15, §5.11)")
    scaled_atol = ATOL * max(1.0, float(want.abs().max()))
    check(report, "moe", "out, scaled rule §5.11", got, want, "0.016", atol=scaled_atol)


def layer_weights(c: Case, cfg) -> LayerWeights:
    l = c["layer_idx"]
    if c["is_mla"]:
        attn = mla_weights(c, "self_attn_")
    else:
        attn = {k: c.t("self_attn_" + k + "_weight") for k in
                ("q_proj", "k_proj", "v_proj", "g_proj", "o_proj", "b_proj", "o_norm")}
        attn.update(f_a=c.t("self_attn_f_a_proj_weight"), f_b=c.t("self_attn_f_b_proj_weight"),
                    A_log=c.t("self_attn_A_log"), dt_bias=c.t("self_attn_dt_bias"))
        for k in ("q", "k", "v"):
            attn[k + "_conv"] = conv_weight_2d(c.t(f"self_attn_{k}_conv1d_weight"))
    ffn, experts, n = moe_weights(c, "mlp_")
    assert n == cfg.num_experts
    return LayerWeights(
        is_mla=cfg.is_mla(l), is_dense=cfg.is_dense(l),
        input_layernorm=c.t("input_layernorm_weight"),
        post_attention_layernorm=c.t("post_attention_layernorm_weight"),
        f_attn=fold_res(c.t("self_attention_res_norm_weight"), c.t("self_attention_res_proj_weight")),
        f_mlp=fold_res(c.t("mlp_res_norm_weight"), c.t("mlp_res_proj_weight")),
        attn=attn, ffn=ffn, experts=experts)


@pytest.mark.parametrize("name,margin", [("layer_kda.json", "0.46"), ("layer_mla.json", "0.21")])
def test_decoder_layer(conf, report, cfg, name, margin):
    c = Case(load_case(conf, name))
    l = c["layer_idx"]
    assert cfg.is_mla(l) == c["is_mla"] and c["attn_res_block_size"] == cfg.attn_res_block_size
    lw = layer_weights(c, cfg)
    P_in = c.t("in", True)
    bank_in = c.t("block_residual_in")  # [T, m, E], token-major
    bank = [bank_in[:, i] for i in range(bank_in.shape[1])]
    P_out, bank_out, _ = decoder_layer(P_in, bank, lw, cfg, l, None)
    case = name[:-5]
    check(report, case, "out (P)", P_out, c.t("out", True), margin)
    want_bank = c.t("block_residual_out")
    got_bank = torch.stack(bank_out, dim=1)
    assert got_bank.shape == want_bank.shape
    # Bank entries are copies, never arithmetic: exact.
    assert torch.equal(got_bank, want_bank), "block_residual_out must match exactly"
    if cfg.is_boundary(l):
        assert torch.equal(got_bank[:, -1], P_in), "boundary: pushed entry must equal the incoming P"
    report(case, "block_residual_out (exact)", 0.0, "exact")
    # The layer run token by token (state carried) must give the same P.
    st, outs = None, []
    for t in range(P_in.shape[0]):
        o, _, st = decoder_layer(P_in[t:t + 1], [b[t:t + 1] for b in bank], lw, cfg, l, st)
        outs.append(o)
    d = float((torch.cat(outs) - P_out).abs().max() / P_out.abs().max())
    report(case, "incremental vs batched (rel, x1e12)", d * 1e12, "float64 rounding only")
    assert d <= 1e-12


def test_mxfp4_real_bytes(conf, report):
    with open(conf / "mxfp4.json") as f:
        m = json.load(f)
    packed = np.array(m["packed"]["data"], dtype=np.uint8).reshape(m["packed"]["shape"])
    scales = np.array(m["scales"]["data"], dtype=np.uint8).reshape(m["scales"]["shape"])
    assert packed.shape == (m["rows"], m["packed_cols"]) and scales.shape == (m["rows"], m["scale_cols"])
    got = dequant_mxfp4(packed, scales).astype(np.float32)
    want = np.array(m["expected"]["data"], dtype=np.float64).reshape(m["expected"]["shape"])
    want32 = want.astype(np.float32)
    assert np.array_equal(want32.astype(np.float64), want), "expected values must be exact in f32"
    assert got.shape == (m["rows"], m["logical_width"])
    nbad = int((got.view(np.uint32) != want32.view(np.uint32)).sum())
    assert nbad == 0, f"{nbad} dequantised values differ bitwise (incl. -0.0 vs +0.0)"
    assert int(np.signbit(want32[want32 == 0]).sum()) > 0, "fixture should contain -0.0"
    swapped = np.array(m["expected_swapped_nibbles"]["first64"], dtype=np.float64).astype(np.float32)
    assert not np.array_equal(got[0, :64].view(np.uint32), swapped.view(np.uint32)), \
        "row 0 equals the swapped-nibble decoding: nibble order is wrong"
    # The worked example of K3-MODEL §7.2.
    assert packed[0, 0] == 0x16 and scales[0, 0] == 121
    assert got[0, 0] == np.float32(0.0625) and got[0, 1] == np.float32(0.0078125)
    assert list(m["e2m1_lut"]) == [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
    report("mxfp4", "bit-exact f32 (mismatches)", float(nbad), "exact")


# ---------------------------------------------------------------------------------------------
# st/ and cache/: the reference's own safetensors parser against README §7, §8


def test_st_edge_cases(conf):
    from k3ref.safetensors_io import SafeTensorsFile
    a = SafeTensorsFile(str(conf / "st" / "model-00001-of-00002.safetensors"))
    b = SafeTensorsFile(str(conf / "st" / "model-00002-of-00002.safetensors"))
    assert (a.file_size, a.header_len, a.data_start) == (2906, 1022, 1030)
    assert (b.file_size, b.header_len, b.data_start) == (973, 253, 261)
    assert isinstance(a.metadata, dict) and a.metadata.get("format") == "pt" and b.metadata is None
    E = "language_model.model.layers.0.block_sparse_moe.experts."
    want_a = {
        "plain.f32.2d": ("F32", (16, 16), 1030, 1024), "plain.bf16.1d": ("BF16", (128,), 2054, 256),
        "tricky.f16.1d": ("F16", (64,), 2310, 128), "packed.u8.2d": ("U8", (7, 32), 2438, 224),
        "scalar.f32": ("F32", (), 2662, 4), "empty.f32": ("F32", (0, 8), 2666, 0),
        E + "0.w1.weight_packed": ("U8", (2, 32), 2666, 64),
        E + "1.w1.weight_packed": ("U8", (2, 32), 2730, 64),
        "rank3.f32": ("F32", (2, 3, 4), 2794, 96), "rank4.u8": ("U8", (2, 2, 2, 2), 2890, 16),
    }
    weird = 'weird\\name."with"quotes'
    assert len(weird) == 23
    want_b = {"second.shard.f32": ("F32", (10, 10), 261, 400), "second.shard.u8": ("U8", (300,), 661, 300),
              weird: ("F32", (3,), 961, 12)}
    for st, want in ((a, want_a), (b, want_b)):
        assert set(st.keys()) == set(want)
        for n, (dt, shape, off, nb) in want.items():
            i = st.info(n)
            assert (i.dtype, i.shape, i.abs_offset, i.nbytes) == (dt, shape, off, nb), n
            assert st.numpy(n).shape == shape
    assert float(a.numpy("scalar.f32")) == 3.5
    assert b.numpy(weird).tolist() == [1.0, 2.0, 3.0]
    assert a.numpy("empty.f32").size == 0
    # BF16 widening: exactly bits << 16 (inf, -inf, NaN, +0, -0, smallest normal first).
    raw = np.frombuffer(a.raw_bytes("plain.bf16.1d"), dtype="<u2")
    assert raw[:6].tolist() == [0x7F80, 0xFF80, 0x7FC0, 0x0000, 0x8000, 0x0080]
    assert np.array_equal(a.numpy("plain.bf16.1d").view(np.uint32), raw.astype(np.uint32) << 16)
    # F16 widening exact, incl. subnormals, inf, NaN, signed zero.
    h = a.numpy("tricky.f16.1d")
    assert h[0] == np.inf and h[1] == -np.inf and np.isnan(h[2])
    assert h[3] == 0 and not np.signbit(h[3]) and h[4] == 0 and np.signbit(h[4])
    assert h[5] == np.float32(2.0 ** -24) and h[6] == np.float32(1023 * 2.0 ** -24) and h[7] == np.float32(2.0 ** -14)
    # Raw payloads agree with an independent direct read at the tabled offsets.
    with open(a.path, "rb") as f:
        blob = f.read()
    assert np.array_equal(a.numpy("plain.f32.2d").ravel(), np.frombuffer(blob[1030:2054], dtype="<f4"))
    assert np.array_equal(a.numpy("rank4.u8").ravel(), np.frombuffer(blob[2890:2906], dtype=np.uint8))


def test_cache_shard_layout(conf):
    from k3ref.safetensors_io import SafeTensorsFile
    st = SafeTensorsFile(str(conf / "cache" / "model-00001-of-00001.safetensors"))
    assert (st.file_size, st.header_len, st.data_start) == (59776, 20600, 20608)
    assert len(st.keys()) == 144
    for e in range(24):
        run = 20608 + 1632 * e
        for wi, w in enumerate(("w1", "w2", "w3")):
            for kind, rel_off, shape, add in (("packed", 544 * wi, (8, 64), 0),
                                              ("scale", 544 * wi + 512, (8, 4), 7)):
                n = f"language_model.model.layers.0.block_sparse_moe.experts.{e}.{w}.weight_{kind}"
                i = st.info(n)
                assert i.abs_offset == run + rel_off and i.shape == shape
                base = (977 * e + 31 * wi + add) % 256
                k = np.arange(i.nbytes)
                assert np.array_equal(st.numpy(n).ravel(), ((k + base) % 251).astype(np.uint8)), n

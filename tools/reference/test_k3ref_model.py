"""Whole-model tests on tiny checkpoints written by tests_support/tiny_ckpt.py (written apart
from ``ktier synth``): loading in the released layout, incremental decode == full forward,
MXFP4 == plain-float experts of the same values, config shapes, loader refusals, and
make_golden end to end."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil

import numpy as np
import pytest
import torch

import make_golden
from k3ref import ConfigError, load_model, parse_config
from k3ref.model import WeightError, argmax_lowest
from k3ref.safetensors_io import SafeTensorsError
from tests_support.tiny_ckpt import (TINY_FLAT, TINY_FLAT_MXFP4, nested_config, write_checkpoint,
                                     write_safetensors)

PROMPT = [17, 42, 1, 99, 128, 7, 200, 63, 150, 31, 222, 88]


@pytest.fixture(scope="module")
def ckpt_mxfp4(tmp_path_factory):
    return write_checkpoint(str(tmp_path_factory.mktemp("mxfp4")), experts="mxfp4", seed=1)


@pytest.fixture(scope="module")
def model(ckpt_mxfp4):
    return load_model(ckpt_mxfp4)


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def test_loads_released_layout(model, ckpt_mxfp4):
    c = model.cfg
    assert c.shape == "nested"
    assert c.layer_map() == "KKKMKKKMKKKMM"
    # D6: the bogus text_config.head_dim (=32) must not be taken as the KDA head dim.
    assert c.kda_head_dim == 16 and c.kda_num_heads == 4
    assert model.w.experts_packed is True
    shards = sorted(f for f in os.listdir(ckpt_mxfp4) if f.endswith(".safetensors"))
    assert shards[0] == "model-00001-of-000014.safetensors" and len(shards) == 14


def test_incremental_equals_full(model, report):
    full = model.forward(PROMPT)
    assert full.shape == (len(PROMPT), 256) and bool(torch.isfinite(full).all())
    # token by token
    st = model.new_state()
    inc = torch.stack([model.step(t, st) for t in PROMPT])
    assert st.n == len(PROMPT)
    r1 = rel(inc, full)
    # prefill 5, then decode
    st = model.new_state()
    part = [model.forward(PROMPT[:5], st)] + [model.step(t, st)[None] for t in PROMPT[5:]]
    r2 = rel(torch.cat(part), full)
    report("tiny model", "token-by-token vs full (rel, x1e9)", r1 * 1e9, "must be <= 1")
    report("tiny model", "prefill 5 + decode vs full (rel, x1e9)", r2 * 1e9, "must be <= 1")
    assert r1 <= 1e-9 and r2 <= 1e-9
    # logits must actually depend on the context (KDA state, MLA cache, conv history).
    alone = model.forward(PROMPT[-1:])
    assert rel(alone[0], full[-1]) > 1e-3


def test_mxfp4_equals_float_experts(model, tmp_path):
    d = write_checkpoint(str(tmp_path / "f"), experts="float", seed=1)
    mf = load_model(d)
    assert mf.w.experts_packed is False
    a, b = model.forward(PROMPT), mf.forward(PROMPT)
    assert torch.equal(a, b), "identical dequantised expert values must give identical logits"


def test_flat_config_same_logits(model, tmp_path, ckpt_mxfp4):
    d = str(tmp_path / "flat")
    shutil.copytree(ckpt_mxfp4, d)
    flat = dict(TINY_FLAT_MXFP4)
    flat["quantization_config"] = nested_config(flat)["text_config"]["quantization_config"]
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(flat, f)
    m2 = load_model(d)
    assert m2.cfg.shape == "flat"
    assert torch.equal(m2.forward(PROMPT[:4]), model.forward(PROMPT[:4]))


def test_config_lookup_rules():
    nested = nested_config(TINY_FLAT)
    c = parse_config(nested)
    assert c.kda_head_dim == 16 and c.moe_intermediate_size == 48
    # A null text_config is an absent one (flat); any other non-object is refused by name.
    assert parse_config(dict(TINY_FLAT, text_config=None)).shape == "flat"
    with pytest.raises(ConfigError, match="text_config is present but not an object"):
        parse_config(dict(TINY_FLAT, text_config=[]))
    # A flat root with bare num_heads/head_dim is not read (ambiguous): kda_* are required.
    flat = dict(TINY_FLAT)
    flat["num_heads"] = flat.pop("kda_num_heads")
    flat["head_dim"] = flat.pop("kda_head_dim")
    with pytest.raises(ConfigError, match="kda_num_heads"):
        parse_config(flat)
    # Nested shape: no fallback from text_config to the KDA object for KDA keys.
    bad = copy.deepcopy(nested)
    bad["text_config"]["num_heads"] = bad["text_config"]["linear_attn_config"].pop("num_heads")
    with pytest.raises(ConfigError, match="num_heads"):
        parse_config(bad)
    # Aliases are flat-only; the released spelling must agree with the alias when both exist.
    both = dict(TINY_FLAT, activation_situ_beta=3.0)
    with pytest.raises(ConfigError, match="disagree"):
        parse_config(both)
    # No defaults for the three switches (D7).
    nob = dict(TINY_FLAT)
    del nob["moe_renormalize"]
    with pytest.raises(ConfigError, match="moe_renormalize"):
        parse_config(nob)
    # Guard field.
    with pytest.raises(ConfigError, match="hidden_act"):
        parse_config(dict(TINY_FLAT, hidden_act="silu"))
    # Explicit null linear beta = uncapped up branch.
    assert parse_config(dict(TINY_FLAT, situ_linear_beta=None)).situ_linear_beta is None


_NP = {"F32": "<f4", "BF16": "<u2", "F16": "<f2", "U8": "u1"}


def _rewrite_tensor(d, name, fn):
    """Rewrite one tensor of a released-layout checkpoint in place (test helper).
    fn receives and returns the stored array (BF16 as uint16 bit patterns)."""
    from k3ref.safetensors_io import SafeTensorsFile
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        shard = json.load(f)["weight_map"][name]
    p = os.path.join(d, shard)
    st = SafeTensorsFile(p)
    tensors = {}
    for n in st.keys():
        info = st.info(n)
        arr = np.frombuffer(st.raw_bytes(n), dtype=_NP[info.dtype]).reshape(info.shape).copy()
        tensors[n] = (info.dtype, fn(arr) if n == name else arr)
    write_safetensors(p, tensors)


def test_loader_refusals(ckpt_mxfp4, tmp_path):
    # A_log with a non-zero tail (D1).
    d = str(tmp_path / "alog")
    shutil.copytree(ckpt_mxfp4, d)

    def poison(a):
        a[-1] = 0.5
        return a
    _rewrite_tensor(d, "language_model.model.layers.0.self_attn.A_log", poison)
    with pytest.raises(WeightError, match="A_log"):
        load_model(d)
    # Index disagreeing with a shard header.
    d2 = str(tmp_path / "idx")
    shutil.copytree(ckpt_mxfp4, d2)
    ip = os.path.join(d2, "model.safetensors.index.json")
    with open(ip) as f:
        idx = json.load(f)
    idx["weight_map"]["language_model.model.norm.weight"] = "model-00001-of-000014.safetensors"
    with open(ip, "w") as f:
        json.dump(idx, f)
    with pytest.raises(SafeTensorsError):
        load_model(d2)
    # Packed experts without a quantization_config.
    d3 = str(tmp_path / "noq")
    shutil.copytree(ckpt_mxfp4, d3)
    cp = os.path.join(d3, "config.json")
    with open(cp) as f:
        cfg = json.load(f)
    del cfg["text_config"]["quantization_config"]
    with open(cp, "w") as f:
        json.dump(cfg, f)
    with pytest.raises(WeightError, match="quantization_config"):
        load_model(d3)


def test_make_golden(ckpt_mxfp4, tmp_path, report):
    out = str(tmp_path / "golden.json")
    make_golden.main([ckpt_mxfp4, out])
    with open(out) as f:
        g = json.load(f)
    assert os.path.getsize(out) < 4 * 1024 * 1024
    assert g["format"] == "k3ref-golden-v1"
    assert g["prompt_ids"] == make_golden.DEFAULT_PROMPT
    for name, digest in g["checkpoint"].items():
        with open(os.path.join(ckpt_mxfp4, name), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == digest
    assert len(g["checkpoint"]) == 14
    T, L, V = 12, 13, 256
    tf = g["teacher_forced"]
    assert len(tf) == T
    for t, row in enumerate(tf):
        assert row["position"] == t and row["input_id"] == g["prompt_ids"][t]
        assert len(row["logits"]) == V
        assert row["argmax"] == argmax_lowest(torch.tensor(row["logits"], dtype=torch.float64))
    assert len(g["greedy"]) == 20 and all(0 <= x < V for x in g["greedy"])
    assert g["greedy"][0] == tf[-1]["argmax"]
    lc = g["layer_checksums"]
    assert (lc["positions"], lc["layers"]) == (T, L)
    assert np.array(lc["sum"]).shape == (T, L) and np.array(lc["abs_sum"]).shape == (T, L)
    assert g["logits_max_abs"] == max(abs(x) for r in tf for x in r["logits"])
    report("make_golden", "incremental vs full max rel (x1e9)",
           g["numerics"]["incremental_vs_full_max_rel"] * 1e9, "asserted <= 1 inside make_golden")
    # The golden must be reproducible from the same bytes.
    m = load_model(ckpt_mxfp4)
    lg = m.forward(g["prompt_ids"] + g["greedy"][:-1])
    assert [argmax_lowest(r) for r in lg[T - 1:]] == g["greedy"]
    assert torch.equal(lg[:T], torch.tensor([r["logits"] for r in tf], dtype=torch.float64)) or \
        rel(lg[:T], torch.tensor([r["logits"] for r in tf], dtype=torch.float64)) <= 1e-12
    # Explicit prompt ids.
    out2 = str(tmp_path / "g2.json")
    g2 = make_golden.main([ckpt_mxfp4, out2, "--prompt-ids", "5,6,7", "--greedy-steps", "3"])
    assert g2["prompt_ids"] == [5, 6, 7] and len(g2["greedy"]) == 3

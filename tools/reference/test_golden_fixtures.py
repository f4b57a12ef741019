"""The committed goldens (tests/fixtures/golden/) must match what `ktier synth` writes today
and what the reference computes today: a stale golden would let the C++ end-to-end tests
compare against the wrong numbers. Needs the built ktier (CTest sets KTIER_BIN)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

import make_golden

REPO = Path(__file__).resolve().parents[2]
GOLDEN_DIR = REPO / "tests" / "fixtures" / "golden"
VARIANTS = {"tiny-mxfp4.json": [], "tiny-float.json": ["--float-experts"]}


def ktier_bin() -> str:
    b = os.environ.get("KTIER_BIN")
    if not b:
        pytest.skip("KTIER_BIN not set: run through ctest (it sets the built ktier)")
    return b


@pytest.mark.parametrize("golden_name", sorted(VARIANTS))
def test_golden_matches_current_synth_and_reference(golden_name, tmp_path):
    golden = json.loads((GOLDEN_DIR / golden_name).read_text())
    ckpt = tmp_path / "ckpt"
    subprocess.run([ktier_bin(), "synth", "--preset", "tiny", "-o", str(ckpt), "--seed", "0",
                    "-q", *VARIANTS[golden_name]], check=True, capture_output=True)
    torch.set_num_threads(1)  # as make_golden.py's default: one summation order
    fresh = make_golden.make_golden(str(ckpt), golden["prompt_ids"])
    assert fresh["checkpoint"] == golden["checkpoint"], (
        f"{golden_name} was made from other checkpoint bytes: regenerate it with "
        f"tools/reference/make_golden.py (see tools/reference/README.md)")
    # Ids exactly; float64 values to 1e-12 of their scale, not bit for bit: another BLAS
    # (Debian's libblas.so.3 alternative) or CPU adds in another order. A stale golden differs
    # by far more than this: the C++ tests allow 1e-4 of the logit scale.
    assert fresh["greedy"] == golden["greedy"], f"{golden_name}: greedy ids differ"
    logit_scale = golden["logits_max_abs"]
    sum_scale = max(v for row in golden["layer_checksums"]["abs_sum"] for v in row)
    for key, scale in (("teacher_forced", logit_scale), ("layer_checksums", sum_scale),
                       ("logits_max_abs", logit_scale)):
        where = same_within(fresh[key], golden[key], 1e-12 * scale, key)
        assert where is None, f"{golden_name}: {where} differs from a fresh run"


def same_within(a, b, tol: float, path: str):
    """None if `a` and `b` have one structure, equal ids and strings, and floats within `tol`;
    else the path of the first difference."""
    if isinstance(b, dict):
        if not isinstance(a, dict) or a.keys() != b.keys():
            return path
        return next((w for k in b if (w := same_within(a[k], b[k], tol, f"{path}.{k}"))), None)
    if isinstance(b, list):
        if not isinstance(a, list) or len(a) != len(b):
            return path
        return next((w for i, (x, y) in enumerate(zip(a, b))
                     if (w := same_within(x, y, tol, f"{path}[{i}]"))), None)
    if isinstance(b, float) and isinstance(a, float):
        return None if abs(a - b) <= tol else f"{path} ({a!r} vs {b!r})"
    return None if a == b and type(a) is type(b) else path

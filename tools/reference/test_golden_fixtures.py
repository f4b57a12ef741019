"""The committed goldens (tests/fixtures/golden/) must match what `ktier synth` writes today
and what the reference computes today: a stale golden would let the C++ end-to-end tests
compare against the wrong numbers. Needs the built ktier (CTest sets KTIER_BIN)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

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
    fresh = make_golden.make_golden(str(ckpt), golden["prompt_ids"])
    assert fresh["checkpoint"] == golden["checkpoint"], (
        f"{golden_name} was made from other checkpoint bytes: regenerate it with "
        f"tools/reference/make_golden.py (see tools/reference/README.md)")
    for key in ("teacher_forced", "greedy", "layer_checksums", "logits_max_abs"):
        assert fresh[key] == golden[key], f"{golden_name}: {key} differs from a fresh run"

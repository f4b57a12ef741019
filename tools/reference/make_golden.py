#!/usr/bin/python3
"""Write a golden JSON file for a (small) K3-shaped checkpoint with the float64 reference.

    /usr/bin/python3 tools/reference/make_golden.py CKPT_DIR OUT.json [--prompt-ids 1,2,3]

CKPT_DIR is a released-layout checkpoint (config.json + model.safetensors.index.json +
shards, or a single model.safetensors), e.g. one written by ``ktier synth``. The golden
records teacher-forced logits for every prompt position, a 20-token greedy continuation
computed by incremental decode (asserted equal to a full re-forward within 1e-9 relative at
every step), per-layer checksums of the residual partial sum P, and the sha256 of every shard
so a consumer can tell it was made from identical bytes. Schema: README.md in this folder.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from typing import List, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from k3ref.model import argmax_lowest, load_model  # noqa: E402

FORMAT = "k3ref-golden-v1"
# Fixed default prompt: 12 ordinary ids, all < 256 so they fit the tiny test vocabulary.
DEFAULT_PROMPT = [17, 42, 1, 99, 128, 7, 200, 63, 150, 31, 222, 88]
GREEDY_STEPS = 20
INCREMENTAL_REL_TOL = 1e-9
SIZE_WARN_BYTES = 5 * 1024 * 1024


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a-b| / max|b|: a norm-relative measure (elementwise relative error is meaningless
    for logits near zero)."""
    den = float(b.abs().max())
    return float((a - b).abs().max()) / (den if den > 0 else 1.0)


def top2_margin(row: torch.Tensor) -> float:
    """Gap between the best and second-best logit: a consumer running in f32 can expect its
    argmax to match only where this gap is well above its own error."""
    v = torch.topk(row, 2).values
    return float(v[0] - v[1])


def floats(t: torch.Tensor) -> List[float]:
    return [float(x) for x in t.tolist()]


def make_golden(ckpt_dir: str, prompt_ids: Optional[List[int]] = None,
                greedy_steps: int = GREEDY_STEPS) -> dict:
    model = load_model(ckpt_dir)
    cfg = model.cfg
    explicit = prompt_ids is not None
    prompt = list(DEFAULT_PROMPT if prompt_ids is None else prompt_ids)
    if not prompt:
        raise SystemExit("empty prompt")
    bad = [i for i in prompt if not 0 <= i < cfg.vocab_size]
    special = [i for i in prompt if i in cfg.special_ids]
    if bad or (special and not explicit):
        raise SystemExit(f"prompt ids {bad or special} are out of range or special for this "
                         f"checkpoint (V={cfg.vocab_size}, specials {cfg.special_ids}); pass --prompt-ids")

    # Teacher-forced prefill of the whole prompt in one chunk (layer-major).
    state = model.new_state()
    logits, sums = model.forward(prompt, state, checksums=True)
    T = len(prompt)

    # Cross-check 0: the chunked prefill equals feeding the prompt one token at a time.
    st1 = model.new_state()
    single = torch.stack([model.step(i, st1) for i in prompt])
    rel0 = rel_diff(logits, single)
    assert rel0 <= INCREMENTAL_REL_TOL, f"prefill vs token-by-token: rel diff {rel0:.3e}"

    teacher = []
    for t in range(T):
        teacher.append({"position": t, "input_id": prompt[t], "argmax": argmax_lowest(logits[t]),
                        "top2_margin": top2_margin(logits[t]), "logits": floats(logits[t])})

    # Greedy continuation by incremental decode; every step re-checked against a full
    # re-forward of the whole sequence from an empty state.
    seq = list(prompt)
    cur = logits[-1]
    greedy, detail, worst = [], [], rel0
    for s in range(greedy_steps):
        if s > 0:
            full = model.forward(seq)[-1]
            r = rel_diff(cur, full)
            assert r <= INCREMENTAL_REL_TOL, f"greedy step {s}: incremental vs full rel diff {r:.3e}"
            worst = max(worst, r)
        else:
            r = rel0
        tok = argmax_lowest(cur)
        greedy.append(tok)
        detail.append({"step": s, "position": len(seq) - 1, "argmax": tok,
                       "max_logit": float(cur.max()), "top2_margin": top2_margin(cur),
                       "incremental_vs_full_rel": r})
        seq.append(tok)
        if s + 1 < greedy_steps:
            cur = model.step(tok, state)

    shards = {os.path.basename(p): sha256_file(p) for _, p in sorted(model_shards(ckpt_dir).items())}
    return {
        "format": FORMAT,
        "generator": "tools/reference/make_golden.py (k3ref, float64 PyTorch reference of K3-MODEL.md)",
        "checkpoint": shards,
        "config_sha256": sha256_file(os.path.join(ckpt_dir, "config.json")),
        "config_summary": cfg.summary(),
        "prompt_ids": prompt,
        "teacher_forced": teacher,
        "greedy": greedy,
        "greedy_detail": detail,
        "layer_checksums": {
            "what": "per prompt position t, per layer l: sum and sum of |x| of the block partial "
                    "sum P after layer l (after its FFN output is added), teacher-forced prefill",
            "positions": T,
            "layers": cfg.num_hidden_layers,
            "sum": [floats(sums[t, :, 0]) for t in range(T)],
            "abs_sum": [floats(sums[t, :, 1]) for t in range(T)],
        },
        "logits_max_abs": float(logits.abs().max()),
        "numerics": {
            "dtype": "float64",
            "torch": torch.__version__,
            "incremental_vs_full_max_rel": worst,
            "incremental_vs_full_tol_rel": INCREMENTAL_REL_TOL,
            "mla_eps_lowrank": 1e-6,
            "greedy_tie_rule": "lowest index",
        },
    }


def model_shards(ckpt_dir: str) -> dict:
    from k3ref.safetensors_io import Checkpoint
    return Checkpoint(ckpt_dir).shard_paths()


def parse_ids(s: str) -> List[int]:
    return [int(x) for x in s.replace(" ", "").split(",") if x != ""]


def main(argv: Optional[List[str]] = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", help="checkpoint directory")
    ap.add_argument("out", help="output JSON path")
    ap.add_argument("--prompt-ids", type=parse_ids, default=None,
                    help=f"comma-separated token ids (default: {','.join(map(str, DEFAULT_PROMPT))})")
    ap.add_argument("--greedy-steps", type=int, default=GREEDY_STEPS)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (tiny models: 1 is fastest)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    g = make_golden(a.checkpoint, a.prompt_ids, a.greedy_steps)
    text = json.dumps(g, indent=1, allow_nan=False)  # floats written with repr (round-trip) precision
    with open(a.out, "w") as f:
        f.write(text + "\n")
    size = len(text) + 1
    print(f"wrote {a.out}: {size} bytes, prompt {len(g['prompt_ids'])} ids, greedy {g['greedy']}, "
          f"incremental-vs-full max rel {g['numerics']['incremental_vs_full_max_rel']:.2e}")
    if size > SIZE_WARN_BYTES:
        print(f"warning: golden is {size / 2**20:.1f} MiB (logits rows are V floats each); "
              f"consider a shorter prompt", file=sys.stderr)
    return g


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Draws the `ktier trace replay` CSV: hit rate against memory budget, one line per policy.

Usage: plot_replay.py REPLAY.csv OUT.png [--title TEXT] [--ceiling RATE]

Called by `ktier trace replay --plot` with /usr/bin/python3. Columns used: policy, total_bytes,
total_slots, hit_rate, and <tier>_bytes for every memory tier but the last (when the sweep
varies a faster tier too, each of its sizes gets its own line per policy). Exit status: 0 ok,
2 bad arguments or CSV, 3 matplotlib cannot be imported (ktier turns that into a clear error).
"""
import argparse
import csv
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("png")
    ap.add_argument("--title", default="ktier trace replay")
    ap.add_argument("--ceiling", type=float, default=None,
                    help="compulsory-miss ceiling as a fraction, drawn as a dashed line")
    args = ap.parse_args()

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"matplotlib is not available: {e}", file=sys.stderr)
        return 3

    try:
        with open(args.csv, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        print(f"cannot read {args.csv}: {e}", file=sys.stderr)
        return 2
    if not rows:
        print(f"{args.csv}: no rows", file=sys.stderr)
        return 2

    # Tier columns in order: <name>_bytes, excluding total_bytes and bytes_read.
    tier_cols = [c for c in rows[0] if c.endswith("_bytes")
                 and not c.endswith("_hit_rate_bytes")
                 and c not in ("total_bytes", "prefetch_wasted_bytes")]
    fast_cols = tier_cols[:-1]  # every memory tier but the slowest one (the swept axis)

    lines = {}
    for r in rows:
        fast = " ".join(f"{c[:-6]}={float(r[c]) / 1e9:g}GB" for c in fast_cols)
        label = r["policy"] + (f" ({fast})" if fast else "")
        x = float(r["total_bytes"]) / 1e9
        lines.setdefault(label, []).append((x, 100.0 * float(r["hit_rate"])))

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for label, pts in lines.items():
        pts.sort()
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.5, label=label)
    if args.ceiling is not None:
        ax.axhline(100.0 * args.ceiling, color="gray", linestyle="--", linewidth=1,
                   label=f"compulsory-miss ceiling {100.0 * args.ceiling:.1f}%")
    xs_all = [p[0] for pts in lines.values() for p in pts if p[0] > 0]
    if xs_all and max(xs_all) / min(xs_all) > 20:
        ax.set_xscale("log", base=2)
    ax.set_xlabel("memory budget (GB, all memory tiers)")
    ax.set_ylabel("hit rate (% of expert bytes)")
    ax.set_ylim(0, 100)
    ax.set_title(args.title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(args.png, format="png")
    except OSError as e:
        print(f"cannot write {args.png}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

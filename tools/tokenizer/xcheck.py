#!/usr/bin/python3
"""Cross-checks ktier's tokenizer against js-tiktoken (CTest: tokenizer.xcheck_js_tiktoken).

    /usr/bin/python3 tools/tokenizer/xcheck.py --ktier BUILD/ktier \\
        --driver BUILD/tests/tokenizer/tokenizer_xcheck_encode --work BUILD/tokenizer-xcheck

Steps (all artefacts go to --work, nothing to the source tree):
  1. make_corpus.py writes a deterministic ~1.2 MB corpus (JSONL documents + one text file).
  2. xcheck/export_ranks.mjs writes js-tiktoken's o200k_base ranks as a ktier tokenizer folder.
  3. Unicode tables: ktier's class table vs V8's \\p{..} for every code point assigned in the
     UCD version of /usr/share/unicode; White_Space vs ECMAScript \\s must differ exactly at
     U+0085 and U+FEFF; the Python-space bit vs str.isspace() everywhere.
  4. Per-document ids, ktier (the driver) vs js-tiktoken (xcheck/encode.mjs), in three modes:
     o200k (shipped pattern), k3 (K3 pattern + the reference's long-input chunking),
     k3-small-limits (the same chunking with tiny limits, so chunk and run cuts happen often).
  5. Whole corpus through the CLI (`ktier tokenize -f corpus.txt`) vs js-tiktoken on the same
     file, in both patterns (the K3 run crosses a 400,000-code-point chunk boundary).
Any difference fails the test, naming the document, the first differing id index, both id
sequences there and the text around it. A missing node_modules fails (never skips).
"""
import argparse
import base64
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
XCHECK = os.path.join(HERE, "xcheck")
SMALL_LIMITS = (1000, 40)  # max chunk, max run (code points) for the k3-small-limits mode
# Code points whose classes changed in a Unicode version after the UCD that ktier's tables use
# (15.0) and that V8 already has. Differences here are expected; make_corpus.py avoids them.
KNOWN_PROPERTY_CHANGES = {
    0x0295: "LATIN LETTER PHARYNGEAL VOICED FRICATIVE: Ll in 15.0, Lo from 16.0",
}


class Fail(Exception):
    pass


def run(cmd, **kw):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, **kw)
    if p.returncode != 0:
        raise Fail("command failed (exit %d): %s\n%s%s" % (
            p.returncode, " ".join(cmd), p.stdout.decode(errors="replace")[-2000:],
            p.stderr.decode(errors="replace")[-4000:]))
    return p.stdout, time.time() - t0


def load_vocab(folder):
    tokens = {}
    with open(os.path.join(folder, "tiktoken.model"), "rb") as f:
        for line in f:
            line = line.strip()
            if line:
                b64, rank = line.split(b" ")
                tokens[int(rank)] = base64.b64decode(b64)
    return tokens


def read_ids_jsonl(path):
    out = []
    with open(path, "rb") as f:
        for line in f.read().split(b"\n"):
            if line:
                d = json.loads(line)
                out.append((d["name"], d["ids"]))
    return out


def describe_mismatch(name, text, ours, theirs, vocab):
    i = 0
    while i < min(len(ours), len(theirs)) and ours[i] == theirs[i]:
        i += 1
    offset = sum(len(vocab.get(t, b"")) for t in theirs[:i])
    raw = text.encode("utf-8")

    def show(ids):
        return " ".join("%d%r" % (t, vocab.get(t, b"?")) for t in ids[i:i + 6])

    return ("document %s: first difference at id index %d (byte offset %d; ktier %d ids, "
            "js-tiktoken %d ids)\n  text there: %r\n  js-tiktoken: %s\n  ktier:       %s" % (
                name, i, offset, len(ours), len(theirs), raw[max(0, offset - 20):offset + 40],
                show(theirs), show(ours)))


def compare_docs(mode, docs, ours, theirs, vocab):
    if len(ours) != len(docs) or len(theirs) != len(docs):
        raise Fail("%s: document counts differ (corpus %d, ktier %d, js %d)"
                   % (mode, len(docs), len(ours), len(theirs)))
    bad = []
    n_ids = 0
    for (name, text), (n1, a), (n2, b) in zip(docs, ours, theirs):
        if not (name == n1 == n2):
            raise Fail("%s: document order differs at %s / %s / %s" % (mode, name, n1, n2))
        n_ids += len(b)
        if a != b:
            bad.append(describe_mismatch(name, text, a, b, vocab))
    return n_ids, bad


def parse_runs(path):
    bits = [0] * 0x110000
    rows = []
    with open(path) as f:
        for line in f:
            if not line.startswith("#") and line.strip():
                cp, b = line.split()
                rows.append((int(cp, 16), int(b)))
    for k, (cp, b) in enumerate(rows):
        end = rows[k + 1][0] if k + 1 < len(rows) else 0x110000
        bits[cp:end] = [b] * (end - cp)
    return bits


def unicode_version_of(classes_path):
    """The Unicode version of ktier's tables, from the driver's "# ktier unicode X.Y.Z" line."""
    with open(classes_path) as f:
        for line in f:
            if line.startswith("# ktier unicode "):
                return tuple(int(x) for x in line.split()[3].split(".")[:2])
    raise SystemExit(classes_path + ": no '# ktier unicode' line (an older driver?)")


def assigned_in_ucd(ucd, up_to):
    """Code points with an Age in DerivedAge.txt no later than `up_to` (major, minor): those
    ktier's tables know, whatever newer version the installed UCD is."""
    cps = set()
    with open(os.path.join(ucd, "DerivedAge.txt"), encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                field, age = (x.strip() for x in line.split(";")[:2])
                if tuple(int(x) for x in age.split(".")[:2]) > up_to:
                    continue
                r = field.split("..")
                cps.update(range(int(r[0], 16), int(r[-1], 16) + 1))
    return cps


def check_unicode(args, work):
    ours_path = os.path.join(work, "classes-ktier.txt")
    v8_path = os.path.join(work, "classes-v8.txt")
    run([args.driver, "--dump-classes", ours_path])
    run([args.node, os.path.join(XCHECK, "classes.mjs"), v8_path])
    ours, v8 = parse_runs(ours_path), parse_runs(v8_path)
    assigned = assigned_in_ucd(args.ucd, unicode_version_of(ours_path))
    ws, pyspace, core = 1 << 7, 1 << 9, (1 << 7) - 1 | (1 << 8)
    all_diffs = [cp for cp in sorted(assigned) if not 0xD800 <= cp <= 0xDFFF
                 and (ours[cp] & core) != (v8[cp] & core)]
    known = [cp for cp in all_diffs if cp in KNOWN_PROPERTY_CHANGES]
    diffs = [cp for cp in all_diffs if cp not in KNOWN_PROPERTY_CHANGES]
    ws_diff = [cp for cp in range(0x110000) if bool(ours[cp] & ws) != bool(v8[cp] & ws)]
    py_diff = [cp for cp in range(0x110000)
               if not 0xD800 <= cp <= 0xDFFF and bool(ours[cp] & pyspace) != chr(cp).isspace()]
    later = sum(1 for cp in range(0x110000) if cp not in assigned and (v8[cp] & core) != (ours[cp] & core))
    problems = []
    if diffs:
        problems.append("classes differ from V8 for %d code points assigned in the UCD: %s" % (
            len(diffs), " ".join("U+%04X(ktier %d, v8 %d)" % (c, ours[c], v8[c]) for c in diffs[:20])))
    if ws_diff != [0x85, 0xFEFF]:
        problems.append("White_Space vs ECMAScript \\s: expected differences exactly at U+0085 and "
                        "U+FEFF, got " + " ".join("U+%04X" % c for c in ws_diff[:20]))
    if py_diff:
        problems.append("Python-space bit vs str.isspace(): " + " ".join("U+%04X" % c for c in py_diff[:20]))
    return {"assigned_code_points": len(assigned), "unexpected_differences": len(diffs),
            "known_later_changes": ["U+%04X" % c for c in known],
            "unassigned_in_ucd_but_classified_by_v8": later}, problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ktier", required=True)
    ap.add_argument("--driver", required=True)
    ap.add_argument("--node", default="/usr/bin/node")
    ap.add_argument("--work", required=True)
    ap.add_argument("--ucd", default="/usr/share/unicode")
    args = ap.parse_args()

    if not os.path.isdir(os.path.join(XCHECK, "node_modules", "js-tiktoken")):
        raise Fail("js-tiktoken is not installed in %s/node_modules: run tools/setup.sh "
                   "(it runs `npm ci --prefix tools/tokenizer/xcheck`)" % XCHECK)
    if not os.path.exists(args.node):
        raise Fail("node not found (%s): install Debian's nodejs (tools/setup.sh)" % args.node)
    for path in (args.ktier, args.driver):
        if not os.path.exists(path):
            raise Fail("%s not built" % path)
    work = args.work
    os.makedirs(work, exist_ok=True)
    vocab_dir = os.path.join(work, "o200k")

    out, _ = run([sys.executable, os.path.join(HERE, "make_corpus.py"), work])
    corpus = json.loads(out)
    run([args.node, os.path.join(XCHECK, "export_ranks.mjs"), vocab_dir])
    vocab = load_vocab(vocab_dir)
    docs = []
    with open(os.path.join(work, "corpus.jsonl"), "rb") as f:
        for line in f.read().split(b"\n"):
            if line:
                d = json.loads(line)
                docs.append((d["name"], d["text"]))
    corpus_jsonl = os.path.join(work, "corpus.jsonl")
    corpus_txt = os.path.join(work, "corpus.txt")

    unicode_summary, problems = check_unicode(args, work)

    modes = [("o200k", "o200k", None), ("k3", "k3", None), ("k3-small-limits", "k3", SMALL_LIMITS)]
    enc = os.path.join(XCHECK, "encode.mjs")
    jobs = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        for mode, pat, limits in modes:
            extra = [str(x) for x in limits] if limits else []
            jobs[mode] = pool.submit(run, [args.node, enc, pat, corpus_jsonl,
                                           os.path.join(work, "js-%s.jsonl" % mode)] + extra)
        for pat in ("o200k", "k3"):
            jobs["whole-" + pat] = pool.submit(run, [args.node, enc, pat, "--whole", corpus_txt,
                                                     os.path.join(work, "js-whole-%s.txt" % pat)])
        ours = {}
        for mode, pat, limits in modes:
            extra = ["--max-chunk", str(limits[0]), "--max-run", str(limits[1])] if limits else []
            stdout, _ = run([args.driver, "--tokenizer", vocab_dir, "--pattern", pat, "--corpus",
                             corpus_jsonl, "--out", os.path.join(work, "ktier-%s.jsonl" % mode)] + extra)
            ours[mode] = json.loads(stdout)
        whole = {}
        for pat in ("o200k", "k3"):
            stdout, secs = run([args.ktier, "tokenize", "--tokenizer", vocab_dir, "--pattern", pat,
                                "-f", corpus_txt])
            whole[pat] = (stdout.decode().strip(), secs)
        for j in jobs.values():
            j.result()

    report = {"corpus": corpus, "unicode": unicode_summary, "modes": {}}
    for mode, _, _ in modes:
        n_ids, bad = compare_docs(mode, docs, read_ids_jsonl(os.path.join(work, "ktier-%s.jsonl" % mode)),
                                  read_ids_jsonl(os.path.join(work, "js-%s.jsonl" % mode)), vocab)
        report["modes"][mode] = {"documents": len(docs), "ids_compared": n_ids, "mismatches": len(bad),
                                 "ktier_mb_per_s_wall": round(ours[mode]["mb_per_s"], 2),
                                 "ktier_mb_per_cpu_s": round(ours[mode]["mb_per_cpu_s"], 2)}
        problems += ["[%s] %s" % (mode, b) for b in bad[:10]]
    whole_text = open(corpus_txt, "rb").read().decode("utf-8")
    for pat in ("o200k", "k3"):
        theirs = [int(x) for x in open(os.path.join(work, "js-whole-%s.txt" % pat)).read().strip().split(",")]
        ours_ids = [int(x) for x in whole[pat][0].split(",")]
        ok = ours_ids == theirs
        report["modes"]["whole-cli-" + pat] = {"documents": 1, "ids_compared": len(theirs),
                                               "mismatches": 0 if ok else 1,
                                               "cli_seconds_incl_load": round(whole[pat][1], 2)}
        if not ok:
            problems.append("[whole-cli-%s] %s" % (pat, describe_mismatch("corpus.txt", whole_text,
                                                                         ours_ids, theirs, vocab)))
    print(json.dumps(report, indent=1))
    if problems:
        raise Fail("\n".join(problems))
    total = sum(m["ids_compared"] for m in report["modes"].values())
    print("tokenizer cross-check: %d ids compared in %d modes, 0 mismatches" % (total, len(report["modes"])))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Fail as e:
        print("tokenizer cross-check FAILED:\n%s" % e, file=sys.stderr)
        sys.exit(1)

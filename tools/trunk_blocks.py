#!/usr/bin/python3
"""Independent Python implementation of the compressed block of a version-2 trunk pack
(docs/FORMAT.md, "Compressed records"; the C++ side is src/pack/block_codec.{h,cpp}).

Stored bytes of a block, little-endian:
  magic b"KTB1" | mode u8 (0 whole, 1 bf16 split) | codec A u8 | codec B u8 | 0 u8 |
  inflated u64 | stored length of plane A u64 | stored length of plane B u64 | plane A | plane B
Split: plane A = the high byte of every bf16 value (odd offsets), plane B = the low bytes (even
offsets). Codec 0 = raw, 1 = one zstd frame; a plane is stored raw when zstd is not smaller.

  trunk_blocks.py fixture OUTDIR    write the cross-language fixture: case_K.src (original bytes)
                                    and case_K.block (stored block) for K in 0..N-1, plus
                                    cases.txt ("K split|whole description" per line)
  trunk_blocks.py entropy FILE      bf16 plane entropies (bits/byte) and split+zstd ratio of the
                                    bytes of FILE (raw little-endian bf16), in 4 MiB blocks
  trunk_blocks.py check-pack ZPACK PLAIN
                                    the other direction: inflate every block of the compressed
                                    pack ZPACK (written by `ktier pack --compress`) with this
                                    decoder and compare each record with the same record of the
                                    plain pack PLAIN (`ktier pack`); exit 1 naming the first
                                    record that differs

Needs python3-zstandard (tools/setup.sh installs it) and numpy.
"""
import math
import os
import struct
import sys

import numpy as np
import zstandard

MAGIC = b"KTB1"
HEADER = struct.Struct("<4sBBBBQQQ")  # 32 bytes
LEVEL = 1


def _plane(data: bytes, level: int):
    z = zstandard.ZstdCompressor(level=level).compress(data)
    return (1, z) if len(z) < len(data) else (0, bytes(data))


def split(data: bytes):
    a = np.frombuffer(data, dtype=np.uint8)
    return a[1::2].tobytes(), a[0::2].tobytes()  # high, low


def merge(hi: bytes, lo: bytes) -> bytes:
    out = np.empty(2 * len(hi), dtype=np.uint8)
    out[1::2] = np.frombuffer(hi, dtype=np.uint8)
    out[0::2] = np.frombuffer(lo, dtype=np.uint8)
    return out.tobytes()


def encode(data: bytes, split_planes: bool, level: int = LEVEL) -> bytes:
    if split_planes:
        assert len(data) % 2 == 0, "split blocks have an even length"
        hi, lo = split(data)
        ca, pa = _plane(hi, level)
        cb, pb = _plane(lo, level)
        return HEADER.pack(MAGIC, 1, ca, cb, 0, len(data), len(pa), len(pb)) + pa + pb
    ca, pa = _plane(data, level)
    return HEADER.pack(MAGIC, 0, ca, 0, 0, len(data), len(pa), 0) + pa


def decode(block: bytes) -> bytes:
    magic, mode, ca, cb, zero, n, la, lb = HEADER.unpack_from(block)
    assert magic == MAGIC and zero == 0 and HEADER.size + la + lb == len(block)
    body = block[HEADER.size:]

    def plane(codec, raw, size):
        out = zstandard.ZstdDecompressor().decompress(raw, max_output_size=size) if codec else raw
        assert len(out) == size
        return out

    if mode == 0:
        return plane(ca, body[:la], n)
    return merge(plane(ca, body[:la], n // 2), plane(cb, body[la:], n // 2))


def bf16_like(rng, count: int, scale: float) -> bytes:
    """bf16 bytes of normally distributed weights (the high byte then has low entropy)."""
    f = (rng.standard_normal(count) * scale).astype(np.float32)
    return (f.view(np.uint32) >> 16).astype("<u2").tobytes()


def fixture(outdir: str) -> None:
    os.makedirs(outdir, exist_ok=True)
    rng = np.random.default_rng(7)
    cases = [
        ("split", bf16_like(rng, 3000, 0.02), "bf16 weights, both planes zstd or raw"),
        ("split", bf16_like(rng, 1, 0.02), "one bf16 value"),
        ("split", rng.integers(0, 256, 4096, dtype=np.uint8).tobytes(), "noise: raw planes"),
        ("split", bytes(8192), "zeros: both planes zstd"),
        ("whole", rng.integers(0, 4, 5001, dtype=np.uint8).tobytes(), "odd length, whole, zstd"),
        ("whole", rng.integers(0, 256, 777, dtype=np.uint8).tobytes(), "noise, whole, raw"),
    ]
    with open(os.path.join(outdir, "cases.txt"), "w") as listing:
        for k, (mode, data, what) in enumerate(cases):
            block = encode(data, mode == "split")
            assert decode(block) == data
            with open(os.path.join(outdir, f"case_{k}.src"), "wb") as f:
                f.write(data)
            with open(os.path.join(outdir, f"case_{k}.block"), "wb") as f:
                f.write(block)
            listing.write(f"{k} {mode} {what}\n")


def entropy(data: bytes) -> float:
    counts = np.bincount(np.frombuffer(data, dtype=np.uint8), minlength=256)
    p = counts[counts > 0] / max(1, len(data))
    return float(-(p * np.log2(p)).sum())


def measure(path: str, block: int = 4 << 20) -> None:
    data = open(path, "rb").read()
    data = data[: len(data) // 2 * 2]
    hi, lo = split(data)
    stored = sum(len(encode(data[i:i + block], True)) for i in range(0, len(data), block))
    print(f"bytes {len(data)} high_plane_bits {entropy(hi):.3f} low_plane_bits {entropy(lo):.3f} "
          f"ratio {stored / max(1, len(data)):.4f} (split + zstd level {LEVEL}, {block} byte blocks)")


def check_pack(zpack: str, plain: str) -> int:
    import json
    zman = json.load(open(os.path.join(zpack, "manifest.json")))
    pman = json.load(open(os.path.join(plain, "manifest.json")))
    plain_records = {r["name"]: r for r in pman["records"]}
    blocks = 0
    with open(os.path.join(zpack, "trunk.pack"), "rb") as zf, \
            open(os.path.join(plain, "trunk.pack"), "rb") as pf:
        for r in zman["records"]:
            want_r = plain_records[r["name"]]
            pf.seek(want_r["offset"])
            want = pf.read(want_r["size"])
            if "blocks" not in r:  # head and embed are stored as in a plain pack
                zf.seek(r["offset"])
                got = zf.read(r["size"])
            else:
                parts = []
                for b in r["blocks"]:
                    zf.seek(b["offset"])
                    out = decode(zf.read(b["length"]))
                    if len(out) != b["inflated"]:
                        print(f"{r['name']}: block at {b['offset']} inflates to {len(out)}, "
                              f"manifest says {b['inflated']}")
                        return 1
                    parts.append(out)
                    blocks += 1
                got = b"".join(parts)
            if got != want:
                print(f"{r['name']}: inflated bytes differ from the plain pack's record")
                return 1
    # A compressed pack stores every layer record as blocks; a plain one passed as the first
    # argument (no blocks at all) would otherwise "pass" without inflating anything.
    unblocked = [r["name"] for r in zman["records"]
                 if r["name"].startswith("layer.") and "blocks" not in r]
    if zman.get("version") != 2 or blocks == 0 or unblocked:
        print(f"{zpack}: not a compressed pack (version {zman.get('version')}, {blocks} blocks, "
              f"layer records without blocks: {unblocked[:3]})")
        return 1
    print(f"ok: {len(zman['records'])} records, {blocks} blocks inflated by Python equal the "
          f"plain pack")
    return 0


def main(argv):
    if len(argv) == 4 and argv[1] == "check-pack":
        return check_pack(argv[2], argv[3])
    if len(argv) == 3 and argv[1] == "fixture":
        fixture(argv[2])
    elif len(argv) == 3 and argv[1] == "entropy":
        measure(argv[2])
    else:
        sys.stderr.write(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

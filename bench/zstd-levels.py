#!/usr/bin/env python3
# zstd level vs ratio of split bf16 planes on a plain pack's layer record (docs/PERFORMANCE.md,
# "Compressed trunk pack"). Usage: /usr/bin/python3 bench/zstd-levels.py [PLAIN_PACKDIR] [RECORD]
import sys, time, json
import os
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tools'))
PACK = sys.argv[1] if len(sys.argv) > 1 else '/tmp/wtc-demo-plain'
REC = int(sys.argv[2]) if len(sys.argv) > 2 else 3
import numpy as np, zstandard
import trunk_blocks as tb
m = json.load(open(os.path.join(PACK, 'manifest.json')))
f = open(os.path.join(PACK, 'trunk.pack'), 'rb')
r = m['records'][REC]
f.seek(r['offset']); data = f.read(min(r['bytes'], 96 << 20)); data = data[:len(data)//2*2]
B = 4 << 20
for level in (1, 2, 3, 5):
    t0 = time.perf_counter(); blocks = [tb.encode(data[i:i+B], True, level) for i in range(0, len(data), B)]; tc = time.perf_counter() - t0
    t0 = time.perf_counter(); out = b''.join(tb.decode(b) for b in blocks); td = time.perf_counter() - t0
    assert out == data
    print(f"level {level}: ratio {sum(map(len, blocks))/len(data):.4f}  compress {len(data)/tc/1e6:.0f} MB/s  decode(py, incl. numpy merge) {len(data)/td/1e6:.0f} MB/s  sample {len(data)} bytes of {r['name']}")

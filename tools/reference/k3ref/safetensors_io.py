"""Minimal, strict safetensors reader (K3-MODEL §3.2, §3.3).

Deliberately independent of the ``safetensors`` package: the reference must not share a
parser with anything it is used to check.

Contract:
* bytes 0..7: little-endian u64 header length N (any N; no alignment assumed);
* bytes 8..8+N-1: a UTF-8 JSON object, name -> {dtype, shape, data_offsets}; the member
  ``__metadata__`` is not a tensor and is skipped;
* tensor bytes are [8+N+begin, 8+N+end), little-endian, row-major.
Every header is validated when the file is opened (sizes, bounds, overlaps, duplicate names),
so a malformed file fails before any arithmetic runs.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

# Element sizes of every dtype name we can *parse*. Only the subset in _READABLE can be
# converted to arrays; the rest are reported by name when someone tries to read them.
DTYPE_SIZES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1,
    "U64": 8, "U32": 4, "U16": 2, "U8": 1,
    "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
}
_READABLE = {"F64", "F32", "F16", "BF16", "U8", "F8_E8M0"}
FLOAT_DTYPES = ("F32", "BF16", "F16")  # accepted for non-expert weights (§5.10)


class SafeTensorsError(ValueError):
    pass


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: Tuple[int, ...]
    begin: int  # relative to the data section
    end: int
    abs_offset: int  # absolute file offset of the first byte

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise SafeTensorsError(f"duplicate JSON key {k!r} in safetensors header")
        out[k] = v
    return out


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class SafeTensorsFile:
    """One safetensors file. The header is parsed and validated in the constructor."""

    def __init__(self, path: str):
        self.path = str(path)
        self.file_size = os.path.getsize(self.path)
        with open(self.path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise SafeTensorsError(f"{self.path}: shorter than 8 bytes")
            (n,) = struct.unpack("<Q", head)
            if n > self.file_size - 8:
                raise SafeTensorsError(f"{self.path}: header length {n} exceeds file size {self.file_size}")
            raw = f.read(n)
        self.header_len = n
        self.data_start = 8 + n
        data_len = self.file_size - self.data_start
        try:
            text = raw.decode("utf-8")
            hdr = json.loads(text, object_pairs_hook=_no_duplicates)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SafeTensorsError(f"{self.path}: header is not valid UTF-8 JSON: {e}") from None
        if not isinstance(hdr, dict):
            raise SafeTensorsError(f"{self.path}: header is not a JSON object")
        self.metadata = hdr.get("__metadata__")
        self.tensors: Dict[str, TensorInfo] = {}
        for name, ent in hdr.items():
            if name == "__metadata__":
                continue
            self.tensors[name] = self._parse_entry(name, ent, data_len)
        self._check_overlaps()

    def _parse_entry(self, name: str, ent, data_len: int) -> TensorInfo:
        where = f"{self.path}: tensor {name!r}"
        if not isinstance(ent, dict):
            raise SafeTensorsError(f"{where}: entry is not an object")
        for key in ("dtype", "shape", "data_offsets"):
            if key not in ent:
                raise SafeTensorsError(f"{where}: missing {key!r}")
        dtype, shape, offs = ent["dtype"], ent["shape"], ent["data_offsets"]
        if dtype not in DTYPE_SIZES:
            raise SafeTensorsError(f"{where}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise SafeTensorsError(f"{where}: bad shape {shape!r}")
        if (not isinstance(offs, list) or len(offs) != 2 or not all(_is_int(o) for o in offs)
                or not 0 <= offs[0] <= offs[1]):
            raise SafeTensorsError(f"{where}: bad data_offsets {offs!r}")
        info = TensorInfo(name, dtype, tuple(shape), offs[0], offs[1], self.data_start + offs[0])
        if info.nbytes != info.numel * DTYPE_SIZES[dtype]:
            raise SafeTensorsError(
                f"{where}: byte range {info.nbytes} != numel {info.numel} x {DTYPE_SIZES[dtype]}")
        if info.end > data_len:
            raise SafeTensorsError(f"{where}: data end {info.end} beyond data section length {data_len}")
        return info

    def _check_overlaps(self) -> None:
        # Zero-length tensors may share an offset with anything; only non-empty ranges count.
        ranges = sorted((t.begin, t.end, t.name) for t in self.tensors.values() if t.end > t.begin)
        for (b0, e0, n0), (b1, e1, n1) in zip(ranges, ranges[1:]):
            if b1 < e0:
                raise SafeTensorsError(f"{self.path}: tensors {n0!r} and {n1!r} overlap")

    def keys(self) -> List[str]:
        return list(self.tensors.keys())

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def info(self, name: str) -> TensorInfo:
        return self.tensors[name]

    def raw_bytes(self, name: str) -> bytes:
        t = self.tensors[name]
        with open(self.path, "rb") as f:
            f.seek(t.abs_offset)
            b = f.read(t.nbytes)
        if len(b) != t.nbytes:
            raise SafeTensorsError(f"{self.path}: short read for {name!r}")
        return b

    def numpy(self, name: str) -> np.ndarray:
        """Tensor as numpy: float formats widened exactly to float32 (F64 stays float64);
        U8 / F8_E8M0 as uint8."""
        t = self.tensors[name]
        if t.dtype not in _READABLE:
            raise SafeTensorsError(f"{self.path}: tensor {name!r} has unsupported dtype {t.dtype}")
        b = self.raw_bytes(name)
        if t.dtype == "F32":
            a = np.frombuffer(b, dtype="<f4").astype(np.float32)
        elif t.dtype == "F64":
            a = np.frombuffer(b, dtype="<f8").astype(np.float64)
        elif t.dtype == "F16":
            a = np.frombuffer(b, dtype="<f2").astype(np.float32)  # exact, incl. subnormals/inf/NaN
        elif t.dtype == "BF16":
            # BF16 is the high half of an f32 bit pattern: widening is a shift, hence exact.
            a = (np.frombuffer(b, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:  # U8, F8_E8M0 (same byte meaning for MXFP4 scales, §5.8)
            a = np.frombuffer(b, dtype=np.uint8).copy()
        return a.reshape(t.shape)

    def torch64(self, name: str) -> torch.Tensor:
        return torch.from_numpy(self.numpy(name).astype(np.float64))


class Checkpoint:
    """A checkpoint directory: ``model.safetensors.index.json`` + shards, or one file.

    The index is only a locator; each shard's own header is authoritative, and any
    disagreement between the two is a load error (§3.3)."""

    SINGLE_NAMES = ("model.safetensors", "model-00001-of-00001.safetensors")

    def __init__(self, directory: str):
        self.directory = str(directory)
        self.files: Dict[str, SafeTensorsFile] = {}
        self.location: Dict[str, str] = {}  # tensor name -> shard file name
        index_path = os.path.join(self.directory, "model.safetensors.index.json")
        if os.path.exists(index_path):
            with open(index_path, "r", encoding="utf-8") as f:
                index = json.load(f, object_pairs_hook=_no_duplicates)
            wm = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(wm, dict) or not wm:
                raise SafeTensorsError(f"{index_path}: missing or empty weight_map")
            for shard in sorted(set(wm.values())):
                if not isinstance(shard, str) or os.path.basename(shard) != shard:
                    raise SafeTensorsError(f"{index_path}: bad shard file name {shard!r}")
                self.files[shard] = SafeTensorsFile(os.path.join(self.directory, shard))
            for name, shard in wm.items():
                if name not in self.files[shard]:
                    raise SafeTensorsError(f"index maps {name!r} to {shard}, whose header lacks it")
            for shard, st in self.files.items():
                for name in st.keys():
                    if wm.get(name) != shard:
                        raise SafeTensorsError(
                            f"{shard} holds {name!r} but the index maps it to {wm.get(name)!r}")
            self.location = dict(wm)
        else:
            for cand in self.SINGLE_NAMES:
                p = os.path.join(self.directory, cand)
                if os.path.exists(p):
                    self.files[cand] = SafeTensorsFile(p)
                    self.location = {n: cand for n in self.files[cand].keys()}
                    break
            else:
                raise SafeTensorsError(
                    f"{self.directory}: no model.safetensors.index.json and no single-file checkpoint")

    def keys(self) -> List[str]:
        return list(self.location.keys())

    def __contains__(self, name: str) -> bool:
        return name in self.location

    def __iter__(self) -> Iterator[str]:
        return iter(self.location)

    def info(self, name: str) -> TensorInfo:
        return self.files[self.location[name]].info(name)

    def numpy(self, name: str) -> np.ndarray:
        return self.files[self.location[name]].numpy(name)

    def torch64(self, name: str) -> torch.Tensor:
        return self.files[self.location[name]].torch64(name)

    def shard_paths(self) -> Dict[str, str]:
        return {k: v.path for k, v in self.files.items()}


def read_tensors(path: str, names: Optional[List[str]] = None) -> Dict[str, np.ndarray]:
    """Convenience: every (or the named) tensor of one file as numpy."""
    st = SafeTensorsFile(path)
    return {n: st.numpy(n) for n in (names if names is not None else st.keys())}

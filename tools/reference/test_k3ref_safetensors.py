"""The reference safetensors parser refuses malformed files (K3-MODEL §3.2)."""

import json
import struct

import numpy as np
import pytest

from k3ref.safetensors_io import SafeTensorsError, SafeTensorsFile
from tests_support.tiny_ckpt import to_bf16_bits, write_safetensors


def _raw(path, header: dict, data: bytes, pad: int = 0):
    h = json.dumps(header).encode() + b" " * pad
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def test_roundtrip(tmp_path):
    p = str(tmp_path / "a.safetensors")
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    write_safetensors(p, {"x": ("F32", x), "b": ("BF16", to_bf16_bits([1.0, -2.5, 3.0])),
                          "h": ("F16", np.array([0.5, -0.0], dtype="<f2")), "u": ("U8", np.arange(5, dtype=np.uint8))},
                      metadata={"format": "pt"})
    st = SafeTensorsFile(p)
    assert st.header_len % 8 == 0
    assert np.array_equal(st.numpy("x"), x)
    assert st.numpy("b").tolist() == [1.0, -2.5, 3.0]
    assert np.signbit(st.numpy("h")[1]) and st.numpy("u").tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("header,data,match", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 8, "byte range"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, "beyond"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, "overlap"),
    ({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 1]}}, b"\0", "unknown dtype"),
    ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}, b"", "bad shape"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, b"\0" * 4, "data_offsets"),
])
def test_malformed(tmp_path, header, data, match):
    p = str(tmp_path / "bad.safetensors")
    _raw(p, header, data)
    with pytest.raises(SafeTensorsError, match=match):
        SafeTensorsFile(p)


def test_zero_length_shares_offset(tmp_path):
    p = str(tmp_path / "z.safetensors")
    _raw(p, {"e": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},
             "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, pad=3)
    st = SafeTensorsFile(p)
    assert st.numpy("e").size == 0 and st.numpy("a").tolist() == [0.0]


def test_header_too_long_and_duplicates(tmp_path):
    p = str(tmp_path / "t.safetensors")
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(SafeTensorsError, match="exceeds"):
        SafeTensorsFile(p)
    h = b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"\0")
    with pytest.raises(SafeTensorsError, match="duplicate"):
        SafeTensorsFile(p)


def test_unsupported_dtype_read_refused_by_name(tmp_path):
    p = str(tmp_path / "i.safetensors")
    _raw(p, {"a": {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4)
    st = SafeTensorsFile(p)  # parses
    with pytest.raises(SafeTensorsError, match="I32"):
        st.numpy("a")

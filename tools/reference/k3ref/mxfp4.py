"""compressed-tensors MXFP4 decoding (K3-MODEL §7).

Layout contract: ``weight_packed`` U8 [rows, in/2], byte j of a row holds column 2j in its LOW
nibble and column 2j+1 in its HIGH nibble; ``weight_scale`` U8 [rows, in/32], one E8M0 byte
(bias 127) per 32 consecutive columns. Value = E2M1(nibble) * 2^(scale-127). Every result is an
exact binary fraction, so float64 (and float32 for scale <= 252) holds it without rounding.
Scale 255 (NaN in OCP MX) decodes to a zero block (decision D12).
"""

from __future__ import annotations

import numpy as np

# Index = 4-bit code: bit 3 sign, bits 0-2 magnitude. Code 8 is -0.0 and does occur.
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float64)

GROUP = 32
SCALE_ZERO_BLOCK = 255


def unpack_codes(packed: np.ndarray) -> np.ndarray:
    """[rows, in/2] bytes -> [rows, in] 4-bit codes, low nibble first (even column)."""
    packed = np.asarray(packed, dtype=np.uint8)
    rows, half = packed.shape
    codes = np.empty((rows, half * 2), dtype=np.uint8)
    codes[:, 0::2] = packed & 0x0F
    codes[:, 1::2] = packed >> 4
    return codes


def dequant_mxfp4(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Dequantise to float64 [rows, in]. Validates the shape relation of §5.8."""
    packed = np.asarray(packed)
    scale = np.asarray(scale)
    if packed.dtype != np.uint8 or scale.dtype != np.uint8:
        raise ValueError(f"MXFP4 tensors must be uint8 (got {packed.dtype}, {scale.dtype})")
    if packed.ndim != 2 or scale.ndim != 2:
        raise ValueError("MXFP4 weight_packed and weight_scale must be 2-D")
    if packed.shape[0] != scale.shape[0]:
        raise ValueError(f"row count mismatch: packed {packed.shape} vs scale {scale.shape}")
    if scale.shape[1] * GROUP != packed.shape[1] * 2:
        raise ValueError(f"scale_cols*32 != packed_cols*2: packed {packed.shape}, scale {scale.shape}")
    values = E2M1_VALUES[unpack_codes(packed)]  # [rows, in]
    # 2^(s-127) via ldexp is exact for every byte (0 gives 2^-127, still exact in float64).
    mult = np.ldexp(1.0, scale.astype(np.int64) - 127)
    out = values * np.repeat(mult, GROUP, axis=1)
    # Scale 255: the block contributes nothing; write +0.0 so no -0/NaN leaks out.
    out[np.repeat(scale == SCALE_ZERO_BLOCK, GROUP, axis=1)] = 0.0
    return out


def quantize_codes_to_packed(codes: np.ndarray) -> np.ndarray:
    """Inverse of unpack_codes (test writers): [rows, in] codes 0..15 -> [rows, in/2] bytes."""
    codes = np.asarray(codes, dtype=np.uint8)
    if codes.shape[1] % 2:
        raise ValueError("odd column count")
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)

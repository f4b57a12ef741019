#pragma once
// The numbers inside a synthetic checkpoint: how each tensor's float values are drawn, and how
// they are stored (BF16, F32, MXFP4, or MXFP4-dequantised floats).
//
// Contract: the value of element i of a tensor depends only on its ValueSpec and i (see rng.h),
// so callers may generate any element range, in any order, on any thread, and tests may
// regenerate the exact floats a stored tensor came from.
//
// MXFP4 (K3-MODEL.md §7): groups of 32 consecutive elements of a row share one E8M0 scale byte
// (2^(s-127)); each element is an E2M1 code, the even element in the low nibble of its byte.
// The scale is chosen as the smallest power of two with 6·2^e ≥ max|x| of the group, so the
// group maximum lands on code 3, 4 or 6 (never clipped). This reproduces what the released
// bytes show (group maxima 3.0 / 4.0 / 6.0 in 27% / 56% / 18% of 7,168 real groups,
// conformance/mxfp4.json), unlike the floor(log2 max) − 2 rule of the OCP spec, which gives
// only 4 or 6 and clips. Codes round to nearest, ties to the even code; a negative value that
// rounds to zero keeps its sign (code 8, −0), which real data also contains.

#include <cstddef>
#include <cstdint>

namespace ktier::synth {

enum class ValueKind : uint8_t {
  kNormal,    // mean + stddev · N(0,1)
  kALogRamp,  // A_log: linspace(ramp_lo, ramp_hi, ramp_count) then exact zeros (decision D1)
};

struct ValueSpec {
  uint64_t key = 0;  // stream key (rng.h stream_key)
  ValueKind kind = ValueKind::kNormal;
  float mean = 0.0f;
  float stddev = 1.0f;
  uint32_t ramp_count = 0;
  float ramp_lo = 0.0f;
  float ramp_hi = 0.0f;
};

// How a tensor's values become bytes.
enum class Encoding : uint8_t {
  kBF16,          // round to nearest even
  kF32,
  kMxfp4Packed,   // U8 [rows, cols/2]; always paired with the kMxfp4Scale tensor that follows
  kMxfp4Scale,    // U8 [rows, cols/32]
  kDequantF32,    // the MXFP4 round trip of the values, stored as F32 (exact)
  kDequantBF16,   // the same, stored as BF16 (also exact: E2M1 · 2^k has ≤ 2 significant bits)
};

// Fills out[0..count) with elements first..first+count of the tensor.
void generate_values(const ValueSpec& spec, uint64_t first, size_t count, float* out);

inline constexpr size_t kMxfp4Group = 32;

// E2M1 code → value (bit 3 sign, bits 0-2 magnitude; code 8 is −0).
float e2m1_value(uint8_t code);

// Quantises one group of 32 values: writes 16 packed bytes, returns the scale byte.
// mxfp4_quantize_group uses SSE2 where available; the scalar version is the reference and gives
// identical bytes.
uint8_t mxfp4_quantize_group(const float* x, uint8_t* packed);
uint8_t mxfp4_quantize_group_scalar(const float* x, uint8_t* packed);
// Decodes one group: 16 packed bytes + scale byte → 32 floats (cpu::mxfp4_decode, the engine's
// own decoder: one E2M1 table). Scale 255 gives zeros (D12).
void mxfp4_dequantize_group(const uint8_t* packed, uint8_t scale, float* out);

// Rounds groups of 32 in place through MXFP4 (quantise then dequantise). count % 32 == 0.
void mxfp4_round_trip(float* x, size_t count);

// Histogram of the high byte (sign + top 7 exponent bits) of BF16 values.
struct HighByteHistogram {
  uint64_t count[256] = {};
  void merge(const HighByteHistogram& other) {
    for (int i = 0; i < 256; ++i) count[i] += other.count[i];
  }
  uint64_t total() const;
  double entropy_bits() const;  // Shannon entropy of the distribution, 0 when empty
};

// Stores `count` values as BF16 (2·count bytes) and counts their high bytes in `hist` if given.
void encode_bf16(const float* x, size_t count, uint8_t* out, HighByteHistogram* hist);
void encode_f32(const float* x, size_t count, uint8_t* out);

}  // namespace ktier::synth

#pragma once
// Reading tensor values for what the loader's header checks cannot see — `ktier inspect
// --check-tensors` (llama.cpp's --check-tensors) and the scan that names the weight behind
// non-finite logits (runtime/weight_scan.h):
//  * F32 / BF16 / F16 tensors: NaN and ±Inf elements. No released weight has one; a forward
//    through one computes non-finite logits, so `inspect` exits 3 naming each such tensor.
//  * MXFP4 scales (`…weight_scale`, U8 or F8_E8M0): E8M0 byte 255, NaN in the OCP MX spec,
//    which ktier defines as a zero block (K3-MODEL §7.3, D12). Counted and reported; not an
//    error.
//  * MXFP4 nibbles (`…weight_packed`) are not read: every 4-bit code is a valid E2M1 value.
// Tensors are read in pieces of 8 MiB through SafetensorsFile::read_bytes; `ktier inspect`
// opens the checkpoint with positioned reads (OpenMode::kPread) for this, so that a shard that
// shrank is an I/O error naming it.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "format/checkpoint.h"

namespace ktier::format {

struct TensorValueCounts {
  std::string name;
  std::string shard;             // file name
  uint64_t nan = 0, inf = 0;     // float tensors
  uint64_t scale_255 = 0;        // MXFP4 scale tensors: blocks whose scale byte is 255
  uint64_t first_element = 0;    // the first element counted above (row-major index)
  bool first_is_nan = false;     // ... and whether it is a NaN (float tensors)
};

// Whether any of the `n` elements of `dtype` at `data` (bytes in memory, any alignment) is a
// NaN or ±Inf: F32, BF16 and F16; false for every other dtype (nothing non-finite to hold).
bool has_nonfinite(DType dtype, const void* data, uint64_t n);

// Whether count_tensor_values reads `t`: a float tensor, or an MXFP4 scale tensor.
bool has_checked_values(const TensorInfo& t);

// Counts `t`'s values (of `shard`) into `c` (its name and shard are left to the caller), reading
// 8 MiB at a time into `scratch` (grown as needed, never shrunk or zero-filled again: a caller
// scanning many tensors keeps one). `before_piece(bytes_done)`, when set, is called before each
// read with the bytes of `t` read so far, and may stop the scan by returning an error, which is
// returned. Errors: the shard's read errors (Status::runtime).
Status count_tensor_values(const SafetensorsFile& shard, const TensorInfo& t,
                           TensorValueCounts& c, std::vector<uint8_t>& scratch,
                           const std::function<Status(uint64_t)>& before_piece = nullptr);

struct ValueCheckReport {
  uint64_t tensors_read = 0;     // float tensors and MXFP4 scale tensors
  uint64_t bytes_read = 0;
  uint64_t tensors_skipped = 0;  // MXFP4 nibble tensors (nothing to check)
  uint64_t nan = 0, inf = 0, scale_255 = 0;
  // Every tensor with a NaN or Inf, and every scale tensor with a 255, in shard and file order.
  std::vector<TensorValueCounts> nonfinite, scale_255_tensors;
};

// Total bytes check_tensor_values reads for `ck` (the progress meter's total).
uint64_t value_check_bytes(const Checkpoint& ck);

// Scans `ck`'s used tensors (Checkpoint::used). `progress(bytes_done)` is called after each read
// of at most 8 MiB. Errors: Status::runtime for a read that fails (naming the shard).
Result<ValueCheckReport> check_tensor_values(const Checkpoint& ck,
                                             const std::function<void(uint64_t)>& progress);

}  // namespace ktier::format

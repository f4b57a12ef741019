#pragma once
// How weights are laid out in device memory (GPU mode): each piece (a matrix's elements, an
// MXFP4 matrix's scales, an f32 vector) at the next kDeviceAlign boundary of one range, the
// host bytes copied in unchanged and the weight pointed at the copy. DeviceTrunk places whole
// layers with it, VramExpertTier one expert per slot.

#include <cstdint>
#include <optional>

#include "backend/backend.h"
#include "model/weights.h"

namespace ktier::runtime {

class DevicePlacer {
 public:
  // Places into [base, base + capacity) of `be`'s memory: with a `queue`, copies ahead on that
  // copy queue (Backend::copy_async: the host bytes must stay put until sync_copies or a
  // host_wait on a fence marked after them); without one, upload() now.
  DevicePlacer(backend::Backend& be, uint8_t* base, uint64_t capacity,
               std::optional<backend::Backend::CopyQueue> queue)
      : be_(be), base_(base), capacity_(capacity), queue_(queue) {}

  // Bytes a piece takes when placed.
  static uint64_t bytes(const cpu::WeightMatrix& m) {
    return backend::device_aligned(backend::weight_data_bytes(m)) +
           backend::device_aligned(backend::weight_scale_bytes(m));
  }
  static uint64_t bytes(const model::F32Vec& v) {
    return backend::device_aligned(v.size() * sizeof(float));
  }

  // Copies the piece in and repoints it. Status::runtime when the range is too small (a bug in
  // the caller's sizing, reported rather than overrunning), or the backend's error.
  Status place(cpu::WeightMatrix& m) {
    KTIER_RETURN_IF_ERROR(put(m.data, backend::weight_data_bytes(m), &m.data));
    if (!m.scales) return Status::ok();
    const void* scales = nullptr;
    KTIER_RETURN_IF_ERROR(put(m.scales, backend::weight_scale_bytes(m), &scales));
    m.scales = static_cast<const uint8_t*>(scales);
    return Status::ok();
  }
  Status place(model::F32Vec& v) {
    const void* p = nullptr;
    const size_t n = v.size();
    KTIER_RETURN_IF_ERROR(put(v.data(), n * sizeof(float), &p));
    v = model::F32Vec::view(static_cast<const float*>(p), n);
    return Status::ok();
  }
  uint64_t used() const { return used_; }

 private:
  Status put(const void* src, uint64_t n, const void** placed) {
    if (used_ + backend::device_aligned(n) > capacity_)
      return Status::runtime("device placement: " + std::to_string(n) + " bytes do not fit in " +
                             "the " + std::to_string(capacity_ - used_) + " bytes left");
    uint8_t* dst = base_ + used_;
    if (n > 0)
      KTIER_RETURN_IF_ERROR(queue_ ? be_.copy_async(*queue_, dst, src, n) : be_.upload(dst, src, n));
    used_ += backend::device_aligned(n);
    *placed = dst;
    return Status::ok();
  }

  backend::Backend& be_;
  uint8_t* base_;
  uint64_t capacity_, used_ = 0;
  std::optional<backend::Backend::CopyQueue> queue_;
};

}  // namespace ktier::runtime

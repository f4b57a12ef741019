#pragma once
// Measuring helpers shared by the `ktier bench` subcommands.

#include <cstdint>

#include "common/status.h"
#include "io/aligned_buffer.h"
#include "io/read_file.h"

namespace ktier::cli {

// Reads the first `bytes` of `f` (at most its size) front to back with synchronous pread() calls
// of buf.size() bytes (O_DIRECT when `f` was opened so) and returns GB/s (1e9 bytes per second).
// Status::runtime naming the file and offset on a failed read.
Result<double> raw_read_gbps(const io::ReadFile& f, io::AlignedBuffer& buf, uint64_t bytes);

}  // namespace ktier::cli

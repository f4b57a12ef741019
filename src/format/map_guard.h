#pragma once
// A mapped file that shrinks (truncated or rewritten while ktier runs) turns every read of its
// lost pages into SIGBUS. The guard names the file instead of crashing: mapped regions are
// registered here, and a SIGBUS handler that finds the faulting address in one of them prints
// "ktier: error: FILE: its bytes at offset N can no longer be read (...)" and exits 1 (the
// documented runtime code). Any other SIGBUS goes to the action installed before (by default
// a core dump).
//
// Thread-safety: register/unregister may be called from any thread; the handler only reads
// the table with atomic loads and calls async-signal-safe functions (write, _exit).

#include <cstddef>
#include <string>

namespace ktier::format {

// Records [base, base + bytes) as the mapping of `path` and installs the handler on first use.
// Returns a slot for unregister_mapping, or -1 when the table is full (the region is then
// simply not named: the default SIGBUS action applies to it).
int register_mapping(const void* base, size_t bytes, const std::string& path);
void unregister_mapping(int slot);

// A line the SIGBUS exit above writes after its error, for what the exit leaves behind (a trace
// without its footer); at most 1 KiB (longer is cut). An empty line clears it. Set from one
// thread at a time.
void set_exit_note(const std::string& line);

}  // namespace ktier::format

#pragma once
// A catalogue of every cpu/ op on random inputs, for the bitwise invariance tests: the same case
// run under two Execs (scalar vs AVX2, or 1 vs 2 vs 3 threads) must write identical bytes.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cpu/kernels.h"

namespace ktier::cpu::test {

struct OpCase {
  std::string name;
  bool threaded = false;           // splits work over the pool
  std::vector<int64_t> out_sizes;  // float outputs (ints are stored bit-for-bit as floats)
  // Runs the op, writing every output buffer (in/out state is re-seeded from the case's own
  // copy on each run, so runs are independent).
  std::function<void(const Exec&, const std::vector<float*>& outs)> run;
};

struct CaseOptions {
  uint64_t seed = 1;
  bool specials = false;  // put NaN, +-Inf and subnormals into the inputs
  bool large = false;     // sizes that give several chunks per op (thread tests)
};

// Odd sizes (1, 17, 54, 97, one past a block) for every op, every weight type and both
// SiTU forms; `large` switches to sizes that split into several ranges.
std::vector<OpCase> make_op_cases(const CaseOptions& opt);

// The linear op alone over every tile shape a vector kernel has: rows 1-5, 8, 9, 13 (whole
// tiles of 4 and 2 plus leftovers), tokens 1-5 and 7, float widths around multiples of 16 (tails
// of 0-15 elements) and MXFP4 widths of 1-17 blocks. MXFP4 scale patterns: no zero block (the
// branch-free decode path everywhere), a zero block in the last row only (one tile falls back),
// zero blocks and scale 0 every 7th block, and extreme scales (0, 1, 2, 127, 253, 254: subnormal
// and overflowing block products) without zero blocks; with `specials`, NaN/Inf in x under a
// zero block. Every case plants a cancelling +-2^48 pair (MXFP4: unless the only block).
std::vector<OpCase> make_linear_sweep_cases(const CaseOptions& opt);

// Runs `c` under `ex` into fresh output buffers poisoned with kPoisonBits (plus a poisoned guard
// after each). Fails the current test if any output element or guard is left unwritten/written.
std::vector<std::vector<float>> run_poisoned(const OpCase& c, const Exec& ex);

}  // namespace ktier::cpu::test

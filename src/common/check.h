#pragma once
// KTIER_CHECK: for bugs only (broken invariants, impossible shapes). Prints the expression,
// file:line and function, then aborts. Anything the input or the environment can cause must
// return a Status instead (status.h).

#include <cstdio>
#include <cstdlib>

#define KTIER_CHECK(cond)                                                              \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "ktier: CHECK failed: %s at %s:%d in %s\n", #cond, __FILE__, \
                   __LINE__, __func__);                                                \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

#define KTIER_CHECK_MSG(cond, msg)                                                         \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "ktier: CHECK failed: %s (%s) at %s:%d in %s\n", #cond, (msg),   \
                   __FILE__, __LINE__, __func__);                                          \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

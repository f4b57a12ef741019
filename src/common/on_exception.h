#pragma once
// A clean-up that runs only when its scope is left by an exception (not on a return): for state
// an error Status path already restores and an exception (std::bad_alloc) would otherwise leave
// half-changed. The clean-up runs during unwinding, so it must not throw (what it allocates, it
// must catch itself).
//
// Thread-safety: a scope's own object; not shared.

#include <exception>
#include <utility>

namespace ktier {

template <class F>
class OnException {
 public:
  explicit OnException(F clean_up) : clean_up_(std::move(clean_up)) {}
  OnException(const OnException&) = delete;
  OnException& operator=(const OnException&) = delete;
  ~OnException() {
    if (std::uncaught_exceptions() != exceptions_) clean_up_();
  }

 private:
  F clean_up_;
  const int exceptions_ = std::uncaught_exceptions();
};

}  // namespace ktier

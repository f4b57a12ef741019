#pragma once
// Status and Result<T>: how failures the environment or the input can cause travel up to main().
// Bugs (broken invariants) use KTIER_CHECK in check.h instead and abort.
//
// Every Status carries the process exit code it maps to (docs/ARCHITECTURE.md, "Exit codes"):
//   0 ok, 1 runtime / I-O failure, 2 usage or config error, 3 corrupt or inconsistent input,
//   4 a budget that cannot be met; 130 a run stopped by Ctrl-C (SIGINT), as shells report one.
// Messages name the file, tensor or field at fault, and where the cause is known, what to do.

#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace ktier {

enum class ExitCode : int {
  kOk = 0,
  kRuntime = 1,   // I/O failure, resource failure at run time
  kUsage = 2,     // bad command line, bad or inconsistent config.json
  kCorrupt = 3,   // corrupt or inconsistent checkpoint bytes / headers / packs
  kBudget = 4,    // a memory budget that cannot hold the minimum working set
  kInterrupted = 130,  // stopped at a clean point by Ctrl-C (common/interrupt.h): not an error
};

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  static Status ok() { return Status(); }
  static Status runtime(std::string msg) { return Status(ExitCode::kRuntime, std::move(msg)); }
  static Status usage(std::string msg) { return Status(ExitCode::kUsage, std::move(msg)); }
  static Status corrupt(std::string msg) { return Status(ExitCode::kCorrupt, std::move(msg)); }
  static Status budget(std::string msg) { return Status(ExitCode::kBudget, std::move(msg)); }
  static Status interrupted(std::string msg) {
    return Status(ExitCode::kInterrupted, std::move(msg));
  }
  // A runtime failure because an allocation was refused (a backend's allocate(): the host, the
  // GPU). Mid-run it is exit 1 like any other; a caller reserving memory up front may read
  // is_out_of_memory() and say what to give less of (exit 4), as serve does for its -c state
  // and run for its sequence's caches.
  static Status out_of_memory(std::string msg) {
    Status s(ExitCode::kRuntime, std::move(msg));
    s.out_of_memory_ = true;
    return s;
  }

  bool is_ok() const { return code_ == ExitCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  ExitCode code() const { return code_; }
  int exit_code() const { return static_cast<int>(code_); }
  const std::string& message() const { return message_; }
  bool is_out_of_memory() const { return out_of_memory_; }

  // Prefixes context ("while reading X: ") without changing the code (nor is_out_of_memory()).
  Status with_context(const std::string& context) const {
    if (is_ok()) return *this;
    Status s = *this;
    s.message_ = context + ": " + message_;
    return s;
  }
  // Appends a sentence ("MESSAGE. NOTE") without changing the code (nor is_out_of_memory()).
  Status with_note(const std::string& note) const {
    if (is_ok()) return *this;
    Status s = *this;
    s.message_ += ". " + note;
    return s;
  }

 private:
  Status(ExitCode code, std::string msg) : code_(code), message_(std::move(msg)) {}
  ExitCode code_ = ExitCode::kOk;
  std::string message_;
  bool out_of_memory_ = false;
};

// Result<T>: a value or a non-ok Status. Accessing value() of an error is a bug (aborts).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                 // NOLINT(implicit)
  Result(Status status) : v_(std::move(status)) {           // NOLINT(implicit)
    if (std::get<Status>(v_).is_ok()) std::abort();         // an ok Status carries no value
  }
  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & {
    if (!is_ok()) std::abort();
    return std::get<T>(v_);
  }
  const T& value() const& {
    if (!is_ok()) std::abort();
    return std::get<T>(v_);
  }
  T&& value() && {
    if (!is_ok()) std::abort();
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace ktier

#define KTIER_CONCAT_INNER(a, b) a##b
#define KTIER_CONCAT(a, b) KTIER_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` is not ok.
#define KTIER_RETURN_IF_ERROR(expr)                  \
  do {                                               \
    ::ktier::Status ktier_status_ = (expr);          \
    if (!ktier_status_.is_ok()) return ktier_status_; \
  } while (0)

// `KTIER_ASSIGN_OR_RETURN(auto x, make_x());` unwraps a Result<T> or returns its Status.
#define KTIER_ASSIGN_OR_RETURN(lhs, expr)                                   \
  auto KTIER_CONCAT(ktier_result_, __LINE__) = (expr);                      \
  if (!KTIER_CONCAT(ktier_result_, __LINE__).is_ok())                       \
    return KTIER_CONCAT(ktier_result_, __LINE__).status();                  \
  lhs = std::move(KTIER_CONCAT(ktier_result_, __LINE__)).value()

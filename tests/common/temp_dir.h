#pragma once
// A fresh, empty folder under the system temp folder for one test's files.

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <system_error>

namespace ktier::test {

// Made at construction (temp/ktier_test_<tag>_<pid>_<n>, emptied first); removed with all it
// holds by the destructor, also of a static instance at exit. Only by the process that made
// it: a death test's forked child that ends through exit() runs static destructors too, and
// must not remove the folder its parent goes on using. Not copyable.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) : owner_(::getpid()) {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("ktier_test_" + tag + "_" + std::to_string(owner_) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    if (::getpid() != owner_) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  pid_t owner_;
  std::filesystem::path path_;
};

}  // namespace ktier::test

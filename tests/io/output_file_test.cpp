// io::check_can_write and io::write_output_file: outputs are probed before the work without
// being changed, written whole after it, and a path that is our own stdout is appended to.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <csignal>

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "common/interrupt.h"
#include "io/output_file.h"
#include "tests/common/sigint_disposition.h"

namespace ktier::io::test {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class OutputFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ktier-output-file-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  size_t entries() const {
    return static_cast<size_t>(std::distance(fs::directory_iterator(dir_), {}));
  }
  fs::path dir_;
};

TEST_F(OutputFileTest, EmptyPathMeansNoOutput) { EXPECT_TRUE(check_can_write("--json", "")); }

TEST_F(OutputFileTest, FolderAndMissingFolderAreRefusedNamingFlagAndPath) {
  Status s = check_can_write("--json", dir_.string());
  EXPECT_EQ(s.code(), ExitCode::kUsage);
  EXPECT_EQ(s.message(), "--json: cannot write " + dir_.string() + ": it is a directory");
  const std::string missing = (dir_ / "no-such-folder" / "r.json").string();
  s = check_can_write("--csv", missing);
  EXPECT_EQ(s.code(), ExitCode::kRuntime);
  EXPECT_NE(s.message().find("--csv: cannot write " + missing + ": "), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("ENOENT"), std::string::npos) << s.message();
}

TEST_F(OutputFileTest, LoopsLongNamesAndFilesAsFoldersAreRefusedAtOnce) {
  fs::create_symlink("loop-b", dir_ / "loop-a");
  fs::create_symlink("loop-a", dir_ / "loop-b");
  EXPECT_EQ(check_can_write("--json", (dir_ / "loop-a").string()).code(), ExitCode::kRuntime);
  EXPECT_EQ(check_can_write("--json", (dir_ / std::string(300, 'n')).string()).code(),
            ExitCode::kRuntime);
  std::ofstream(dir_ / "file") << "x";
  EXPECT_EQ(check_can_write("--json", (dir_ / "file" / "r.json").string()).code(),
            ExitCode::kRuntime);
}

TEST_F(OutputFileTest, ProbeChangesNothingAndWriteReplaces) {
  const fs::path existing = dir_ / "old.json";
  std::ofstream(existing) << "old contents";
  ASSERT_TRUE(check_can_write("--json", existing.string()));
  EXPECT_EQ(slurp(existing), "old contents");  // not truncated by the probe
  const fs::path fresh = dir_ / "new.json";
  ASSERT_TRUE(check_can_write("--json", fresh.string()));
  EXPECT_FALSE(fs::exists(fresh));
  EXPECT_EQ(entries(), 1u);  // the probe file was removed

  ASSERT_TRUE(write_output_file(existing.string(), "new"));
  EXPECT_EQ(slurp(existing), "new");
  ASSERT_TRUE(write_output_file(fresh.string(), std::string("a\0b", 3)));
  EXPECT_EQ(slurp(fresh), std::string("a\0b", 3));
}

TEST_F(OutputFileTest, DanglingSymlinkIsWrittenThrough) {
  const fs::path target = dir_ / "target.csv";
  const fs::path link = dir_ / "link.csv";
  fs::create_symlink(target.filename(), link);  // relative, resolved beside the link
  ASSERT_TRUE(check_can_write("--csv", link.string()));
  EXPECT_FALSE(fs::exists(target));
  ASSERT_TRUE(write_output_file(link.string(), "x,y\n"));
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(slurp(target), "x,y\n");
}

// Output folders (synth -o, pack -o): parents made, an existing folder fine, a dangling
// symlink's folder created, and a failure names the path.
TEST_F(OutputFileTest, OutputFoldersAreCreatedThroughDanglingSymlinks) {
  ASSERT_TRUE(create_output_dir(dir_ / "a" / "b"));
  EXPECT_TRUE(fs::is_directory(dir_ / "a" / "b"));
  ASSERT_TRUE(create_output_dir(dir_ / "a"));
  fs::create_symlink("made-later", dir_ / "link");
  ASSERT_TRUE(create_output_dir(dir_ / "link"));
  EXPECT_TRUE(fs::is_directory(dir_ / "made-later"));
  fs::create_symlink("chain-2", dir_ / "chain-1");  // two links, then nothing
  fs::create_symlink("chain-end", dir_ / "chain-2");
  ASSERT_TRUE(create_output_dir(dir_ / "chain-1"));
  EXPECT_TRUE(fs::is_directory(dir_ / "chain-end"));
  fs::create_symlink("slash-target", dir_ / "slash-link");
  ASSERT_TRUE(create_output_dir((dir_ / "slash-link").string() + "/"));  // "-o link/"
  EXPECT_TRUE(fs::is_directory(dir_ / "slash-target"));
  EXPECT_TRUE(fs::is_symlink(dir_ / "link"));
  std::ofstream(dir_ / "file") << "x";
  const Status s = create_output_dir(dir_ / "file" / "sub");
  EXPECT_EQ(s.code(), ExitCode::kRuntime);
  EXPECT_EQ(s.message().rfind("cannot create " + (dir_ / "file" / "sub").string() + ": ", 0), 0u)
      << s.message();
}

// A binary stream to our own stdout (redirected to a file) is refused; /dev/null is not.
TEST_F(OutputFileTest, BinaryOutputToOwnStdoutIsRefused) {
  const fs::path redirected = dir_ / "stdout.txt";
  std::fflush(stdout);
  const int saved = ::dup(STDOUT_FILENO);
  const int fd = ::open(redirected.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::dup2(fd, STDOUT_FILENO), STDOUT_FILENO);
  ::close(fd);
  const Status to_file = check_not_own_stdout("--trace", redirected.string());
  const Status to_link = check_not_own_stdout("--trace", "/dev/stdout");
  ::dup2(saved, STDOUT_FILENO);
  ::close(saved);
  EXPECT_EQ(to_file.code(), ExitCode::kUsage);
  EXPECT_EQ(to_file.message(), "--trace: " + redirected.string() +
                                   " is this process's own standard output: give a file of its "
                                   "own (the output is binary)");
  EXPECT_EQ(to_link.code(), ExitCode::kUsage);
  EXPECT_TRUE(check_not_own_stdout("--trace", "/dev/null"));
  EXPECT_TRUE(check_not_own_stdout("--trace", (dir_ / "other").string()));
  EXPECT_TRUE(check_not_own_stdout("--trace", ""));
}

TEST_F(OutputFileTest, ProcIsRefusedBeforeTheWork) {
  const Status s = check_can_write("--json", "/proc/ktier-output-file-test.json");
  EXPECT_EQ(s.code(), ExitCode::kUsage);
  // Existing /proc and /sys files open for writing (and, as root, change kernel settings).
  for (const char* file : {"/proc/self/status", "/proc/sys/kernel/hostname"}) {
    const Status e = check_can_write("--json", file);
    EXPECT_EQ(e.code(), ExitCode::kUsage) << file;
    EXPECT_NE(e.message().find("/proc and /sys are not for output files"), std::string::npos)
        << e.message();
  }
}

// The output named is the file stdout is redirected to (`--json out > out`, /dev/stdout):
// what was printed before stays, the output follows it.
TEST_F(OutputFileTest, OwnStdoutIsAppendedToNotTruncated) {
  const fs::path redirected = dir_ / "stdout.txt";
  std::fflush(stdout);
  const int saved = ::dup(STDOUT_FILENO);
  ASSERT_GE(saved, 0);
  const int fd = ::open(redirected.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::dup2(fd, STDOUT_FILENO), STDOUT_FILENO);
  ::close(fd);
  std::fputs("table printed first\n", stdout);
  const Status written = write_output_file(redirected.string(), "{\"json\": 1}\n");
  std::fflush(stdout);
  ::dup2(saved, STDOUT_FILENO);
  ::close(saved);
  ASSERT_TRUE(written) << written.message();
  EXPECT_EQ(slurp(redirected), "table printed first\n{\"json\": 1}\n");
}

// A FIFO output waits for its reader, as any writer's open does (a reader that comes later gets
// the bytes), but Ctrl-C under a live InterruptRequest ends the wait: it blocked in open(),
// past the first Ctrl-C (a probe's find: `run --report-json FIFO` with no reader).
TEST_F(OutputFileTest, AFifoWaitsForItsReaderUntilCtrlC) {
  const fs::path fifo = dir_ / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  std::string read_back;
  std::thread reader([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // after the writer's open
    read_back = slurp(fifo);
  });
  const Status written = write_output_file(fifo.string(), "{\"json\": 1}\n");
  reader.join();
  ASSERT_TRUE(written) << written.message();
  EXPECT_EQ(read_back, "{\"json\": 1}\n");

  ktier::test::SigintDisposition default_action(SIG_DFL);  // a background job inherits SIG_IGN
  InterruptRequest interrupt("(test: Ctrl-C)\n");
  // Ctrl-C while it waits ends the wait. (Should it not, a reader comes after 10 s: the test
  // then fails instead of hanging.)
  std::atomic<bool> returned{false};
  std::thread ctrl_c([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ::raise(SIGINT);
    for (int i = 0; i < 1000 && !returned; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!returned) slurp(fifo);
  });
  const Result<std::FILE*> stopped = open_output_stream(fifo.string(), "cannot open");
  returned = true;
  if (stopped.is_ok()) std::fclose(*stopped);
  ctrl_c.join();
  ASSERT_FALSE(stopped.is_ok());
  EXPECT_EQ(stopped.status().code(), ExitCode::kInterrupted) << stopped.status().message();
  EXPECT_NE(stopped.status().message().find("waiting for a process to read " + fifo.string()),
            std::string::npos)
      << stopped.status().message();
  // A Ctrl-C made before the call (a run stopped, writing its report) does not end the wait.
  std::string report;
  std::thread late_reader([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    report = slurp(fifo);
  });
  const Status kept = write_output_file(fifo.string(), "report\n");
  late_reader.join();
  EXPECT_TRUE(kept) << kept.message();
  EXPECT_EQ(report, "report\n");
}

}  // namespace
}  // namespace ktier::io::test

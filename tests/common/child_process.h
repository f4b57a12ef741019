#pragma once
// A child process the test talks to while it runs (signals, input written as output arrives),
// for what run_process.h cannot do. stdin, stdout and stderr are pipes; SIGINT and SIGPIPE are
// set to their defaults in the child whatever the test inherited (a background job of a script
// ignores SIGINT, and an ignored signal stays ignored across exec). Not thread-safe.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace ktier::test {

class ChildProcess {
 public:
  enum class Stream { kOut, kErr };

  explicit ChildProcess(const std::vector<std::string>& argv) {
    // Built before fork(): the child of a multi-threaded test may not allocate.
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    int in[2], out[2], err[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 ||
        ::pipe2(err, O_CLOEXEC) != 0)
      return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGPIPE, SIG_DFL);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    ::close(err[1]);
    in_ = in[1];
    out_ = out[0];
    err_ = err[0];
  }
  ~ChildProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    for (int fd : {in_, out_, err_})
      if (fd >= 0) ::close(fd);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  bool started() const { return pid_ > 0; }

  // Reads both pipes until `done()` (true), or they close or the timeout passes (false).
  bool wait_until(const std::function<bool()>& done,
                  std::chrono::seconds timeout = std::chrono::seconds(120)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !read_some(static_cast<int>(left.count()))) return false;
    }
    return true;
  }
  // Until `needle` appears in `stream` at or after byte `from` of it.
  bool wait_for(Stream stream, const std::string& needle, size_t from = 0) {
    const std::string& text = stream == Stream::kOut ? out_text_ : err_text_;
    return wait_until([&] { return text.find(needle, std::min(from, text.size())) != text.npos; });
  }
  // False if the child no longer reads (its end closed: EPIPE, not SIGPIPE, in the test).
  bool write_stdin(const std::string& s) {
    struct sigaction ignore {}, previous {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, &previous);
    const bool ok =
        in_ >= 0 && ::write(in_, s.data(), s.size()) == static_cast<ssize_t>(s.size());
    ::sigaction(SIGPIPE, &previous, nullptr);
    return ok;
  }
  void close_stdin() {
    if (in_ >= 0) ::close(in_);
    in_ = -1;
  }
  void signal(int sig) { ::kill(pid_, sig); }
  // Reads what is left and reaps the child: its exit status, 128 + N when killed by signal N,
  // -1 if it did not end within the timeout (then killed).
  int wait(std::chrono::seconds timeout = std::chrono::seconds(120)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (out_ >= 0 || err_ >= 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        ::kill(pid_, SIGKILL);
        break;
      }
      read_some(static_cast<int>(left.count()));
    }
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
    term_signal_ = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    status_ = WIFEXITED(status) ? WEXITSTATUS(status)
              : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
    if (std::chrono::steady_clock::now() > deadline) status_ = -1;
    return status_;
  }
  const std::string& out() const { return out_text_; }
  int term_signal() const { return term_signal_; }  // the signal that ended it, 0 if it exited
  const std::string& err() const { return err_text_; }

 private:
  // One poll of the open pipes; false once both are closed or nothing came in `ms`.
  bool read_some(int ms) {
    pollfd fds[2] = {{out_, POLLIN, 0}, {err_, POLLIN, 0}};
    if (out_ < 0 && err_ < 0) return false;
    const int ready = ::poll(fds, 2, ms);
    if (ready <= 0) return ready < 0 && errno == EINTR;
    int* fd[2] = {&out_, &err_};
    std::string* text[2] = {&out_text_, &err_text_};
    for (int i = 0; i < 2; ++i) {
      if (*fd[i] < 0 || fds[i].revents == 0) continue;
      char buf[4096];
      const ssize_t n = ::read(*fd[i], buf, sizeof buf);
      if (n > 0) {
        text[i]->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(*fd[i]);
        *fd[i] = -1;
      }
    }
    return true;
  }

  pid_t pid_ = -1;
  int in_ = -1, out_ = -1, err_ = -1;
  int status_ = -1;
  bool reaped_ = false;
  int term_signal_ = 0;
  std::string out_text_, err_text_;
};

}  // namespace ktier::test

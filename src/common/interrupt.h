#pragma once
// Ctrl-C for work that can stop at a clean point (`ktier run`: between tokens, or between layers
// where nothing is saved), as llama.cpp users expect: the first SIGINT only asks, and the work
// ends at its next such point with its output and report; a second SIGINT ends the process at
// once, as if nothing were installed.
//
// While an InterruptRequest lives, SIGINT sets a process-wide flag (requested()), writes the
// current notice to stderr, makes wake_fd() readable, and puts the previous disposition back
// (the second Ctrl-C). The signal may land on any thread (worker threads do not block it) and
// interrupted system calls restart (SA_RESTART), so a wait for input that should end on Ctrl-C
// polls wake_fd() too.
// Thread-safety: requested() may be called from any thread; everything else from the thread
// that owns the request. One request per process at a time (a second is a bug, CHECKed).

namespace ktier {

class InterruptRequest {
 public:
  // `notice`: the line written when Ctrl-C arrives (static storage; see set_notice).
  explicit InterruptRequest(const char* notice);
  ~InterruptRequest();  // the disposition from before, the flag cleared
  InterruptRequest(const InterruptRequest&) = delete;
  InterruptRequest& operator=(const InterruptRequest&) = delete;

  static bool requested();
  // What SIGINT does (the flag, the notice, wake_fd()), for another signal's handler (serve's
  // SIGTERM); async-signal-safe. Leaves SIGINT's disposition as it is. Nothing without a live
  // request. True when a stop had been requested already (then nothing more is done): the
  // caller's second signal, even one handled at the same time as the first on another thread.
  static bool request_from_signal_handler();
  // Readable once Ctrl-C has arrived (a pipe's read end; -1 if the pipe could not be made, and
  // then only requested() tells).
  int wake_fd() const;
  // The line for the next Ctrl-C; `notice` must outlive the request (a string literal).
  void set_notice(const char* notice);
  // After an interruption was handled and the work goes on (a conversation's next message):
  // clears the flag, drains wake_fd() and catches the next Ctrl-C again.
  void rearm();

 private:
  void install();
};

}  // namespace ktier

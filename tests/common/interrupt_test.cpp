// InterruptRequest (common/interrupt.h) in this process: the first SIGINT asks, the second goes
// to what was installed before; an ignored SIGINT stays ignored.
#include "common/interrupt.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>

#include "tests/common/sigint_disposition.h"

namespace ktier {
namespace {

int g_previous_calls = 0;
void count_previous(int) { ++g_previous_calls; }

using Disposition = test::SigintDisposition;

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

TEST(InterruptRequest, FirstSigintAsksSecondGoesToThePreviousHandler) {
  Disposition previous(count_previous);
  g_previous_calls = 0;
  {
    InterruptRequest interrupt(nullptr);
    ASSERT_GE(interrupt.wake_fd(), 0);
    EXPECT_FALSE(InterruptRequest::requested());
    EXPECT_FALSE(readable(interrupt.wake_fd()));
    ::raise(SIGINT);
    EXPECT_TRUE(InterruptRequest::requested());
    EXPECT_TRUE(readable(interrupt.wake_fd()));
    EXPECT_EQ(g_previous_calls, 0);
    ::raise(SIGINT);  // the second: the previous disposition, ours removed itself
    EXPECT_EQ(g_previous_calls, 1);

    interrupt.rearm();  // caught again, the request cleared and the pipe drained
    EXPECT_FALSE(InterruptRequest::requested());
    EXPECT_FALSE(readable(interrupt.wake_fd()));
    ::raise(SIGINT);
    EXPECT_TRUE(InterruptRequest::requested());
    EXPECT_EQ(g_previous_calls, 1);
  }
  // Gone: the previous disposition again, the request cleared.
  EXPECT_FALSE(InterruptRequest::requested());
  ::raise(SIGINT);
  EXPECT_EQ(g_previous_calls, 2);
  // A request that never saw a signal also puts the previous one back.
  { InterruptRequest interrupt(nullptr); }
  ::raise(SIGINT);
  EXPECT_EQ(g_previous_calls, 3);
}

// Another signal's handler (serve's SIGTERM) learns whether a stop was requested already, in
// one step: of two signals handled at once on two threads, one sees the other's and quits.
// The wake pipe outlives the request (a handler still running as it ends writes into it, not
// into a reused descriptor); the next request starts with it drained.
TEST(InterruptRequest, AHandlerLearnsOfAnEarlierRequestAndThePipeOutlivesTheRequest) {
  EXPECT_FALSE(InterruptRequest::request_from_signal_handler()) << "no live request: nothing";
  int wake = -1;
  {
    InterruptRequest interrupt(nullptr);
    wake = interrupt.wake_fd();
    ASSERT_GE(wake, 0);
    EXPECT_FALSE(InterruptRequest::request_from_signal_handler());
    EXPECT_TRUE(InterruptRequest::requested());
    EXPECT_TRUE(InterruptRequest::request_from_signal_handler());
  }
  EXPECT_FALSE(InterruptRequest::request_from_signal_handler());
  ASSERT_TRUE(readable(wake)) << "still open: the byte of the first request is there";
  InterruptRequest next(nullptr);
  EXPECT_EQ(next.wake_fd(), wake);
  EXPECT_FALSE(readable(next.wake_fd()));
  EXPECT_FALSE(InterruptRequest::requested());
}

TEST(InterruptRequest, IgnoredSigintStaysIgnored) {
  Disposition ignored(SIG_IGN);
  InterruptRequest interrupt(nullptr);
  ::raise(SIGINT);
  EXPECT_FALSE(InterruptRequest::requested());
  interrupt.rearm();
  ::raise(SIGINT);
  EXPECT_FALSE(InterruptRequest::requested());
  struct sigaction now {};
  ::sigaction(SIGINT, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_IGN);
}

}  // namespace
}  // namespace ktier

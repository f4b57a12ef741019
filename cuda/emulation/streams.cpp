// Streams and events of the host emulation (streams.h): each stream a queue of work, each event
// a point in one stream's queue, and work run only when a host wait needs it.
#include "streams.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

namespace ktier_emu {
namespace {

struct Queue {
  uint64_t number = 0;  // creation order: others-first visits queues in it
  std::deque<std::function<void()>> pending;
  uint64_t queued = 0;  // items ever queued
  uint64_t done = 0;    // items run: the first `done` of them
  bool running = false;
};

// A recorded event: the point of its stream's queue it completes at (an event never recorded
// is complete).
struct Event {
  std::shared_ptr<Queue> queue;
  uint64_t point = 0;
};

struct Scheduler {
  std::mutex mu;  // everything below, and the running of work: one host thread at a time
  std::shared_ptr<Queue> default_stream = std::make_shared<Queue>();
  std::map<cudaStream_t, std::shared_ptr<Queue>> streams;
  std::map<cudaEvent_t, Event> events;
  uint64_t next_number = 1;
  std::mt19937_64 random;  // Order::kRandom's draws, seeded when the order becomes random:SEED
  std::string seeded_with;  // that order's text; empty while another order is in force
};
Scheduler& sched() {
  static Scheduler* s = new Scheduler;  // never destroyed: streams may outlive static objects
  return *s;
}

std::shared_ptr<Queue> find_queue(Scheduler& s, cudaStream_t stream) {
  if (!stream) return s.default_stream;
  const auto it = s.streams.find(stream);
  return it == s.streams.end() ? nullptr : it->second;
}

// Runs q's work until `point` items of it ran (mu held). An item that waits for an event runs
// the event's stream up to the event's point first (a past point: no cycle can form).
// noexcept: work that throws (std::bad_alloc) ends the process rather than leaving a queue half
// run.
void run_through(Queue& q, uint64_t point) noexcept {
  if (q.done >= point) return;
  if (q.running) {
    std::fprintf(stderr, "ktier CUDA emulation: a stream's work waits for itself\n");
    std::abort();
  }
  q.running = true;
  while (q.done < point) {
    std::function<void()> work = std::move(q.pending.front());
    q.pending.pop_front();
    work();
    ++q.done;
  }
  q.running = false;
}

// The queues other than `except` (none: all), in creation order (the default stream first).
std::vector<std::shared_ptr<Queue>> queues(Scheduler& s, const Queue* except) {
  std::vector<std::shared_ptr<Queue>> all;
  if (s.default_stream.get() != except) all.push_back(s.default_stream);
  for (const auto& [handle, q] : s.streams)
    if (q.get() != except) all.push_back(q);
  std::sort(all.begin(), all.end(),
            [](const auto& a, const auto& b) { return a->number < b->number; });
  return all;
}

void run_all(Scheduler& s) {
  for (const auto& q : queues(s, nullptr)) run_through(*q, q->queued);
}

// kRandom: a point of q from `point` to the end of its queue, drawn (mu held; at a host wait,
// when no queue is running, so any point can be reached).
uint64_t random_point_from(Scheduler& s, const Queue& q, uint64_t point) {
  const char* v = std::getenv("KTIER_CUDA_EMULATION_ORDER");
  const std::string seed = v ? v : "random:0";
  if (seed != s.seeded_with) {
    s.random.seed(std::stoull(seed.substr(seed.find(':') + 1)));
    s.seeded_with = seed;
  }
  point = std::max(point, q.done);
  return point + s.random() % (q.queued - point + 1);
}

// The host waits until q has run `point` items (mu held).
void host_waits(Scheduler& s, Queue& q, uint64_t point) {
  const Order o = order();
  if (o != Order::kRandom) s.seeded_with.clear();  // random:SEED set again draws from the start
  if (q.done >= point) return;
  switch (o) {
    case Order::kOthersFirst:
      for (const auto& other : queues(s, &q)) run_through(*other, other->queued);
      break;
    case Order::kRandom:
      for (const auto& other : queues(s, &q))
        run_through(*other, random_point_from(s, *other, other->done));
      point = random_point_from(s, q, point);
      break;
    default:
      break;
  }
  run_through(q, point);
}

cudaError_t queue_work(Scheduler& s, cudaStream_t stream, std::function<void()> work,
                       bool wait) {
  const std::shared_ptr<Queue> q = find_queue(s, stream);
  if (!q) return fail(cudaErrorInvalidResourceHandle);
  q->pending.push_back(std::move(work));
  ++q->queued;
  if (wait || order() == Order::kSync) host_waits(s, *q, q->queued);
  return cudaSuccess;
}

template <class T>
T new_handle() {
  return static_cast<T>(std::malloc(1));  // a unique address, never dereferenced
}

}  // namespace

Order order() {
  const char* v = std::getenv("KTIER_CUDA_EMULATION_ORDER");
  if (!v || !*v || std::strcmp(v, "late") == 0) return Order::kLate;
  if (std::strcmp(v, "sync") == 0) return Order::kSync;
  if (std::strcmp(v, "others-first") == 0) return Order::kOthersFirst;
  if (std::strncmp(v, "random:", 7) == 0 && v[7] >= '0' && v[7] <= '9' &&
      std::strspn(v + 7, "0123456789") == std::strlen(v + 7) && std::strlen(v + 7) <= 19)
    return Order::kRandom;
  std::fprintf(stderr, "ktier CUDA emulation: KTIER_CUDA_EMULATION_ORDER=%s: not one of "
               "sync, late, others-first, random:SEED\n", v);
  std::abort();
}

cudaError_t enqueue(cudaStream_t s, std::function<void()> work) {
  Scheduler& sc = sched();
  std::lock_guard<std::mutex> lock(sc.mu);
  return queue_work(sc, s, std::move(work), false);
}

cudaError_t enqueue_and_wait(cudaStream_t s, std::function<void()> work) {
  Scheduler& sc = sched();
  std::lock_guard<std::mutex> lock(sc.mu);
  return queue_work(sc, s, std::move(work), true);
}

void synchronize_all() {
  Scheduler& sc = sched();
  std::lock_guard<std::mutex> lock(sc.mu);
  run_all(sc);
}

}  // namespace ktier_emu

// ---- runtime API ---------------------------------------------------------------------------

using ktier_emu::fail;
using ktier_emu::sched;
using ktier_emu::Scheduler;

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  // Only non-blocking streams: a blocking one would order itself against the default stream,
  // which this emulation does not.
  if (flags != cudaStreamNonBlocking) return fail(cudaErrorInvalidValue);
  Scheduler& sc = sched();
  std::lock_guard<std::mutex> lock(sc.mu);
  *s = ktier_emu::new_handle<cudaStream_t>();
  auto q = std::make_shared<ktier_emu::Queue>();
  q->number = sc.next_number++;
  sc.streams[*s] = std::move(q);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  Scheduler& sc = sched();
  std::lock_guard<std::mutex> lock(sc.mu);
  const auto it = sc.streams.find(s);
  if (!s || it == sc.streams.end()) return fail(cudaErrorInvalidResourceHandle);
  // The work queued before still runs (the runtime lets it finish): now, so events recorded on
  // the stream stay meaningful after it is gone.
  ktier_emu::host_waits(sc, *it->second, it->second->queued);
  sc.streams.erase(it);
  std::free(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  Scheduler& sc = sched();
  std::lock_guard<std::mutex> lock(sc.mu);
  const std::shared_ptr<ktier_emu::Queue> q = ktier_emu::find_queue(sc, s);
  if (!q) return fail(cudaErrorInvalidResourceHandle);
  ktier_emu::host_waits(sc, *q, q->queued);
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  Scheduler& sc = sched();
  std::lock_guard<std::mutex> lock(sc.mu);
  *e = ktier_emu::new_handle<cudaEvent_t>();
  sc.events[*e] = {};
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  Scheduler& sc = sched();
  std::lock_guard<std::mutex> lock(sc.mu);
  if (sc.events.erase(e) == 0) return fail(cudaErrorInvalidResourceHandle);
  std::free(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  Scheduler& sc = sched();
  std::lock_guard<std::mutex> lock(sc.mu);
  const std::shared_ptr<ktier_emu::Queue> q = ktier_emu::find_queue(sc, s);
  const auto it = sc.events.find(e);
  if (!q || it == sc.events.end()) return fail(cudaErrorInvalidResourceHandle);
  it->second = {q, q->queued};  // a new record replaces the last, as the runtime's does
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  Scheduler& sc = sched();
  std::lock_guard<std::mutex> lock(sc.mu);
  const auto it = sc.events.find(e);
  if (it == sc.events.end()) return fail(cudaErrorInvalidResourceHandle);
  if (const ktier_emu::Event& ev = it->second; ev.queue)
    ktier_emu::host_waits(sc, *ev.queue, ev.point);
  return cudaSuccess;
}
// Runs nothing: a point is reached once some wait (or the order `sync`) ran the work before it.
// "Not ready" is recorded as the last error, as some runtimes do: a caller that does not clear
// it sees its next launch fail here.
cudaError_t cudaEventQuery(cudaEvent_t e) {
  Scheduler& sc = sched();
  std::lock_guard<std::mutex> lock(sc.mu);
  const auto it = sc.events.find(e);
  if (it == sc.events.end()) return fail(cudaErrorInvalidResourceHandle);
  const ktier_emu::Event& ev = it->second;
  return !ev.queue || ev.queue->done >= ev.point ? cudaSuccess : fail(cudaErrorNotReady);
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  Scheduler& sc = sched();
  std::lock_guard<std::mutex> lock(sc.mu);
  const auto it = sc.events.find(e);
  if (it == sc.events.end()) return fail(cudaErrorInvalidResourceHandle);
  // The wait is for the event's last record before this call, not for a later one.
  // Exactly to the point, in every order: running the event's stream further could need the
  // work of a stream that is running now (a later wait of its own), and that must wait.
  return ktier_emu::queue_work(sc, s, [ev = it->second] {
    if (ev.queue) ktier_emu::run_through(*ev.queue, ev.point);
  }, false);
}

// Streams and events of the host emulation: when queued device work runs (README.md
// "Streams"). Internal to the emulated runtime (runtime.cpp, streams.cpp).
#pragma once

#include <functional>

#include "cuda_runtime.h"

namespace ktier_emu {

// The order of device work, from KTIER_CUDA_EMULATION_ORDER (debugging and tests; read at
// every call, so a test may change it between calls):
//  kSync ("sync"): work runs in the call that queues it; every ordering holds, none is tested.
//  kLate ("late", the default): work runs only when the host waits for it (stream or event
//   synchronisation, a copy into pageable host memory, cudaStreamDestroy: its stream), and then
//   only what that wait needs: its stream's work up to the point waited for and, through
//   cudaStreamWaitEvent, other streams' work up to their recorded points. Work no wait needs
//   stays queued. cudaFree and cudaFreeHost run every stream's work.
//  kOthersFirst ("others-first"): as late, but a host wait first runs all other streams' queued
//   work (and what their event waits need), then the work waited for.
//  kRandom ("random:SEED", SEED a decimal number): as late, but a host wait first runs a drawn
//   part of each other stream's queued work, and may run its own stream past the point waited
//   for: orders between the other two; the same ones for the same seed and the same calls since
//   the order was set (a host wait under another order starts the draws again).
// Each is an order a GPU may choose; a program that orders its work by streams and events gets
// the same bytes from all three.
enum class Order { kSync, kLate, kOthersFirst, kRandom };
Order order();

// Records e as the calling thread's last error (cudaGetLastError) and returns it.
cudaError_t fail(cudaError_t e);

// Queues `work` on s (nullptr: the default stream, which this emulation keeps independent of
// the others, as it is of non-blocking streams) and returns cudaErrorInvalidResourceHandle for
// a stream that is not live. `work` runs on whichever host thread waits for it, one at a time
// over all threads, and must not call the runtime.
cudaError_t enqueue(cudaStream_t s, std::function<void()> work);
// As enqueue, then waits until `work` ran (a copy into pageable host memory returns only then).
cudaError_t enqueue_and_wait(cudaStream_t s, std::function<void()> work);
// Runs all queued work: cudaFree and cudaFreeHost synchronise the device.
void synchronize_all();

}  // namespace ktier_emu

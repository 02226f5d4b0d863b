// The compiled ops' threads: as many as torch gives the calling thread, each running the same worker
// (the workers share their work through a counter of their own).
//
// Not at::parallel_for: ATen/Parallel.h inlines torch's per-thread first-use setup into this library
// with a thread_local flag of its own, so the first call on a thread set that thread's torch thread
// count back to the process default. A server gives its step thread more threads than that default
// (engine/torch_threads.py): the first add_lora of a step then left every later op on one thread.
// at::get_num_threads is compiled into torch itself and reads the calling thread's own count.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <mutex>

namespace loraloom {

// worker() on min(max_threads, the calling thread's torch threads) threads at once; the first exception
// a worker throws is rethrown here once they have all returned.
template <typename Worker>
void run_on_torch_threads(int64_t max_threads, const Worker& worker) {
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), max_threads);
  if (threads <= 1) {
    worker();
    return;
  }
  std::exception_ptr error;
  std::mutex error_lock;
#pragma omp parallel num_threads(threads)
  {
    try {
      worker();
    } catch (...) {
      std::lock_guard<std::mutex> hold(error_lock);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace loraloom

// A fixed pool of worker threads for data-parallel kernels.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace deepinfer {

// Runs one task on every thread at once (the caller is thread 0). Workers spin briefly before
// sleeping, because kernels are issued back to back and a condition-variable wake-up per
// matmul would cost more than a small matmul.
class ThreadPool {
 public:
  // threads == 0 means one per hardware thread.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return thread_count_; }

  // Calls task(thread_index, thread_count) on every thread and returns when all are done.
  // Callers on several threads at once take turns (two engines in one process share the
  // global pool); a call from inside a task runs every index on the calling thread.
  void run(const std::function<void(int, int)>& task);

  // Splits [0, count) into one contiguous range per thread, each a multiple of `grain`
  // except the last, and calls fn(begin, end) for the non-empty ones.
  template <typename Fn>
  void parallel_for(int64_t count, int64_t grain, Fn&& fn) {
    if (count <= 0) return;
    int64_t chunks = (count + grain - 1) / grain;
    int threads = static_cast<int>(std::min<int64_t>(thread_count_, chunks));
    if (threads <= 1) {
      fn(int64_t{0}, count);
      return;
    }
    run([&](int thread, int) {
      if (thread >= threads) return;
      int64_t begin = chunks * thread / threads * grain;
      int64_t end = std::min(count, chunks * (thread + 1) / threads * grain);
      if (begin < end) fn(begin, end);
    });
  }

  // Like parallel_for, but threads take `chunk`-sized pieces from a shared counter until none
  // are left, so a thread slowed down (by a noisy neighbour, say) takes fewer pieces instead
  // of holding everyone up at the end.
  template <typename Fn>
  void parallel_for_dynamic(int64_t count, int64_t chunk, Fn&& fn) {
    if (count <= 0) return;
    if (thread_count_ == 1 || count <= chunk) {
      fn(int64_t{0}, count);
      return;
    }
    std::atomic<int64_t> next{0};
    run([&](int, int) {
      for (int64_t begin = next.fetch_add(chunk); begin < count; begin = next.fetch_add(chunk)) {
        fn(begin, std::min(count, begin + chunk));
      }
    });
  }

  // The process-wide pool the CPU kernels use; sized on first use (see set_global_threads).
  static ThreadPool& global();
  // Sets the size of the global pool; only effective before its first use.
  static void set_global_threads(int threads);

 private:
  void worker_loop(int index);

  int thread_count_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* task_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stopping_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::mutex run_mutex_;  // one task at a time
};

}  // namespace deepinfer

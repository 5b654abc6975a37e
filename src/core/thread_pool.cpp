#include "core/thread_pool.h"

#include <immintrin.h>

namespace deepinfer {

namespace {
std::atomic<int> g_requested_threads{0};
// Long enough to bridge the gap between back-to-back kernels (tens of microseconds), short
// enough that an oversubscribed machine (two processes, two cores) is not starved.
constexpr int kSpinIterations = 20000;
// Whether this thread is running a pool task (of any pool).
thread_local bool t_in_task = false;

// Marks this thread as inside a task for its lifetime.
struct InTask {
  InTask() { t_in_task = true; }
  ~InTask() { t_in_task = false; }
};

// Waits for `done` to become true: spin first, then give the core away between checks.
template <typename Done>
void spin_then_yield(Done done) {
  for (int spins = 0; !done(); ++spins) {
    if (spins < kSpinIterations) {
      _mm_pause();
    } else {
      std::this_thread::yield();
    }
  }
}
}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  thread_count_ = threads;
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void ThreadPool::run(const std::function<void(int, int)>& task) {
  if (thread_count_ == 1) {
    task(0, 1);
    return;
  }
  if (t_in_task) {  // the workers are busy with the task this one is part of
    for (int thread = 0; thread < thread_count_; ++thread) task(thread, thread_count_);
    return;
  }
  std::lock_guard turn(run_mutex_);
  InTask in_task;
  task_ = &task;
  pending_.store(thread_count_ - 1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  task(0, thread_count_);
  spin_then_yield([&] { return pending_.load(std::memory_order_acquire) == 0; });
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  while (true) {
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen && spins < kSpinIterations) {
      _mm_pause();
      ++spins;
    }
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load() != seen; });
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stopping_.load()) return;
    {
      InTask in_task;
      (*task_)(index, thread_count_);
    }
    pending_.fetch_sub(1, std::memory_order_release);
  }
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool(g_requested_threads.load());
  return pool;
}

void ThreadPool::set_global_threads(int threads) {
  g_requested_threads.store(threads);
}

}  // namespace deepinfer

#include "engine/step_runner.h"

#include <immintrin.h>

#include <utility>

#include "core/error.h"

namespace deepinfer {
namespace {
// A step's host work takes tens of microseconds: waiting that long by spinning avoids a
// sleep and wake-up (up to a scheduler tick on a busy machine) on each side of every step.
constexpr int kSpinIterations = 20000;

template <typename Ready>
void spin_until(Ready ready, int iterations) {
  for (int i = 0; i < iterations && !ready(); ++i) _mm_pause();
}
}  // namespace

StepRunner::StepRunner(bool spin)
    : spin_iterations_(spin ? kSpinIterations : 0), thread_([this] { loop(); }) {}

StepRunner::~StepRunner() {
  {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return !running_; });
    quit_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void StepRunner::start(std::function<void()> job) {
  {
    std::lock_guard lock(mutex_);
    DI_CHECK(!running_, "step runner: a job is already running");
    job_ = std::move(job);
    running_ = true;
    busy_.store(true, std::memory_order_release);
  }
  changed_.notify_all();
}

void StepRunner::wait() {
  spin_until([&] { return !busy_.load(std::memory_order_acquire); }, spin_iterations_);
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !running_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void StepRunner::loop() {
  std::unique_lock lock(mutex_);
  while (true) {
    lock.unlock();
    spin_until([&] { return busy_.load(std::memory_order_acquire); }, spin_iterations_);
    lock.lock();
    changed_.wait(lock, [&] { return quit_ || (running_ && job_); });
    if (quit_) return;
    std::function<void()> job = std::move(job_);
    job_ = nullptr;
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    running_ = false;
    busy_.store(false, std::memory_order_release);
    changed_.notify_all();
  }
}

}  // namespace deepinfer

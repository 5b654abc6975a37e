#include "engine/step_runner.h"

#include <utility>

#include "core/error.h"

namespace deepinfer {

StepRunner::StepRunner() : thread_([this] { loop(); }) {}

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
  }
  changed_.notify_all();
}

void StepRunner::wait() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !running_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

bool StepRunner::busy() const {
  std::lock_guard lock(mutex_);
  return running_;
}

void StepRunner::loop() {
  std::unique_lock lock(mutex_);
  while (true) {
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
    changed_.notify_all();
  }
}

}  // namespace deepinfer

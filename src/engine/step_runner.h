// Runs one job at a time on a thread of its own, so the engine thread can prepare the next
// step while the model runs this one (overlapped scheduling).
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace deepinfer {

class StepRunner {
 public:
  // `spin`: each side waits for the other by spinning briefly before it sleeps (a GPU step's
  // host work is short); off where the job itself needs every core (the CPU backend).
  explicit StepRunner(bool spin = true);
  ~StepRunner();
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;

  // Starts `job`; the previous one must have been waited for.
  void start(std::function<void()> job);
  // Blocks until the started job is done; rethrows what it threw. No-op when none runs.
  void wait();

 private:
  void loop();

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::function<void()> job_;
  bool running_ = false;
  std::atomic<bool> busy_{false};  // running_, readable without the lock while spinning
  bool quit_ = false;
  std::exception_ptr error_;
  const int spin_iterations_;
  std::thread thread_;
};

}  // namespace deepinfer

// Token masks a program keeps by the matcher state they were made for, shared by every matcher
// of the program: requests of one schema or grammar pass through the same states (the start,
// each key, each value's start) again and again. Internal to the structured module.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

namespace deepinfer::structured {

// Up to `capacity` values by key; when full it starts over (states recur in bursts, and a
// mask takes 19 KB for a 151k vocabulary). Safe to use from several threads.
template <typename Key, typename Value>
class KeptMasks {
 public:
  explicit KeptMasks(size_t capacity) : capacity_(capacity) {}

  std::optional<Value> find(const Key& key) const {
    std::lock_guard lock(mutex_);
    const auto found = kept_.find(key);
    if (found == kept_.end()) return std::nullopt;
    return found->second;
  }
  void keep(const Key& key, Value value) {
    std::lock_guard lock(mutex_);
    if (kept_.size() >= capacity_) kept_.clear();
    kept_.emplace(key, std::move(value));
  }

 private:
  size_t capacity_;
  mutable std::mutex mutex_;
  std::map<Key, Value> kept_;
};

}  // namespace deepinfer::structured

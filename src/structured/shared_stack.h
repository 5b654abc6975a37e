// A stack whose copies share the elements under the top: copying one (as a token mask's walk
// does for every byte it tries) copies the top element and a reference, not the whole stack.
// Only the top can change; popping copies the next element up out of the shared part.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>

namespace deepinfer::structured {

template <typename T>
class SharedStack {
 public:
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  T& back() { return top_; }
  const T& back() const { return top_; }

  void push_back(T value) {
    if (size_ > 0) below_ = std::make_shared<const Node>(Node{std::move(top_), std::move(below_)});
    top_ = std::move(value);
    ++size_;
  }

  void pop_back() {
    if (--size_ == 0) {
      top_ = T{};
      return;
    }
    top_ = below_->value;
    below_ = below_->below;
  }

  // Visits the elements from the top down.
  template <typename Visit>
  void each(Visit visit) const {
    if (size_ == 0) return;
    visit(top_);
    for (const Node* node = below_.get(); node; node = node->below.get()) visit(node->value);
  }

  bool operator==(const SharedStack& other) const {
    if (size_ != other.size_ || !(top_ == other.top_)) return false;
    const Node* a = below_.get();
    const Node* b = other.below_.get();
    for (; a != b; a = a->below.get(), b = b->below.get())
      if (!(a->value == b->value)) return false;
    return true;
  }

 private:
  struct Node {
    T value;
    std::shared_ptr<const Node> below;
  };
  T top_{};
  std::shared_ptr<const Node> below_;
  size_t size_ = 0;
};

}  // namespace deepinfer::structured

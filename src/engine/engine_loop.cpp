#include "engine/engine_loop.h"

#include <algorithm>
#include <map>
#include <utility>

#include "core/error.h"

namespace deepinfer {

RequestStream::RequestStream(std::string id, int completions)
    : id_(std::move(id)), remaining_(completions) {}

bool RequestStream::next(Event& event) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] {
    return !unread_.tokens.empty() || !unread_.finished.empty() || remaining_ == 0 ||
           !error_.empty();
  });
  if (!error_.empty()) fail("request {}: {}", id_, error_);
  if (unread_.tokens.empty() && unread_.finished.empty()) return false;
  event = std::exchange(unread_, {});
  return true;
}

std::vector<GenerationResult> RequestStream::collect() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return remaining_ == 0 || !error_.empty(); });
  if (!error_.empty()) fail("request {}: {}", id_, error_);
  std::vector<GenerationResult> results = results_;
  std::sort(results.begin(), results.end(),
            [](const auto& a, const auto& b) { return a.index < b.index; });
  return results;
}

bool RequestStream::poll(Event& event, bool& ended) {
  std::lock_guard lock(mutex_);
  if (!error_.empty()) fail("request {}: {}", id_, error_);
  bool any = !unread_.tokens.empty() || !unread_.finished.empty();
  if (any) event = std::exchange(unread_, {});
  ended = remaining_ == 0;
  return any;
}

void RequestStream::set_listener(std::function<void()> listener) {
  std::lock_guard lock(mutex_);
  listener_ = std::move(listener);
}

void RequestStream::deliver(std::vector<TokenEvent> tokens,
                            std::vector<GenerationResult> finished) {
  std::function<void()> listener;
  {
    std::lock_guard lock(mutex_);
    listener = listener_;
    for (TokenEvent& token : tokens) unread_.tokens.push_back(std::move(token));
    for (GenerationResult& result : finished) {
      results_.push_back(result);
      unread_.finished.push_back(std::move(result));
      --remaining_;
    }
  }
  changed_.notify_all();
  if (listener) listener();
}

void RequestStream::abandon(const std::string& why) {
  std::function<void()> listener;
  {
    std::lock_guard lock(mutex_);
    if (remaining_ > 0) error_ = why;
    listener = listener_;
  }
  changed_.notify_all();
  if (listener) listener();
}

bool RequestStream::ends_with(size_t finished) const {
  std::lock_guard lock(mutex_);
  return static_cast<size_t>(remaining_) <= finished;
}

EngineLoop::EngineLoop(CausalLM& model, const EngineConfig& config)
    : engine_(model, config), stats_(engine_.stats()), thread_([this] { loop(); }) {}

EngineLoop::~EngineLoop() {
  {
    std::lock_guard lock(mutex_);
    quit_ = true;
  }
  wake_.notify_all();
  thread_.join();
  abandon_all("the engine shut down");
}

std::shared_ptr<RequestStream> EngineLoop::submit(GenerationRequest request) {
  // The limits are fixed at construction, so checking here needs no engine-thread state.
  check_admission(request, engine_.admission_limits());
  auto stream = std::make_shared<RequestStream>(request.id, request.sampling.n);
  {
    std::lock_guard lock(mutex_);
    if (!failure_.empty()) fail("request {}: the engine failed earlier: {}", request.id, failure_);
    if (quit_) fail("request {}: the engine is shutting down", request.id);
    if (!streams_.emplace(request.id, stream).second)
      fail("request {}: a request with this id is still running", request.id);
    inbox_.push_back(std::move(request));
  }
  wake_.notify_all();
  return stream;
}

void EngineLoop::stop(const std::string& id, int index) {
  {
    std::lock_guard lock(mutex_);
    stops_.emplace_back(id, index);
  }
  wake_.notify_all();
}

EngineStats EngineLoop::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

// Waits until there is something to do; false when the loop should end.
bool EngineLoop::take_inbox(std::vector<GenerationRequest>& requests,
                            std::vector<std::pair<std::string, int>>& stops) {
  std::unique_lock lock(mutex_);
  wake_.wait(lock, [&] { return quit_ || !inbox_.empty() || !stops_.empty() || !engine_.idle(); });
  if (quit_) return false;
  requests.assign(std::make_move_iterator(inbox_.begin()), std::make_move_iterator(inbox_.end()));
  inbox_.clear();
  stops = std::exchange(stops_, {});
  return true;
}

void EngineLoop::loop() {
  std::vector<GenerationRequest> requests;
  std::vector<std::pair<std::string, int>> stops;
  while (take_inbox(requests, stops)) {
    std::vector<TokenEvent> tokens;
    std::vector<GenerationResult> finished;
    try {
      for (GenerationRequest& request : requests) engine_.submit(std::move(request));
      for (const auto& [id, index] : stops) engine_.stop(id, index);
      engine_.step(finished, &tokens);
    } catch (const std::exception& error) {
      // A failed forward leaves the engine's state unknown: end every request with the
      // reason and refuse new ones, rather than answer with wrong tokens.
      {
        std::lock_guard lock(mutex_);
        failure_ = error.what();
      }
      abandon_all(error.what());
      return;
    }
    {
      // Before the results go out, so a reader that saw its request end sees it counted.
      std::lock_guard lock(mutex_);
      stats_ = engine_.stats();
    }
    dispatch(tokens, finished);
  }
}

void EngineLoop::dispatch(std::vector<TokenEvent>& tokens,
                          std::vector<GenerationResult>& finished) {
  std::map<std::string, std::pair<std::vector<TokenEvent>, std::vector<GenerationResult>>> by_id;
  for (TokenEvent& token : tokens) by_id[token.id].first.push_back(std::move(token));
  for (GenerationResult& result : finished) by_id[result.id].second.push_back(std::move(result));
  for (auto& [id, events] : by_id) {
    std::shared_ptr<RequestStream> stream;
    {
      // The id is free again before the reader can see its request end.
      std::lock_guard lock(mutex_);
      auto it = streams_.find(id);
      if (it == streams_.end()) continue;
      stream = it->second;
      if (stream->ends_with(events.second.size())) streams_.erase(it);
    }
    stream->deliver(std::move(events.first), std::move(events.second));
  }
}

void EngineLoop::abandon_all(const std::string& why) {
  std::unordered_map<std::string, std::shared_ptr<RequestStream>> streams;
  {
    std::lock_guard lock(mutex_);
    streams = std::exchange(streams_, {});
  }
  for (auto& [id, stream] : streams) stream->abandon(why);
}

}  // namespace deepinfer

// The engine as a library service: one engine thread owns the Engine (scheduler, KV cache,
// model runner); any thread submits requests and reads each one's results from its own
// channel, as they stream or all at once.
//
//   EngineLoop loop(model, config);
//   auto stream = loop.submit(request);       // admission errors are thrown here
//   RequestStream::Event event;
//   while (stream->next(event)) { ... event.tokens ... }   // or: stream->collect()
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"

namespace deepinfer {

// One request's channel from the engine thread to its reader.
class RequestStream {
 public:
  struct Event {
    std::vector<TokenEvent> tokens;          // tokens sampled since the last event
    std::vector<GenerationResult> finished;  // completions that ended since then
  };
  RequestStream(std::string id, int completions);

  const std::string& id() const { return id_; }
  // Blocks until something new arrives; false once the request has ended and every event
  // was read. Throws Error when the engine failed or shut down before the request ended.
  bool next(Event& event);
  // Blocks until the request ends; its completions in index order.
  std::vector<GenerationResult> collect();
  // Without blocking, for event-driven readers: takes what arrived (true when there was
  // anything) and says whether the request has ended. Throws as next() does.
  bool poll(Event& event, bool& ended);
  // Called on the engine thread whenever something arrives or the request fails; set it
  // before anything can arrive (right after submit) or poll once after setting it.
  void set_listener(std::function<void()> listener);

  // Engine side.
  void deliver(std::vector<TokenEvent> tokens, std::vector<GenerationResult> finished);
  void abandon(const std::string& why);
  // Whether `finished` more completions end the request.
  bool ends_with(size_t finished) const;

 private:
  std::string id_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  Event unread_;
  std::vector<GenerationResult> results_;
  std::function<void()> listener_;
  int remaining_;
  std::string error_;
};

class EngineLoop {
 public:
  EngineLoop(CausalLM& model, const EngineConfig& config);
  ~EngineLoop();  // requests still running end with an error on their streams
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Checks the request (Error on this thread when it can never run or its id is in use),
  // then queues it for the engine thread.
  std::shared_ptr<RequestStream> submit(GenerationRequest request);
  // Ends a request early (stop string seen, client gone): completion `index`, or all of them
  // when negative; they end with kStop.
  void stop(const std::string& id, int index = -1);
  // A snapshot taken after the engine's latest step.
  EngineStats stats() const;

 private:
  void loop();
  bool take_inbox(std::vector<GenerationRequest>& requests,
                  std::vector<std::pair<std::string, int>>& stops);
  void dispatch(std::vector<TokenEvent>& tokens, std::vector<GenerationResult>& finished);
  void abandon_all(const std::string& why);

  Engine engine_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<GenerationRequest> inbox_;
  std::vector<std::pair<std::string, int>> stops_;
  // Streams by request id; submit() adds, the engine thread removes when a request ends.
  std::unordered_map<std::string, std::shared_ptr<RequestStream>> streams_;
  EngineStats stats_;
  std::string failure_;  // set when a step threw: the engine takes no more requests
  bool quit_ = false;
  std::thread thread_;
};

}  // namespace deepinfer

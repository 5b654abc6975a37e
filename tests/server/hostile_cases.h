// Seeded hostile requests for the server suites: valid requests of every API, the same with
// one field given a wrong type or an out-of-range value, broken messages, broken HTTP framing,
// clients that leave mid-answer, and control-token text in client strings. Each case says what
// a correct server answers.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

namespace deepinfer::server::testing {

// What a correct server answers.
enum class Expect {
  kOk,           // 200 with a whole answer
  kClientError,  // a 4xx with the route's error body
  kEither,       // either: the API leaves it open (a null, an unknown field, a large value)
};

// When a leaving client closes its connection.
enum class Drop { kNone, kAfterSend, kAfterHead, kAfterFirstEvent };

struct Case {
  enum class Kind {
    kWhole,       // a JSON request over the normal client; the whole answer is checked
    kRaw,         // raw bytes (framing); the status line and error body are checked
    kDisconnect,  // a streamed request the client leaves at `drop`
    kInjection,   // /tokenize of `body` against `plain_body`: no extra control tokens
  };
  Kind kind = Kind::kWhole;
  std::string label;  // what was done to the request
  std::string method = "POST";
  std::string path;        // the route
  std::string body;        // the JSON body
  std::string plain_body;  // kInjection: the same request without control-token text
  std::string raw;         // kRaw: the bytes sent
  Expect expect = Expect::kEither;
  bool stream = false;
  bool may_close = false;  // kRaw: closing without an answer is also right
  Drop drop = Drop::kNone;
  int64_t first_added_id = 151643;  // kInjection: Qwen3's first added-vocabulary id

  // The route and the start of what was sent, for a failure message.
  std::string describe() const;
};

class HostileCases {
 public:
  explicit HostileCases(uint64_t seed) : rng_(seed) {}
  Case next();

 private:
  using Json = nlohmann::json;
  size_t pick(size_t count);
  bool coin(double probability = 0.5);
  std::string text();
  Json valid_body(const std::string& path, bool stream);
  Case valid_case();
  Case field_case();
  Case structure_case();
  Case route_case();
  Case raw_case();
  Case disconnect_case();
  Case injection_case();
  std::mt19937_64 rng_;
};

}  // namespace deepinfer::server::testing

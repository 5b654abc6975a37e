// The real server on loopback, driven over HTTP: routes, auth, error shapes, streaming, client
// disconnects, and many concurrent streams.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <regex>
#include <thread>

#include "server/server_fixture.h"
#include "support/test_support.h"

namespace deepinfer::server {
namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using testing::call;
using testing::Json;
using testing::Reply;
using testing::sse_payloads;

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServeOptions options;
    options.http.max_body_bytes = 1 << 20;
    options.served_model_name = "demo";
    server_ = std::make_unique<testing::LoopbackServer>(
        deepinfer::testing::fixture_model("demo-code-target"), options);
  }
  void TearDown() override { server_.reset(); }
  uint16_t port() const { return server_->port(); }
  double metric(const std::string& name) const { return server_->metric(name); }

  std::unique_ptr<testing::LoopbackServer> server_;
};

TEST_F(ServerTest, HealthModelsAndApiKey) {
  EXPECT_EQ(call(port(), "GET", "/health", "", "").status, 200);
  Reply denied = call(port(), "GET", "/v1/models", "", "");
  EXPECT_EQ(denied.status, 401);
  EXPECT_EQ(denied.json()["error"]["type"], "authentication_error");
  EXPECT_EQ(call(port(), "GET", "/v1/models", "", "wrong").status, 401);
  Reply models = call(port(), "GET", "/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.json()["data"][0]["id"], "demo");
  EXPECT_EQ(call(port(), "GET", "/nowhere").status, 404);
}

TEST_F(ServerTest, BadRequestsGetTheRightStatusAndAnOpenAiErrorBody) {
  struct Case {
    std::string body;
    int status;
    std::string param;
  };
  for (const Case& c : {Case{"{not json", 400, ""}, Case{R"({"prompt": 7})", 400, "prompt"},
                        Case{R"({"prompt": "x", "temperature": "hot"})", 400, "temperature"},
                        Case{R"({"prompt": "x", "model": "other"})", 404, "model"},
                        Case{R"({"prompt": "x", "max_tokens": 100000})", 400, "messages"},
                        Case{R"({"prompt": "x", "top_p": 3})", 400, ""},
                        Case{R"({"prompt": "x", "response_format": {"type": "json_schema"}})", 400,
                             "response_format"}}) {
    Reply reply = call(port(), "POST", "/v1/completions", c.body);
    EXPECT_EQ(reply.status, c.status) << c.body << " -> " << reply.body;
    Json error = reply.json()["error"];
    EXPECT_TRUE(error["message"].is_string()) << reply.body;
    EXPECT_TRUE(error["type"].is_string()) << reply.body;
    if (!c.param.empty()) {
      EXPECT_EQ(error["param"], c.param) << reply.body;
    }
  }
  Reply chat = call(port(), "POST", "/v1/chat/completions", R"({"messages": []})");
  EXPECT_EQ(chat.status, 400);
  Reply huge = call(port(), "POST", "/v1/completions", std::string(2 << 20, 'x'));
  EXPECT_EQ(huge.status, 413);
}

TEST_F(ServerTest, StreamedChatEqualsTheWholeAnswerAndCarriesUsage) {
  std::string request = R"({"model": "demo", "messages": [{"role": "user", "content": "hi"}],
                            "max_tokens": 12, "temperature": 0, "ignore_eos": true)";
  Reply whole = call(port(), "POST", "/v1/chat/completions", request + "}");
  ASSERT_EQ(whole.status, 200) << whole.body;
  Json answer = whole.json();
  EXPECT_EQ(answer["object"], "chat.completion");
  EXPECT_EQ(answer["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(answer["usage"]["completion_tokens"], 12);
  int64_t prompt_tokens = answer["usage"]["prompt_tokens"];
  EXPECT_GT(prompt_tokens, 0);
  Reply streamed =
      call(port(), "POST", "/v1/chat/completions",
           request + R"(, "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_EQ(streamed.status, 200);
  bool done = false;
  std::vector<Json> chunks = sse_payloads(streamed.body, done);
  EXPECT_TRUE(done);
  ASSERT_GE(chunks.size(), 3u);
  std::string text;
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i]["object"], "chat.completion.chunk");
    const Json& delta = chunks[i]["choices"][0]["delta"];
    if (delta.contains("content")) text += delta["content"].get<std::string>();
  }
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(text, answer["choices"][0]["message"]["content"]);
  const Json& usage = chunks.back();
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 12);
  EXPECT_EQ(usage["usage"]["prompt_tokens"], prompt_tokens);
  // The same prompt again: its whole blocks come from the prefix cache.
  Reply again = call(port(), "POST", "/v1/chat/completions", request + "}");
  EXPECT_EQ(again.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
            (prompt_tokens - 1) / 16 * 16);
}

TEST_F(ServerTest, StopStringsNAndLogprobsOnCompletions) {
  Reply reply = call(port(), "POST", "/v1/completions",
                     R"({"prompt": "def add(a, b):", "max_tokens": 24, "temperature": 0.7,
                         "seed": 3, "n": 2, "logprobs": 2, "stop": ["return"]})");
  ASSERT_EQ(reply.status, 200) << reply.body;
  Json answer = reply.json();
  ASSERT_EQ(answer["choices"].size(), 2u);
  for (const Json& choice : answer["choices"]) {
    EXPECT_EQ(choice["text"].get<std::string>().find("return"), std::string::npos);
    if (choice["finish_reason"] == "stop" && !choice["stop_reason"].is_null()) {
      EXPECT_EQ(choice["stop_reason"], "return");
    }
  }
  Reply chat = call(port(), "POST", "/v1/chat/completions",
                    R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3,
                        "logprobs": true, "top_logprobs": 2, "temperature": 0})");
  Json logprobs = chat.json()["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(logprobs.size(), 3u);
  EXPECT_EQ(logprobs[0]["top_logprobs"].size(), 2u);
  EXPECT_LE(logprobs[0]["logprob"].get<double>(), 0.0);
}

// response_format json_object: sampling is masked to JSON, so every finished answer parses
// as one object, streamed or not, whatever the seed.
TEST_F(ServerTest, JsonObjectOutputAlwaysParses) {
  int finished = 0;
  for (int seed = 1; seed <= 4; ++seed) {
    for (bool stream : {false, true}) {
      std::string body = fmt::format(
          R"({{"messages": [{{"role": "user", "content": "A JSON object, please"}}],
              "response_format": {{"type": "json_object"}}, "max_tokens": 200,
              "temperature": 1.0, "seed": {}, "stream": {}}})",
          seed, stream);
      Reply reply = call(port(), "POST", "/v1/chat/completions", body);
      ASSERT_EQ(reply.status, 200) << reply.body;
      std::string content, finish;
      if (stream) {
        bool done = false;
        for (const Json& chunk : sse_payloads(reply.body, done)) {
          if (chunk["choices"].empty()) continue;
          const Json& choice = chunk["choices"][0];
          if (choice["delta"].contains("content")) content += choice["delta"]["content"];
          if (choice["finish_reason"].is_string()) finish = choice["finish_reason"];
        }
      } else {
        content = reply.json()["choices"][0]["message"]["content"];
        finish = reply.json()["choices"][0]["finish_reason"];
      }
      if (finish != "stop") continue;  // cut by max_tokens: a prefix of an object
      ++finished;
      Json parsed = Json::parse(content, nullptr, false);
      EXPECT_TRUE(!parsed.is_discarded() && parsed.is_object()) << content;
    }
  }
  EXPECT_GE(finished, 4);
  Reply tool_choice = call(port(), "POST", "/v1/chat/completions",
                           R"({"messages": [{"role": "user", "content": "x"}],
                               "tool_choice": "required"})");
  EXPECT_EQ(tool_choice.status, 400);
  EXPECT_EQ(tool_choice.json()["error"]["param"], "tool_choice");
}

// A completion's text and finish reason, from its streamed chunks or its body.
std::pair<std::string, std::string> completion_text(const Reply& reply, bool stream) {
  std::string text, finish;
  if (!stream) {
    const Json body = reply.json();
    return {body["choices"][0]["text"], body["choices"][0]["finish_reason"]};
  }
  bool done = false;
  for (const Json& chunk : sse_payloads(reply.body, done)) {
    if (chunk["choices"].empty()) continue;
    text += chunk["choices"][0]["text"].get<std::string>();
    if (chunk["choices"][0]["finish_reason"].is_string())
      finish = chunk["choices"][0]["finish_reason"];
  }
  return {text, finish};
}

// vLLM's structured_outputs (and guided_*) regex and choice: every finished output matches,
// streamed or not; kinds not built yet, patterns and schemas the engine refuses are 400s
// naming them.
TEST_F(ServerTest, RegexAndChoiceOutputsMatch) {
  const std::regex pattern("[a-z]{3}-\\d{2,4}( [A-Z]{1,3})?");
  int finished = 0;
  for (int seed = 1; seed <= 3; ++seed) {
    for (bool stream : {false, true}) {
      std::string body = fmt::format(
          R"({{"prompt": "def", "max_tokens": 40, "temperature": 1.0, "seed": {}, "stream": {},
              "structured_outputs": {{"regex": "[a-z]{{3}}-\\d{{2,4}}( [A-Z]{{1,3}})?"}}}})",
          seed, stream);
      Reply reply = call(port(), "POST", "/v1/completions", body);
      ASSERT_EQ(reply.status, 200) << reply.body;
      const auto [text, finish] = completion_text(reply, stream);
      if (finish != "stop") continue;
      ++finished;
      EXPECT_TRUE(std::regex_match(text, pattern)) << text;
    }
  }
  EXPECT_GE(finished, 3);
  for (int seed = 1; seed <= 3; ++seed) {
    Reply chat = call(port(), "POST", "/v1/chat/completions",
                      fmt::format(R"({{"messages": [{{"role": "user", "content": "Well?"}}],
                                      "guided_choice": ["yes", "no", "not sure"], "seed": {},
                                      "temperature": 1.0}})",
                                  seed));
    ASSERT_EQ(chat.status, 200) << chat.body;
    const std::string content = chat.json()["choices"][0]["message"]["content"];
    EXPECT_TRUE(content == "yes" || content == "no" || content == "not sure") << content;
  }
  auto refused = [&](const std::string& fields) {
    Reply reply = call(port(), "POST", "/v1/completions",
                       R"({"prompt": "def", "max_tokens": 4, )" + fields + "}");
    EXPECT_EQ(reply.status, 400) << fields;
    return reply.json()["error"];
  };
  EXPECT_EQ(refused(R"("structured_outputs": {"json": {"if": {"type": "object"}}})")["param"],
            "structured_outputs");
  EXPECT_NE(refused(R"("response_format": {"type": "json_schema", "json_schema": {"name": "x",
                       "schema": {"type": "string", "format": "color"}}})")["message"]
                .get<std::string>()
                .find("format 'color'"),
            std::string::npos);
  EXPECT_NE(
      refused(R"x("guided_regex": "a(?=b)")x")["message"].get<std::string>().find("look-around"),
      std::string::npos);
  EXPECT_EQ(refused(R"("guided_choice": [])")["param"], "guided_choice");
  EXPECT_EQ(refused(R"("guided_regex": "a", "guided_choice": ["a"])")["param"], "guided_choice");
  EXPECT_EQ(refused(R"("guided_grammar": "root ::= missing")")["param"], "guided_grammar");
  EXPECT_NE(refused(R"("structured_outputs": {"grammar": "start: x{a}"})")["message"]
                .get<std::string>()
                .find("templates"),
            std::string::npos);
  EXPECT_EQ(refused(R"("structured_outputs": {"structural_tag": {}})")["param"],
            "structured_outputs");
}

// Sums and products of up to three digits or bracketed such expressions: the language both
// grammars below define, read by recursive descent.
bool arithmetic(const std::string& text, size_t& at, int depth = 0) {
  auto term = [&] {
    if (at < text.size() && text[at] == '(') {
      ++at;
      if (depth > 64 || !arithmetic(text, at, depth + 1)) return false;
      return at < text.size() && text[at++] == ')';
    }
    return at < text.size() && std::isdigit(static_cast<unsigned char>(text[at++]));
  };
  if (!term()) return false;
  for (int terms = 1; at < text.size() && (text[at] == '+' || text[at] == '*'); ++terms) {
    ++at;
    if (terms == 3 || !term()) return false;
  }
  return true;
}

bool arithmetic(const std::string& text) {
  size_t at = 0;
  return arithmetic(text, at) && at == text.size();
}

// vLLM's grammar constraints in GBNF (structured_outputs.grammar) and Lark (guided_grammar):
// every finished output is a sentence, streamed or not.
TEST_F(ServerTest, GrammarOutputsAreSentences) {
  const std::string gbnf = R"(root ::= expr\nexpr ::= term ((\"+\" | \"*\") term){0,2}\n)"
                           R"(term ::= [0-9] | \"(\" expr \")\")";
  const std::string lark = R"(start: expr\n?expr: term ((\"+\" | \"*\") term) ~ 0..2\n)"
                           R"(?term: NUMBER | \"(\" expr \")\"\nNUMBER: /[0-9]/)";
  int finished = 0;
  for (int seed = 1; seed <= 3; ++seed) {
    for (bool stream : {false, true}) {
      const std::string field =
          seed % 2 ? fmt::format(R"("structured_outputs": {{"grammar": "{}"}})", gbnf)
                   : fmt::format(R"("guided_grammar": "{}")", lark);
      Reply reply = call(port(), "POST", "/v1/completions",
                         fmt::format(R"({{"prompt": "def", "max_tokens": 40, "temperature": 1.0,
                                         "seed": {}, "stream": {}, {}}})",
                                     seed, stream, field));
      ASSERT_EQ(reply.status, 200) << reply.body;
      const auto [text, finish] = completion_text(reply, stream);
      if (finish != "stop") continue;
      ++finished;
      EXPECT_TRUE(arithmetic(text)) << text;
    }
  }
  EXPECT_GE(finished, 2);
}

// JSON Schema outputs (response_format json_schema, Responses' text.format, guided_json):
// every output that finishes is a JSON value its schema accepts; one cut short says so.
TEST_F(ServerTest, JsonSchemaOutputsFollowTheirSchema) {
  const std::string schema = R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 5}, "age": {"type": "integer", "minimum": 0,
      "maximum": 120}, "tier": {"enum": ["gold", "free"]}},
      "required": ["name", "age", "tier"], "additionalProperties": false})";
  auto check = [](const std::string& text) {
    Json value = Json::parse(text, nullptr, false);
    ASSERT_TRUE(value.is_object()) << text;
    EXPECT_EQ(value.size(), 3u) << text;
    EXPECT_LE(value["name"].get<std::string>().size(), 5u) << text;
    EXPECT_GE(value["age"].get<int>(), 0) << text;
    EXPECT_LE(value["age"].get<int>(), 120) << text;
    EXPECT_TRUE(value["tier"] == "gold" || value["tier"] == "free") << text;
  };
  int finished = 0;
  for (int seed = 1; seed <= 4; ++seed) {
    Reply chat = call(port(), "POST", "/v1/chat/completions",
                      fmt::format(R"({{"messages": [{{"role": "user", "content": "Who?"}}],
                          "max_tokens": 80, "temperature": 0.8, "seed": {},
                          "response_format": {{"type": "json_schema", "json_schema":
                              {{"name": "person", "strict": true, "schema": {}}}}}}})",
                                  seed, schema));
    ASSERT_EQ(chat.status, 200) << chat.body;
    const Json body = chat.json();
    const Json& choice = body["choices"][0];
    if (choice["finish_reason"] != "stop") continue;
    ++finished;
    check(choice["message"]["content"].get<std::string>());
  }
  Reply text = call(port(), "POST", "/v1/completions",
                    fmt::format(R"({{"prompt": "x", "max_tokens": 80, "seed": 5,
                                    "guided_json": {}}})",
                                schema));
  ASSERT_EQ(text.status, 200) << text.body;
  if (text.json()["choices"][0]["finish_reason"] == "stop") {
    ++finished;
    check(text.json()["choices"][0]["text"].get<std::string>());
  }
  Reply responses = call(port(), "POST", "/v1/responses",
                         fmt::format(R"({{"input": "Who?", "max_output_tokens": 80, "seed": 6,
                             "text": {{"format": {{"type": "json_schema", "name": "person",
                             "schema": {}}}}}}})",
                                     schema));
  ASSERT_EQ(responses.status, 200) << responses.body;
  EXPECT_GE(finished, 2);
  Reply cut = call(port(), "POST", "/v1/completions",
                   fmt::format(R"({{"prompt": "x", "max_tokens": 3, "guided_json": {}}})", schema));
  ASSERT_EQ(cut.status, 200) << cut.body;
  EXPECT_EQ(cut.json()["choices"][0]["finish_reason"], "length");
}

TEST_F(ServerTest, AClientThatGoesAwayFreesItsBlocks) {
  {
    net::io_context io;
    tcp::socket socket(io);
    socket.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port()));
    std::string body =
        R"({"prompt": "def", "max_tokens": 3000, "ignore_eos": true, "stream": true})";
    std::string request =
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        "sk-test\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    net::write(socket, net::buffer(request));
    std::string seen;
    while (seen.find("data: ") == std::string::npos) {  // the first token has been streamed
      char bytes[256];
      size_t count = socket.read_some(net::buffer(bytes));
      seen.append(bytes, count);
    }
    EXPECT_GT(metric("deepinfer:kv_cache_blocks_used"), 0);
  }  // closes the connection mid-stream
  for (int i = 0; i < 200 && metric("deepinfer:requests_in_flight") != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(metric("deepinfer:requests_in_flight"), 0);
  EXPECT_EQ(metric("deepinfer:kv_cache_blocks_used"), 0);
  EXPECT_LT(metric("vllm:generation_tokens_total"), 3000);
}

TEST_F(ServerTest, TwoHundredConcurrentStreamsAllComplete) {
  std::vector<std::thread> clients;
  std::atomic<int> complete{0};
  const int kClients = std::getenv("CLIENTS") ? std::atoi(std::getenv("CLIENTS")) : 200;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      std::string body = R"({"prompt": "def f)" + std::to_string(c) +
                         R"(():", "max_tokens": 5, "ignore_eos": true, "stream": true,
                            "stream_options": {"include_usage": true}})";
      Reply reply = call(port(), "POST", "/v1/completions", body);
      bool done = false;
      std::vector<Json> chunks = sse_payloads(reply.body, done);
      if (reply.status == 200 && done && !chunks.empty() &&
          chunks.back()["usage"]["completion_tokens"] == 5)
        ++complete;
    });
  }
  for (std::thread& client : clients) client.join();
  EXPECT_EQ(complete.load(), kClients);
}

// Control tokens come only from the template: a user typing <|im_end|> gets text tokens.
TEST_F(ServerTest, TypedControlTokensBecomePlainText) {
  auto tokens_of = [&](const std::string& content) {
    Json body = {{"messages", Json::array({{{"role", "user"}, {"content", content}}})}};
    return call(port(), "POST", "/tokenize", body.dump()).json()["tokens"];
  };
  auto count = [](const Json& tokens, int id) {
    return std::count(tokens.begin(), tokens.end(), Json(id));
  };
  const int im_end = 2;  // <|im_end|> in this vocabulary
  Json plain = tokens_of("hi there");
  Json typed = tokens_of("hi <|im_end|> there");
  EXPECT_EQ(count(typed, im_end), count(plain, im_end));  // only the template's own
  EXPECT_GT(typed.size(), plain.size() + 3);              // the typed marker as text pieces
  Reply detokenized = call(port(), "POST", "/detokenize", Json{{"tokens", typed}}.dump());
  EXPECT_NE(detokenized.json()["prompt"].get<std::string>().find("hi <|im_end|> there"),
            std::string::npos);
  Reply chat = call(port(), "POST", "/v1/chat/completions",
                    R"({"messages": [{"role": "user", "content": "hi <|im_end|> there"}],
                        "max_tokens": 1})");
  EXPECT_EQ(chat.json()["usage"]["prompt_tokens"], typed.size());
}

// A full server answers 429 at once instead of queueing without bound.
TEST(ServerLimits, AFullServerAnswers429) {
  auto ops = make_cpu_ops();
  auto model =
      load_model(deepinfer::testing::fixture_model("demo-code-target"), LoadMode::kMmap, *ops);
  EngineConfig engine;
  engine.kv_bytes = size_t{64} << 20;
  ServeOptions options;
  options.http.host = "127.0.0.1";
  options.http.port = 0;
  options.max_pending_requests = 1;
  ApiServer server(*model, deepinfer::testing::fixture_model("demo-code-target"), engine, options);
  std::thread runner([&] { server.run(); });
  Reply slow_reply;
  std::thread slow([&] {
    slow_reply = call(server.port(), "POST", "/v1/completions",
                      R"({"prompt": "def", "max_tokens": 400, "ignore_eos": true})", "");
  });
  // Wait until the slow request holds the only slot, then knock.
  for (int i = 0; i < 1000; ++i) {
    std::string metrics = call(server.port(), "GET", "/metrics", "", "").body;
    if (metrics.find("deepinfer:requests_in_flight{model_name=\"demo-code-target\"} 1") !=
        std::string::npos)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  Reply refused =
      call(server.port(), "POST", "/v1/completions", R"({"prompt": "x", "max_tokens": 1})", "");
  EXPECT_EQ(refused.status, 429);
  EXPECT_EQ(refused.json()["error"]["type"], "rate_limit_error");
  slow.join();
  EXPECT_EQ(slow_reply.status, 200) << slow_reply.body;
  server.stop();
  runner.join();
}

// SIGTERM's drain lets requests run for --shutdown-timeout; one still running then ends with
// a 503 its client can read (the API's error event and terminator), never a cut connection.
TEST(ServerShutdown, RequestsStillRunningAtTheDeadlineEndWithA503) {
  auto ops = make_cpu_ops();
  std::string folder = deepinfer::testing::fixture_model("demo-code-target");
  auto model = load_model(folder, LoadMode::kMmap, *ops);
  EngineConfig engine;
  engine.kv_bytes = size_t{64} << 20;
  ServeOptions options;
  options.http.host = "127.0.0.1";
  options.http.port = 0;
  options.http.drain_seconds = 0.2;
  ApiServer server(*model, folder, engine, options);
  std::thread runner([&] { server.run(); });
  const std::vector<std::pair<std::string, std::string>> streams = {
      {"/v1/chat/completions", "data: [DONE]"},
      {"/v1/completions", "data: [DONE]"},
      {"/v1/messages", "event: error"},
      {"/v1/responses", "response.failed"}};
  std::vector<std::unique_ptr<testing::RawConnection>> clients;
  for (const auto& [path, end] : streams) {
    std::string length = path == "/v1/responses" ? "max_output_tokens" : "max_tokens";
    clients.push_back(std::make_unique<testing::RawConnection>(server.port()));
    clients.back()->send(testing::raw_post(
        path, fmt::format(R"({{"messages":[{{"role":"user","content":"def"}}],"prompt":"def",)"
                          R"("input":"def","{}":1500,"ignore_eos":true,"stream":true}})",
                          length)));
    (void)clients.back()->read_until("data:");
  }
  Reply whole;
  std::thread waiting([&] {
    whole = call(server.port(), "POST", "/v1/completions",
                 R"({"prompt":"def","max_tokens":1500,"ignore_eos":true})", "");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto start = std::chrono::steady_clock::now();
  server.stop();
  runner.join();
  waiting.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
  for (size_t i = 0; i < streams.size(); ++i) {
    std::string answer = clients[i]->read_until_closed(std::chrono::seconds(5));
    EXPECT_NE(answer.find("shut down before this request finished"), std::string::npos)
        << streams[i].first << ": " << answer.substr(answer.size() > 600 ? answer.size() - 600 : 0);
    EXPECT_NE(answer.find(streams[i].second), std::string::npos) << streams[i].first;
    EXPECT_NE(answer.rfind("0\r\n\r\n"), std::string::npos) << streams[i].first;
  }
  EXPECT_EQ(whole.status, 503) << whole.body;
}

TEST_F(ServerTest, TokenizeAndDetokenize) {
  Reply tokens = call(port(), "POST", "/tokenize", R"({"prompt": "def add"})");
  ASSERT_EQ(tokens.status, 200);
  Json ids = tokens.json()["tokens"];
  EXPECT_EQ(tokens.json()["count"], ids.size());
  Reply text = call(port(), "POST", "/detokenize", Json{{"tokens", ids}}.dump());
  EXPECT_EQ(text.json()["prompt"], "def add");
  EXPECT_EQ(call(port(), "POST", "/detokenize", R"({"tokens": [-1]})").status, 400);
}

}  // namespace
}  // namespace deepinfer::server

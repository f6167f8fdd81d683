// `linearize serve` over HTTP: the built tool as a child process on a free loopback port, tiny models
// (a random teacher with the byte tokenizer and a Gated DeltaNet student of it). Greedy text through the
// server against `linearize generate`, for one client and 16 at once; streaming and chat; each bad request;
// a full queue; a client that leaves mid-stream; SIGTERM; and the official `openai` npm client.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "compat/child_process.h"
#include "model/model_io.h"
#include "model/student.h"
#include "test_util.h"
#include "train_fixtures.h"

using namespace linearize;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string tmpdir(const std::string& name) { return test::fresh_dir("serve_http", name); }

// Model folders: "teacher", "student" (Gated DeltaNet), "slow" (a wider teacher with a long context).
const std::string& model_dir(const std::string& name) {
  static std::map<std::string, std::string> dirs;
  if (dirs.count(name)) return dirs[name];
  static std::string tok = test::write_byte_tokenizer(tmpdir("tok"));
  auto config = test::small_llama(263, 32, 2, 4, 2, 64);
  if (name == "slow") config = test::small_llama(263, 128, 4, 4, 2, 256);
  config.eos_token_ids = {0};
  if (name == "slow") config.eos_token_ids.clear();  // its streams run to max_tokens
  config.max_position_embeddings = name == "slow" ? 16384 : 512;
  torch::manual_seed(21);
  CausalLM teacher(config);
  init_weights_normal(*teacher, 0.1);
  const std::string dir = tmpdir(name);
  if (name == "student") {
    auto spec = StudentSpec::make(MixerKind::gated_deltanet, "default", {}, config);
    auto student = build_student(teacher, spec);
    save_student(student, spec, dir, tok);
  } else {
    save_model(teacher, dir, tok);
  }
  return dirs[name] = dir;
}

// The served tool: started on port 0, its port read from its first line.
class Server {
 public:
  explicit Server(const std::string& model, std::vector<std::string> extra = {}) {
    log_ = tmpdir("log_" + std::to_string(++count_)) + "/serve.log";
    std::vector<std::string> args = {"serve", "--model", model, "--port", "0", "--model-name", "tiny"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = start_child(LINEARIZE_BINARY, args, {}, log_);
    const std::regex listening("on http://127\\.0\\.0\\.1:([0-9]+)");
    for (int i = 0; i < 600 && port_ == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::smatch m;
      const std::string text = log();
      if (std::regex_search(text, m, listening)) port_ = std::stoi(m[1]);
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
    }
    if (port_ == 0) ADD_FAILURE() << "the server did not start:\n" << log();
  }
  ~Server() {
    if (pid_ > 0) stop();
  }
  // SIGTERM; the exit status (128 + signal when a signal ended it).
  int stop() {
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  int port() const { return port_; }
  std::string log() const {
    std::ifstream in(log_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120);
    return c;
  }

 private:
  static inline int count_ = 0;
  std::string log_;
  pid_t pid_ = -1;
  int port_ = 0;
};

// Text as the server's JSON carries it: bytes that are not UTF-8 become U+FFFD.
std::string as_json_text(const std::string& s) {
  return json::parse(json(s).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
}

// The completion `linearize generate` prints after the prompt (greedy).
std::string generated(const std::string& model, const std::string& prompt, int tokens) {
  auto r = test::run_tool("generate --model " + model + " --prompt '" + prompt + "' --max-new-tokens " +
                          std::to_string(tokens));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.rfind(prompt, 0), 0u) << r.out;
  return as_json_text(r.out.substr(prompt.size(), r.out.size() - prompt.size() - 1));
}

json post(httplib::Client& c, const std::string& path, const json& body, int* status = nullptr) {
  auto res = c.Post(path.c_str(), body.dump(), "application/json");
  if (!res) {
    ADD_FAILURE() << "no response to " << path << ": " << httplib::to_string(res.error());
    return json();
  }
  if (status) *status = res->status;
  return json::parse(res->body);
}

json completion(const std::string& prompt, int tokens) {
  return {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", tokens}, {"temperature", 0}};
}

// POSTs `body` and hands the response body to `receive` as it comes (false: hang up).
void post_streaming(httplib::Client& c, const json& body, const std::function<bool(const char*, size_t)>& receive) {
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = body.dump();
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) { return receive(d, n); };
  httplib::Response res;
  httplib::Error error;
  if (!c.send(req, res, error) && error != httplib::Error::Canceled) ADD_FAILURE() << "request failed: " << httplib::to_string(error);
}

// The text of an SSE completion stream, and its events.
std::string stream_text(const std::string& sse, bool chat, std::vector<json>* events = nullptr) {
  std::string text;
  size_t at = 0;
  while ((at = sse.find("data: ", at)) != std::string::npos) {
    const size_t end = sse.find("\n\n", at);
    const std::string data = sse.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") break;
    auto j = json::parse(data);
    if (events) events->push_back(j);
    if (j.contains("choices") && !j["choices"].empty()) {
      const auto& c = j["choices"][0];
      text += chat ? c["delta"].value("content", "") : c.value("text", "");
    }
  }
  return text;
}

}  // namespace

TEST(ServeHttp, GreedyTextEqualsGenerateForOneAndSixteenClients) {
  for (const std::string name : {"teacher", "student"}) {
    SCOPED_TRACE(name);
    const std::string dir = model_dir(name);
    std::vector<std::string> prompts, expected;
    for (int i = 0; i < 8; ++i) {
      prompts.push_back("the cat " + std::string(static_cast<size_t>(i * 3), 'a') + " sees");
      expected.push_back(generated(dir, prompts.back(), 10 + i));
    }
    Server server(dir);
    ASSERT_GT(server.port(), 0);
    auto c = server.client();
    auto one = post(c, "/v1/completions", completion(prompts[0], 10));
    EXPECT_EQ(one["choices"][0]["text"], expected[0]) << one.dump();
    EXPECT_EQ(one["usage"]["completion_tokens"].get<int>() + one["usage"]["prompt_tokens"].get<int>(),
              one["usage"]["total_tokens"].get<int>());
    std::vector<json> replies(16);
    std::vector<std::thread> clients;
    for (int i = 0; i < 16; ++i)
      clients.emplace_back([&, i] {
        auto ci = server.client();
        replies[i] = post(ci, "/v1/completions", completion(prompts[i % 8], 10 + i % 8));
      });
    for (auto& t : clients) t.join();
    for (int i = 0; i < 16; ++i) EXPECT_EQ(replies[i]["choices"][0]["text"], expected[i % 8]) << "client " << i;
    auto health = json::parse(c.Get("/health")->body);
    EXPECT_LT(health["steps"].get<int>(), health["tokens"].get<int>()) << "no step served two sequences";
    EXPECT_EQ(server.stop(), 0) << server.log();
  }
}

TEST(ServeHttp, StreamingChatModelsAndBadRequests) {
  Server server(model_dir("teacher"));
  ASSERT_GT(server.port(), 0);
  auto c = server.client();
  // A streamed completion carries the same text as the whole one, then a finish, the usage and [DONE].
  auto whole = post(c, "/v1/completions", completion("the cat", 12));
  auto body = completion("the cat", 12);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto res = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  std::vector<json> events;
  EXPECT_EQ(stream_text(res->body, false, &events), whole["choices"][0]["text"]);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events[events.size() - 2]["choices"][0]["finish_reason"], whole["choices"][0]["finish_reason"]);
  EXPECT_EQ(events.back()["usage"], whole["usage"]);
  EXPECT_NE(res->body.find("data: [DONE]"), std::string::npos);

  // Chat through the ChatML markers, whole and streamed.
  json chat = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 9}, {"temperature", 0}};
  auto reply = post(c, "/v1/chat/completions", chat);
  EXPECT_EQ(reply["object"], "chat.completion");
  EXPECT_EQ(reply["choices"][0]["message"]["role"], "assistant");
  chat["stream"] = true;
  res = c.Post("/v1/chat/completions", chat.dump(), "application/json");
  ASSERT_TRUE(res);
  events.clear();
  EXPECT_EQ(stream_text(res->body, true, &events), reply["choices"][0]["message"]["content"]);
  EXPECT_EQ(events.front()["choices"][0]["delta"]["role"], "assistant");

  auto models = json::parse(c.Get("/v1/models")->body);
  EXPECT_EQ(models["data"][0]["id"], "tiny");

  // Each bad request: its status, and the field named in OpenAI's error body.
  auto error_of = [&](const std::string& path, const std::string& raw) {
    auto r = c.Post(path.c_str(), raw, "application/json");
    EXPECT_TRUE(r);
    auto j = json::parse(r->body);
    EXPECT_TRUE(j.contains("error")) << r->body;
    return std::make_pair(r->status, j["error"]["param"].is_null() ? std::string("-") : j["error"]["param"].get<std::string>());
  };
  using P = std::pair<int, std::string>;
  EXPECT_EQ(error_of("/v1/completions", "{oops"), P(400, "-"));
  EXPECT_EQ(error_of("/v1/completions", R"({"model": "gpt-4", "prompt": "x"})"), P(400, "model"));
  EXPECT_EQ(error_of("/v1/completions", R"({"model": "tiny", "prompt": ["x", 2]})"), P(400, "prompt"));
  EXPECT_EQ(error_of("/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": 0})"), P(400, "max_tokens"));
  EXPECT_EQ(error_of("/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": 1000000000})"), P(400, "max_tokens"));
  EXPECT_EQ(error_of("/v1/completions", R"({"model": "tiny", "prompt": "x", "temperature": "warm"})"), P(400, "temperature"));
  EXPECT_EQ(error_of("/v1/completions", json({{"model", "tiny"}, {"prompt", std::string(2000, 'z')}}).dump()), P(400, "prompt"));
  EXPECT_EQ(error_of("/v1/chat/completions", R"({"model": "tiny", "messages": "hi"})"), P(400, "messages"));
  EXPECT_EQ(error_of("/v1/completions", R"({"model": "tiny", "prompt": [5, 263]})"), P(400, "prompt"));
  EXPECT_EQ(error_of("/v1/completions", std::string(9 << 20, ' ')).first, 413);
  auto missing = c.Get("/v2/everything");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_TRUE(json::parse(missing->body).contains("error"));
  // The server is still serving.
  auto again = post(c, "/v1/completions", completion("the cat", 12));
  EXPECT_EQ(again["choices"], whole["choices"]);
  EXPECT_EQ(again["usage"], whole["usage"]);
}

TEST(ServeHttp, FullQueueLeavingClientsAndShutdown) {
  // One sequence at a time and no queue: a second request while one runs gets 429.
  Server server(model_dir("slow"), {"--max-sequences", "1", "--max-queue", "0"});
  ASSERT_GT(server.port(), 0);
  auto health = [&] { return json::parse(server.client().Get("/health")->body); };
  // A long stream whose client leaves (once the busy server has been tried) after a few more events.
  std::atomic<int> events{0};
  std::atomic<bool> may_leave{false};
  std::thread leaving([&] {
    auto c = server.client();
    auto body = completion("the cat", 12000);
    body["stream"] = true;
    post_streaming(c, body, [&](const char*, size_t) { return !may_leave || ++events < 5; });  // false: hang up
  });
  for (int i = 0; i < 600 && health()["running"] == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (health()["running"] != 1) {
    ADD_FAILURE() << "the long request is not running: " << health().dump() << "\n" << server.log();
    may_leave = true;
    leaving.join();
    return;
  }
  auto c = server.client();
  int status = 0;
  auto busy = post(c, "/v1/completions", completion("the cat", 5), &status);
  EXPECT_EQ(status, 429);
  EXPECT_EQ(busy["error"]["type"], "rate_limit_error");
  may_leave = true;
  leaving.join();
  // The sequence is freed at once (12000 tokens would take far longer).
  const auto t0 = std::chrono::steady_clock::now();
  while (health()["running"] != 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(health()["running"], 0);
  EXPECT_LT(health()["tokens"].get<int>(), 6000);
  // SIGTERM mid-stream: the stream ends with an error event and the server exits 0.
  std::string sse;
  std::thread streaming([&] {
    auto cs = server.client();
    auto body = completion("the cat", 12000);
    body["stream"] = true;
    post_streaming(cs, body, [&](const char* d, size_t n) {
      sse.append(d, n);
      return true;
    });
  });
  for (int i = 0; i < 600 && health()["running"] == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(server.stop(), 0) << server.log();
  streaming.join();
  EXPECT_NE(sse.find("shutting down"), std::string::npos) << sse.substr(sse.size() > 300 ? sse.size() - 300 : 0);
}

TEST(ServeHttp, ABurstOfClientsIsServedInFull) {
  // 128 connections at once: httplib's own listen backlog (5) dropped about one in ten of them.
  Server server(model_dir("slow"));
  ASSERT_GT(server.port(), 0);
  std::atomic<int> ok{0};
  std::vector<std::string> failures(128);
  std::vector<std::thread> clients;
  for (int i = 0; i < 128; ++i)
    clients.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", server.port());
      c.set_read_timeout(300);
      auto r = c.Post("/v1/completions", completion("the cat", 16).dump(), "application/json");
      if (r && r->status == 200) ++ok;
      else failures[i] = r ? std::to_string(r->status) : httplib::to_string(r.error());
    });
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok, 128);
  for (int i = 0; i < 128; ++i) EXPECT_TRUE(failures[i].empty()) << "client " << i << ": " << failures[i];
}

TEST(ServeHttp, OfficialOpenAiNodeClient) {
  // The `openai` npm package, installed by scripts/test.sh into build/npm (LINEARIZE_NPM_PREFIX elsewhere).
  const char* prefix_env = std::getenv("LINEARIZE_NPM_PREFIX");
  const fs::path prefix = prefix_env ? fs::path(prefix_env) : fs::path(LINEARIZE_BINARY).parent_path() / "npm";
  if (!fs::exists(prefix / "node_modules" / "openai" / "package.json"))
    GTEST_SKIP() << "the openai npm package is not in " << prefix << " (scripts/test.sh installs it with npm)";
  if (std::system("node --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "node is not installed";
  const std::string dir = model_dir("teacher");
  const std::string expected = generated(dir, "the cat", 8);
  Server server(dir);
  ASSERT_GT(server.port(), 0);
  const std::string script = std::string(LINEARIZE_SOURCE_DIR) + "/tests/serve/openai_client.mjs";
  const std::string copy = (prefix / "openai_client.mjs").string();  // next to node_modules, so that it resolves
  fs::copy_file(script, copy, fs::copy_options::overwrite_existing);
  setenv("OPENAI_BASE_URL", ("http://127.0.0.1:" + std::to_string(server.port()) + "/v1").c_str(), 1);
  setenv("MODEL", "tiny", 1);
  setenv("PROMPT", "the cat", 1);
  setenv("EXPECTED", expected.c_str(), 1);
  FILE* p = popen(("node " + copy + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << out;
  EXPECT_NE(out.find("all agree"), std::string::npos) << out;
}

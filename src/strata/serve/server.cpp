#include "strata/serve/server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <memory>
#include <thread>

#include "strata/base/error.h"
#include "strata/engine/model.h"
#include "strata/serve/api_error.h"
#include "strata/serve/assistant_stream.h"
#include "strata/serve/job.h"
#include "strata/serve/metrics.h"
#include "strata/serve/omp_wait_policy.h"
#include "strata/serve/requests.h"
#include "strata/serve/responses.h"
#include "strata/serve/scheduler.h"
#include "strata/text/tokenizer.h"
#include "strata/text/vocab.h"

namespace strata::serve {
namespace {

using namespace std::chrono_literals;

std::atomic<bool> g_stop_requested{false};
extern "C" void on_stop_signal(int) { g_stop_requested.store(true); }

constexpr const char* kJson = "application/json";

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param = "",
                const std::string& code = "") {
  res.status = status;
  res.set_content(error_body(status, error_type_for_status(status), message, param, code), kJson);
}

void send_busy(httplib::Response& res, const std::string& message) {
  res.set_header("Retry-After", "1");
  send_error(res, 503, message);
}

// Routes named in metrics (anything else counts as "other", so clients cannot grow the label set).
std::string route_label(const std::string& path) {
  static const char* known[] = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics",
                                "/tokenize", "/detokenize"};
  for (const char* k : known)
    if (path == k) return k;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

// Compares without an early exit, so the time taken does not reveal how much of a key was right.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % std::max<size_t>(1, b.size())]);
  return diff == 0;
}

std::string default_model_name(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0) name.resize(name.size() - 5);
  return name;
}

class ApiServer {
 public:
  explicit ApiServer(const ServeOptions& o) : opt_(o) {
    if (opt_.model_name.empty()) opt_.model_name = default_model_name(opt_.model_path);
    if (opt_.queue < 0) opt_.queue = 4 * opt_.slots;
  }

  int run();

 private:
  void load();
  void install_routes();
  void watch_for_stop();

  void handle_chat(const httplib::Request& req, httplib::Response& res);
  void handle_completion(const httplib::Request& req, httplib::Response& res);
  void handle_tokenize(const httplib::Request& req, httplib::Response& res);
  void handle_detokenize(const httplib::Request& req, httplib::Response& res);
  void handle_models(const httplib::Request& req, httplib::Response& res);

  void check_model(const std::string& requested) const;
  std::vector<int32_t> encode_prompt(const std::string& text, bool add_special) const;
  void check_context(size_t prompt_tokens) const;
  std::shared_ptr<Job> admit(std::vector<int32_t> prompt, const RequestParams& params);
  // Non-streaming: waits for the job and returns its text (throws ApiError when it did not finish).
  std::string collect(Job& job) const;

  ServeOptions opt_;
  httplib::Server http_;
  Metrics metrics_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> listener_ended_{false};
  std::atomic<bool> load_failed_{false};
  std::string load_error_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Scheduler> scheduler_;
  bool chat_ok_ = false;
  std::string chat_problem_;
  int ctx_ = 0;
  int64_t n_vocab_ = 0;
};

void ApiServer::load() {
  try {
    model_ = Model::load(opt_.model_path);
    tokenizer_ = std::make_unique<Tokenizer>(vocab_from_gguf(model_->file()));
    try {
      detect_chat_family(tokenizer_->vocab().chat_template);
      chat_ok_ = true;
    } catch (const Error& e) {
      chat_problem_ = e.what();
    }
    ctx_ = opt_.ctx;
    const int trained = model_->config().n_ctx_train;
    if (trained > 0 && ctx_ > trained) ctx_ = trained;
    n_vocab_ = std::min<int64_t>(model_->config().n_vocab, tokenizer_->n_vocab());
    const int hw = opt_.threads > 0 ? opt_.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    SchedulerConfig sc;
    sc.slots = opt_.slots;
    sc.queue_limit = opt_.queue;
    sc.ctx = ctx_;
    sc.threads_per_slot = std::max(1, hw / opt_.slots);
    sc.make_sequence = opt_.make_sequence;
    if (opt_.make_route_recorder) sc.record_routes = opt_.make_route_recorder(*model_);
    if (opt_.make_routing_trace) sc.trace = opt_.make_routing_trace(*model_);
    sc.sequence_metrics = opt_.sequence_metrics;
    scheduler_ = std::make_unique<Scheduler>(*model_, *tokenizer_, sc, metrics_);
    std::fprintf(stderr, "strata serve: model '%s' ready on %s (%d slots x %d tokens, queue %d, %d threads per slot)\n",
                 opt_.model_name.c_str(), opt_.backend.c_str(), sc.slots, sc.ctx, sc.queue_limit, sc.threads_per_slot);
    ready_.store(true);
  } catch (const std::exception& e) {
    load_error_ = e.what();
    load_failed_.store(true);
    g_stop_requested.store(true);
  }
}

void ApiServer::check_model(const std::string& requested) const {
  if (!requested.empty() && requested != opt_.model_name) {
    throw ApiError(404, "invalid_request_error", "model", "model_not_found",
                   cat("the model '", requested, "' does not exist (this server serves '", opt_.model_name, "')"));
  }
}

std::vector<int32_t> ApiServer::encode_prompt(const std::string& text, bool add_special) const {
  std::vector<int32_t> ids;
  if (add_special && tokenizer_->vocab().add_bos && tokenizer_->bos_id() >= 0) ids.push_back(tokenizer_->bos_id());
  const std::vector<int32_t> body = tokenizer_->encode(text, add_special);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

void ApiServer::check_context(size_t prompt_tokens) const {
  if (prompt_tokens == 0) bad_request("prompt", "the prompt is empty");
  // At least one position must stay free for the first generated token.
  if (prompt_tokens >= static_cast<size_t>(ctx_)) {
    throw ApiError(400, "invalid_request_error", "messages", "context_length_exceeded",
                   cat("this model's context is ", ctx_, " tokens per sequence, but the prompt has ", prompt_tokens,
                       " tokens; shorten the prompt"));
  }
}

std::shared_ptr<Job> ApiServer::admit(std::vector<int32_t> prompt, const RequestParams& params) {
  auto job = std::make_shared<Job>(std::move(prompt), params);
  switch (scheduler_->submit(job)) {
    case Scheduler::Admission::Accepted: return job;
    case Scheduler::Admission::QueueFull:
      metrics_.count_rejected();
      throw ApiError(503, "server_overloaded", "", "queue_full", "all slots are busy and the queue is full; retry later");
    case Scheduler::Admission::ShuttingDown:
      metrics_.count_rejected();
      throw ApiError(503, "server_overloaded", "", "shutting_down", "the server is shutting down");
  }
  return job;
}

std::string ApiServer::collect(Job& job) const {
  std::string text;
  while (!job.take(text, 1000ms)) {
  }
  const JobOutcome& o = job.outcome();
  if (o.kind == JobOutcome::Kind::Failed) throw ApiError(500, "server_error", "", "", cat("generation failed: ", o.error));
  if (o.kind == JobOutcome::Kind::Rejected || o.kind == JobOutcome::Kind::Cancelled) {
    throw ApiError(503, "server_overloaded", "", "shutting_down",
                   o.error.empty() ? std::string("the request was cancelled: the server is shutting down") : o.error);
  }
  return text;
}

// ---- streaming -------------------------------------------------------------------------------

// What one server-sent-event stream carries between calls of the content provider.
struct StreamState {
  std::shared_ptr<Job> job;
  ResponseMeta meta;
  bool chat = true;
  bool include_usage = false;
  bool started = false;
  AssistantStreamSplitter splitter{false};
  std::string forced_prefix;  // text the prompt put in the model's mouth (a forced tool call)
};

OrderedJson delta_json(const AssistantDelta& d) {
  OrderedJson j = OrderedJson::object();
  if (!d.reasoning.empty()) j["reasoning_content"] = d.reasoning;
  if (!d.content.empty()) j["content"] = d.content;
  return j;
}

// Produces the next piece of the event stream; returns true when the stream is complete.
bool next_events(StreamState& st, std::string& out) {
  std::string text;
  const bool finished = st.job->take(text, 500ms);
  if (!st.started) {
    st.started = true;
    if (st.chat) {
      out += sse_data(chat_chunk_json(st.meta, {{"role", "assistant"}, {"content", ""}}, nullptr));
      if (!st.forced_prefix.empty()) st.splitter.push(st.forced_prefix);
    }
  }
  if (!text.empty()) {
    if (st.chat) {
      const AssistantDelta d = st.splitter.push(text);
      if (!d.reasoning.empty() || !d.content.empty()) out += sse_data(chat_chunk_json(st.meta, delta_json(d), nullptr));
    } else {
      out += sse_data(completion_chunk_json(st.meta, text, nullptr));
    }
  }
  if (!finished) return false;

  const JobOutcome& o = st.job->outcome();
  if (o.kind != JobOutcome::Kind::Finished) {
    const std::string why = o.kind == JobOutcome::Kind::Failed ? cat("generation failed: ", o.error)
                                                               : std::string("the request was cancelled: the server is shutting down");
    const int status = o.kind == JobOutcome::Kind::Failed ? 500 : 503;
    out += "data: " + error_body(status, error_type_for_status(status), why) + "\n\n";
    out += "data: [DONE]\n\n";
    return true;
  }
  bool tool_calls = false;
  if (st.chat) {
    AssistantStreamSplitter::Final f = st.splitter.finish();
    if (!f.delta.reasoning.empty() || !f.delta.content.empty()) out += sse_data(chat_chunk_json(st.meta, delta_json(f.delta), nullptr));
    if (!f.tool_calls.empty()) {
      tool_calls = true;
      out += sse_data(chat_chunk_json(st.meta, {{"tool_calls", tool_calls_json(f.tool_calls, true)}}, nullptr));
    }
    out += sse_data(chat_chunk_json(st.meta, OrderedJson::object(), finish_reason(o.stop_reason, tool_calls)));
  } else {
    out += sse_data(completion_chunk_json(st.meta, "", finish_reason(o.stop_reason, false)));
  }
  if (st.include_usage) {
    OrderedJson last;
    last["id"] = st.meta.id;
    last["object"] = st.chat ? "chat.completion.chunk" : "text_completion";
    last["created"] = st.meta.created;
    last["model"] = st.meta.model;
    last["choices"] = OrderedJson::array();
    last["usage"] = usage_json(o);
    out += sse_data(last);
  }
  out += "data: [DONE]\n\n";
  return true;
}

void start_stream(httplib::Response& res, std::shared_ptr<StreamState> st) {
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st](size_t, httplib::DataSink& sink) {
        std::string out;
        const bool done = next_events(*st, out);
        // Nothing new: an SSE comment, which clients ignore; a failed write is how a vanished client shows.
        if (out.empty()) out = ": keep-alive\n\n";
        if (!sink.write(out.data(), out.size())) {
          st->job->cancel();
          return false;
        }
        if (done) sink.done();
        return true;
      },
      [st](bool success) {
        if (!success) st->job->cancel();  // the client went away (or the write failed): free the slot
      });
}

// ---- handlers --------------------------------------------------------------------------------

void ApiServer::handle_chat(const httplib::Request& req, httplib::Response& res) {
  ChatRequest r = parse_chat_request(req.body, n_vocab_);
  check_model(r.model);
  if (!chat_ok_) bad_request("messages", "this model has no supported chat template (", chat_problem_, "); use /v1/completions");
  const bool tools_on = !r.tools.is_null() && r.tool_choice != ToolChoice::None;
  ChatOptions co;
  co.enable_thinking = r.enable_thinking;
  // A required or named tool call is forced by writing its start into the answer: the template's own
  // tool-call format, after an empty think block.
  std::string forced;
  if (tools_on && r.tool_choice == ToolChoice::Required) forced = "<tool_call>\n";
  if (tools_on && r.tool_choice == ToolChoice::Named) {
    forced = "<tool_call>\n{\"name\": " + python_json_dumps(OrderedJson(r.tool_choice_name)) + ", \"arguments\": ";
  }
  if (!forced.empty()) co.enable_thinking = false;
  std::string prompt_text;
  try {
    prompt_text = render_chat(r.messages, tools_on ? r.tools : OrderedJson(), co) + forced;
  } catch (const Error& e) {
    bad_request("messages", e.what());
  }
  std::vector<int32_t> prompt = encode_prompt(prompt_text, true);
  check_context(prompt.size());
  auto job = admit(std::move(prompt), r.gen);
  ResponseMeta meta{make_response_id("chatcmpl-"), static_cast<int64_t>(std::time(nullptr)), opt_.model_name};
  if (r.gen.stream) {
    auto st = std::make_shared<StreamState>();
    st->job = job;
    st->meta = meta;
    st->chat = true;
    st->include_usage = r.gen.include_usage;
    st->splitter = AssistantStreamSplitter(tools_on);
    st->forced_prefix = forced;
    start_stream(res, st);
    return;
  }
  const std::string text = collect(*job);
  AssistantOutput answer;
  if (tools_on) {
    answer = parse_assistant_output(forced + text);
  } else {
    // Without tools, <tool_call> text is just text: split off the reasoning only.
    AssistantStreamSplitter split(false);
    AssistantDelta d = split.push(text);
    AssistantStreamSplitter::Final f = split.finish();
    answer.reasoning_content = d.reasoning + f.delta.reasoning;
    answer.content = d.content + f.delta.content;
  }
  const JobOutcome& o = job->outcome();
  res.set_content(dump_json(chat_completion_json(meta, answer, finish_reason(o.stop_reason, !answer.tool_calls.empty()), o)), kJson);
}

void ApiServer::handle_completion(const httplib::Request& req, httplib::Response& res) {
  CompletionRequest r = parse_completion_request(req.body, n_vocab_);
  check_model(r.model);
  std::vector<int32_t> prompt = r.prompt_text ? encode_prompt(*r.prompt_text, true) : r.prompt_tokens;
  check_context(prompt.size());
  auto job = admit(std::move(prompt), r.gen);
  ResponseMeta meta{make_response_id("cmpl-"), static_cast<int64_t>(std::time(nullptr)), opt_.model_name};
  if (r.gen.stream) {
    auto st = std::make_shared<StreamState>();
    st->job = job;
    st->meta = meta;
    st->chat = false;
    st->include_usage = r.gen.include_usage;
    start_stream(res, st);
    return;
  }
  const std::string text = collect(*job);
  const JobOutcome& o = job->outcome();
  res.set_content(dump_json(completion_json(meta, text, finish_reason(o.stop_reason, false), o)), kJson);
}

void ApiServer::handle_tokenize(const httplib::Request& req, httplib::Response& res) {
  TokenizeRequest r = parse_tokenize_request(req.body);
  std::string text;
  if (r.content) {
    text = *r.content;
  } else {
    if (!chat_ok_) bad_request("messages", "this model has no supported chat template (", chat_problem_, ")");
    try {
      text = render_chat(r.messages, r.tools, ChatOptions{});
    } catch (const Error& e) {
      bad_request("messages", e.what());
    }
  }
  OrderedJson j;
  j["tokens"] = encode_prompt(text, r.add_special);
  res.set_content(dump_json(j), kJson);
}

void ApiServer::handle_detokenize(const httplib::Request& req, httplib::Response& res) {
  DetokenizeRequest r = parse_detokenize_request(req.body, n_vocab_);
  OrderedJson j;
  j["content"] = tokenizer_->decode(r.tokens);
  res.set_content(dump_json(j), kJson);
}

void ApiServer::handle_models(const httplib::Request& req, httplib::Response& res) {
  OrderedJson m;
  m["id"] = opt_.model_name;
  m["object"] = "model";
  m["created"] = 0;
  m["owned_by"] = "strata";
  if (req.matches.size() > 1) {
    check_model(req.matches[1].str());
    res.set_content(dump_json(m), kJson);
    return;
  }
  OrderedJson j;
  j["object"] = "list";
  j["data"] = OrderedJson::array({m});
  res.set_content(dump_json(j), kJson);
}

// Wraps a handler: ApiError -> its status and body; strata::Error (a bad value that got past the
// parser) -> 400; anything else -> 500. Never lets an exception reach the HTTP library.
template <class F>
httplib::Server::Handler guarded(F f) {
  return [f](const httplib::Request& req, httplib::Response& res) {
    try {
      f(req, res);
    } catch (const ApiError& e) {
      if (e.status == 503) res.set_header("Retry-After", "1");
      res.status = e.status;
      res.set_content(error_body(e), kJson);
    } catch (const Error& e) {
      send_error(res, 400, e.what());
    } catch (const std::exception& e) {
      send_error(res, 500, cat("internal error: ", e.what()));
    }
  };
}

void ApiServer::install_routes() {
  http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (!opt_.api_key.empty()) {
      const std::string auth = req.get_header_value("Authorization");
      const std::string prefix = "Bearer ";
      if (auth.rfind(prefix, 0) != 0 || !same_secret(auth.substr(prefix.size()), opt_.api_key)) {
        res.set_header("WWW-Authenticate", "Bearer");
        send_error(res, 401, "invalid or missing API key (send 'Authorization: Bearer <key>')", "", "invalid_api_key");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (!ready_.load() && req.path != "/metrics") {
      send_busy(res, "the model is loading");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  http_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (ready_.load()) {
      res.set_content("{\"status\":\"ok\"}", kJson);
    } else {
      res.status = 503;
      res.set_header("Retry-After", "1");
      res.set_content("{\"status\":\"loading\"}", kJson);
    }
  });
  http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const SchedulerGauges g = ready_.load() ? scheduler_->gauges() : SchedulerGauges{};
    const std::string extra = ready_.load() ? scheduler_->sequence_metrics() : std::string();
    res.set_content(metrics_.render(g, ready_.load()) + extra, "text/plain; version=0.0.4; charset=utf-8");
  });
  http_.Get("/v1/models", guarded([this](const auto& req, auto& res) { handle_models(req, res); }));
  http_.Get(R"(/v1/models/(.+))", guarded([this](const auto& req, auto& res) { handle_models(req, res); }));
  http_.Post("/v1/chat/completions", guarded([this](const auto& req, auto& res) { handle_chat(req, res); }));
  http_.Post("/v1/completions", guarded([this](const auto& req, auto& res) { handle_completion(req, res); }));
  http_.Post("/tokenize", guarded([this](const auto& req, auto& res) { handle_tokenize(req, res); }));
  http_.Post("/detokenize", guarded([this](const auto& req, auto& res) { handle_detokenize(req, res); }));

  // Statuses the library sets itself (404 no route, 413 body too large, 400 bad request line, ...)
  // get an OpenAI-shaped body too.
  http_.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string message;
    switch (res.status) {
      case 404: message = cat("unknown route: ", req.method, " ", req.path); break;
      case 413: message = "the request body is too large"; break;
      case 414: message = "the request URI is too long"; break;
      default: message = cat("HTTP ", res.status); break;
    }
    res.set_content(error_body(res.status, error_type_for_status(res.status), message), kJson);
    return httplib::Server::HandlerResponse::Handled;
  }));
  http_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, 500, cat("internal error: ", what));
  });
  http_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics_.count_request(route_label(req.path), res.status);
  });
}

// Runs beside the listener: on SIGINT/SIGTERM it stops taking new work, lets running requests finish
// (for up to the grace period), cancels what is left, then stops the listener.
// It waits on its own flag for the listener's end, not on http_.is_running(): that turns true only once
// listen_after_bind() has started, and a watcher that looked before then used to return at once,
// leaving SIGTERM unanswered.
void ApiServer::watch_for_stop() {
  while (!g_stop_requested.load() && !listener_ended_.load()) std::this_thread::sleep_for(50ms);
  if (listener_ended_.load()) return;  // the listener ended by itself
  if (ready_.load()) {
    std::fprintf(stderr, "strata serve: stopping (finishing running requests)\n");
    scheduler_->stop_accepting();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(opt_.shutdown_grace_s);
    while (!scheduler_->idle() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(20ms);
    scheduler_->cancel_running();
    const auto hard = std::chrono::steady_clock::now() + 10s;
    while (!scheduler_->idle() && std::chrono::steady_clock::now() < hard) std::this_thread::sleep_for(20ms);
    // Let the streams that just ended write their last events before the sockets close.
    std::this_thread::sleep_for(200ms);
  }
  // stop() does nothing while the listener has not started yet (a signal or a failed load right
  // after bind), so it is repeated until the listener has ended.
  while (!listener_ended_.load()) {
    http_.stop();
    std::this_thread::sleep_for(50ms);
  }
}

int ApiServer::run() {
  if (opt_.slots < 1) fail("--slots must be >= 1, got ", opt_.slots);
  if (opt_.ctx < 2) fail("--ctx must be >= 2, got ", opt_.ctx);
  if (opt_.timeout_s < 1) fail("--timeout must be >= 1 second, got ", opt_.timeout_s);
  install_routes();
  http_.set_payload_max_length(opt_.max_body_bytes);
  http_.set_read_timeout(opt_.timeout_s, 0);
  http_.set_write_timeout(opt_.timeout_s, 0);
  http_.set_keep_alive_timeout(5);
  // One thread per connection being served: enough for every slot, the whole queue, and the quick
  // routes (health, metrics, rejected requests) beside them.
  const size_t threads = static_cast<size_t>(opt_.slots + opt_.queue + 32);
  http_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };

  g_stop_requested.store(false);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that vanished must not kill the server on write

  if (!http_.bind_to_port(opt_.host, opt_.port)) fail("cannot listen on ", opt_.host, ":", opt_.port, " (address in use or not available)");
  std::fprintf(stderr, "strata serve: listening on http://%s:%d\n", opt_.host.c_str(), opt_.port);
  std::thread loader([this] { load(); });
  std::thread watcher([this] { watch_for_stop(); });
  const bool listened = http_.listen_after_bind();
  listener_ended_.store(true);
  watcher.join();
  loader.join();
  scheduler_.reset();
  if (load_failed_.load()) fail("cannot load the model: ", load_error_);
  if (!listened && !g_stop_requested.load()) fail("the HTTP listener failed");
  std::fprintf(stderr, "strata serve: stopped\n");
  return 0;
}

}  // namespace

int run_server(const ServeOptions& options) {
  use_passive_omp_waits();  // may re-execute the process; see omp_wait_policy.h
  ApiServer server(options);
  return server.run();
}

}  // namespace strata::serve

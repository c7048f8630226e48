#include "strata/serve/server.h"

#include <httplib.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <memory>
#include <thread>

#include "strata/base/error.h"
#include "strata/engine/model.h"
#include "strata/engine/thread_policy.h"
#include "strata/serve/http_guard.h"
#include "strata/text/chat_template.h"
#include "strata/serve/api_error.h"
#include "strata/serve/anthropic.h"
#include "strata/serve/assistant_stream.h"
#include "strata/serve/chat_stream.h"
#include "strata/serve/expert_stats.h"
#include "strata/serve/job.h"
#include "strata/serve/metrics.h"
#include "strata/serve/omp_wait_policy.h"
#include "strata/serve/openai_responses.h"
#include "strata/serve/requests.h"
#include "strata/serve/responses.h"
#include "strata/serve/scheduler.h"
#include "strata/serve/structured_output.h"
#include "strata/serve/webui.h"
#include "strata/text/tokenizer.h"
#include "strata/text/vocab.h"

namespace strata::serve {
namespace {

using namespace std::chrono_literals;

std::atomic<bool> g_stop_requested{false};
extern "C" void on_stop_signal(int) { g_stop_requested.store(true); }

constexpr const char* kJson = "application/json";
constexpr int kKeepAliveSeconds = 5;

// Anthropic's routes answer every error in Anthropic's shape, which its SDK reads.
bool anthropic_route(const std::string& path) { return path.rfind("/v1/messages", 0) == 0; }

// An error raised before or without a handler (the pre-routing checks, the router, the HTTP library), in
// the shape of the path's API.
void send_route_error(const httplib::Request& req, httplib::Response& res, int status, const std::string& message,
                      const std::string& code = "") {
  const ApiError e(status, error_type_for_status(status), "", code, message);
  res.status = status;
  res.set_content(anthropic_route(req.path) ? anthropic_error_body(e) : error_body(e), kJson);
}

// Routes named in metrics (anything else counts as "other", so clients cannot grow the label set).
std::string route_label(const std::string& path) {
  static const char* known[] = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics",
                                "/tokenize", "/detokenize", "/v1/messages", "/v1/messages/count_tokens",
                                "/v1/responses", "/v1/strata/experts", "/"};
  for (const char* k : known)
    if (path == k) return k;
  if (path.rfind("/webui/", 0) == 0) return "/webui/{file}";
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

// Bursts wait for a slot rather than fail: room for this many waiting requests per slot by default.
constexpr int kQueuePerSlot = 64;
// Connections beyond the slots and the queue: quick routes (health, metrics, models) and clients
// between requests.
constexpr int kSpareConnections = 64;

ServeOptions with_defaults(ServeOptions o) {
  if (o.model_name.empty()) o.model_name = default_model_name(o.model_path);
  if (o.queue < 0) o.queue = kQueuePerSlot * o.slots;
  if (o.max_connections < 0) o.max_connections = o.slots + o.queue + kSpareConnections;
  return o;
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// The JSON body, read as it arrives (any transfer or content encoding, Content-Type ignored but for
// multipart, which cannot be JSON) and refused once it passes `limit`, before the rest is read.
std::string read_body(const httplib::Request& req, const httplib::ContentReader& reader, size_t limit) {
  Connection* conn = current_connection();
  auto refuse = [&](int status, const std::string& code, const std::string& message) {
    if (conn) conn->close_after_answer();  // the rest of the body stays unread: this connection is done
    throw ApiError(status, "invalid_request_error", "", code, message);
  };
  const std::string too_large = cat("the request body is larger than the server's limit of ", limit,
                                    " bytes (--max-body)");
  if (req.is_multipart_form_data())
    refuse(415, "unsupported_media_type",
           "multipart/form-data cannot carry a JSON request; send the JSON itself as the body");
  if (req.has_header("Content-Length")) {
    const std::string v = req.get_header_value("Content-Length");
    char* end = nullptr;
    errno = 0;
    const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno != 0) refuse(400, "", "the Content-Length header is not a number");
    if (n > limit) refuse(413, "request_too_large", too_large);
  }
  std::string body;
  bool over = false;
  const bool ok = reader([&](const char* data, size_t n) {
    if (body.size() + n > limit) {
      over = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
  if (over) refuse(413, "request_too_large", too_large);
  if (!ok) refuse(400, "", "the request body could not be read (broken chunked encoding, or the client stopped sending)");
  if (conn) conn->request_read();
  return body;
}

// An error body in one API's shape (OpenAI's by default, Anthropic's on /v1/messages).
using ErrorFormat = std::string (*)(const ApiError&);

// Runs a handler: ApiError -> its status and body; strata::Error (a bad value that got past the
// parser) -> 400; anything else -> 500. Never lets an exception reach the HTTP library.
template <class F>
void answer_errors(httplib::Response& res, F&& f, ErrorFormat format = error_body) {
  const auto send = [&](const ApiError& e) {
    if (e.status == 503) res.set_header("Retry-After", "1");
    res.status = e.status;
    res.set_content(format(e), kJson);
  };
  try {
    f();
  } catch (const ApiError& e) {
    send(e);
  } catch (const Error& e) {
    send(ApiError(400, error_type_for_status(400), "", "", e.what()));
  } catch (const std::exception& e) {
    send(ApiError(500, error_type_for_status(500), "", "", cat("internal error: ", e.what())));
  }
}

template <class F>
httplib::Server::Handler guarded(F f) {
  return [f](const httplib::Request& req, httplib::Response& res) { answer_errors(res, [&] { f(req, res); }); };
}

// A route with a JSON body: f(body, res).
template <class F>
httplib::Server::HandlerWithContentReader guarded_body(size_t limit, F f, ErrorFormat format = error_body) {
  return [f, limit, format](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
    answer_errors(res, [&] { f(read_body(req, reader, limit), res); }, format);
  };
}

class ApiServer {
 public:
  explicit ApiServer(const ServeOptions& o) : opt_(with_defaults(o)), guard_(http_, guard_options()) {}

  int run();

 private:
  void load();
  void install_routes();
  GuardOptions guard_options();
  void watch_for_stop();

  void handle_chat(const std::string& body, httplib::Response& res);
  void handle_messages(const std::string& body, httplib::Response& res);
  void handle_count_tokens(const std::string& body, httplib::Response& res);
  void handle_responses(const std::string& body, httplib::Response& res);
  void handle_completion(const std::string& body, httplib::Response& res);
  void handle_tokenize(const std::string& body, httplib::Response& res);
  void handle_detokenize(const std::string& body, httplib::Response& res);
  void handle_models(const httplib::Request& req, httplib::Response& res);
  void handle_webui(const std::string& name, httplib::Response& res);

  void check_model(const std::string& requested) const;
  std::vector<int32_t> encode_prompt(const std::string& text, bool add_special) const;
  // BOS when the vocabulary asks for it, then the conversation with control tokens only where the
  // template wrote them (all of them with --parse-special), then `suffix` as plain text.
  std::vector<int32_t> encode_chat(const RenderedChat& chat, const std::string& suffix) const;
  void check_context(size_t prompt_tokens, const char* param) const;
  // A chat request's prompt, as every chat API (chat completions, messages, responses) builds it.
  struct ChatPrompt {
    std::vector<int32_t> tokens;
    std::string forced;  // what the prompt puts in the model's mouth (a forced tool call's start)
    bool tools_on = false;
  };
  // Also sets r.gen.grammar for a required or named tool call. `param`: the field a too-long prompt is blamed on;
  // check_fit: refuse a prompt the context cannot hold (off for counting a prompt's tokens).
  ChatPrompt chat_prompt(ChatRequest& r, const char* param = "messages", bool check_fit = true) const;
  std::shared_ptr<Job> admit(std::vector<int32_t> prompt, const RequestParams& params);
  // Non-streaming: waits for the job and returns its text (throws ApiError when it did not finish).
  std::string collect(Job& job) const;

  ServeOptions opt_;
  httplib::Server http_;
  HttpGuard guard_;
  Metrics metrics_;
  ExpertStats experts_;
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
    ThreadRequest tr;
    tr.threads = opt_.threads;
    tr.force = opt_.threads_force;
    tr.slots = opt_.slots;
    for (const GgufTensorInfo& t : model_->file().tensors()) tr.weight_bytes += t.nbytes;
    const ThreadPlan threads = plan_threads(tr, usable_cores());
    if (!threads.warning.empty()) std::fprintf(stderr, "strata serve: warning: %s\n", threads.warning.c_str());
    SchedulerConfig sc;
    sc.slots = opt_.slots;
    sc.queue_limit = opt_.queue;
    sc.ctx = ctx_;
    sc.threads_per_slot = threads.per_slot;
    const int64_t cache_mib = opt_.cache_ram_mib >= 0 ? opt_.cache_ram_mib : opt_.backend == "gpu" ? 0 : kDefaultCacheRamMiB;
    sc.cache_bytes = static_cast<size_t>(cache_mib) << 20;
    sc.make_sequence = opt_.make_sequence;
    if (opt_.make_route_recorder) sc.record_routes = opt_.make_route_recorder(*model_);
    if (opt_.make_routing_trace) sc.trace = opt_.make_routing_trace(*model_);
    sc.sequence_metrics = opt_.sequence_metrics;
    if (opt_.make_drafter) {
      sc.make_drafter = [this](int ctx) { return opt_.make_drafter(*model_, ctx, static_cast<int32_t>(n_vocab_)); };
      sc.spec = opt_.spec;
    }
    const ModelConfig& mc = model_->config();
    experts_.reset(mc.n_layer, mc.n_expert, mc.n_expert_used);
    sc.live_routes = [this](const RoutingCounts& c) { experts_.add(c); };
    sc.counting_unavailable = [this](const std::string& why) {
      std::fprintf(stderr, "strata serve: warning: no live routing counts for the web page: %s\n", why.c_str());
      experts_.set_unavailable(why);
    };
    scheduler_ = std::make_unique<Scheduler>(*model_, *tokenizer_, sc, metrics_);
    if (opt_.expert_placement) {
      try {
        if (std::optional<ExpertPlacement> placement = opt_.expert_placement()) experts_.set_placement(std::move(*placement));
      } catch (const Error& e) {  // the view loses its marks; serving goes on
        std::fprintf(stderr, "strata serve: warning: no expert placement for the web page: %s\n", e.what());
      }
    }
    std::fprintf(stderr, "strata serve: model '%s' ready on %s (%d slots x %d tokens, queue %d, %d threads per slot)\n",
                 opt_.model_name.c_str(), opt_.backend.c_str(), sc.slots, sc.ctx, sc.queue_limit, sc.threads_per_slot);
    if (cache_mib > 0)
      std::fprintf(stderr, "strata serve: prompt cache up to %lld MiB (snapshots every %d tokens, shared by the slots)\n",
                   static_cast<long long>(cache_mib), sc.cache_block);
    else
      std::fprintf(stderr, "strata serve: prompt cache off (%s)\n",
                   opt_.cache_ram_mib == 0 ? "--cache-ram 0" : "the GPU backend cannot save sequence state");
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

std::vector<int32_t> ApiServer::encode_chat(const RenderedChat& chat, const std::string& suffix) const {
  std::vector<int32_t> ids;
  if (tokenizer_->vocab().add_bos && tokenizer_->bos_id() >= 0) ids.push_back(tokenizer_->bos_id());
  const std::vector<int32_t> body = encode_rendered_chat(*tokenizer_, chat, opt_.parse_special);
  ids.insert(ids.end(), body.begin(), body.end());
  const std::vector<int32_t> tail = tokenizer_->encode(suffix, false);
  ids.insert(ids.end(), tail.begin(), tail.end());
  return ids;
}

std::vector<int32_t> ApiServer::encode_prompt(const std::string& text, bool add_special) const {
  std::vector<int32_t> ids;
  if (add_special && tokenizer_->vocab().add_bos && tokenizer_->bos_id() >= 0) ids.push_back(tokenizer_->bos_id());
  const std::vector<int32_t> body = tokenizer_->encode(text, add_special);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

void ApiServer::check_context(size_t prompt_tokens, const char* param) const {
  if (prompt_tokens == 0) bad_request(param, "the prompt is empty");
  // At least one position must stay free for the first generated token.
  if (prompt_tokens >= static_cast<size_t>(ctx_)) {
    throw ApiError(400, "invalid_request_error", param, "context_length_exceeded",
                   cat("this model's context is ", ctx_, " tokens per sequence, but the prompt has ", prompt_tokens,
                       " tokens; shorten the prompt"));
  }
}

std::shared_ptr<Job> ApiServer::admit(std::vector<int32_t> prompt, const RequestParams& params) {
  if (params.speculative.value_or(false) && !opt_.make_drafter)
    bad_request("speculative", "'speculative': true needs a server started with --spec or -md/--model-draft");
  auto job = std::make_shared<Job>(std::move(prompt), params);
  switch (scheduler_->submit(job)) {
    case Scheduler::Admission::Accepted: {
      // Wait here for a slot, so a request that waits too long gets a real 503 (a stream's 200 has
      // not been sent yet), and a client that leaves while waiting frees its place.
      Connection* conn = current_connection();
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(opt_.queue_timeout_s);
      const bool started = scheduler_->wait_for_slot(job, deadline, [conn] { return conn && conn->client_gone(); });
      if (!started) {
        metrics_.count_rejected();
        throw ApiError(503, "server_overloaded", "", "queue_timeout",
                       cat("no slot became free within ", opt_.queue_timeout_s, " s (--queue-timeout); retry later"));
      }
      return job;
    }
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
  // With include_usage every chunk but the last carries "usage": null.
  const auto chunk = [&](OrderedJson j) {
    if (st.include_usage) j["usage"] = nullptr;
    out += sse_data(j);
  };
  std::string text;
  const bool finished = st.job->take(text, 500ms);
  if (!st.started) {
    st.started = true;
    if (st.chat) {
      chunk(chat_chunk_json(st.meta, {{"role", "assistant"}, {"content", ""}}, nullptr));
      if (!st.forced_prefix.empty()) st.splitter.push(st.forced_prefix);
    }
  }
  if (!text.empty()) {
    if (st.chat) {
      const AssistantDelta d = st.splitter.push(text);
      if (!d.reasoning.empty() || !d.content.empty()) chunk(chat_chunk_json(st.meta, delta_json(d), nullptr));
    } else {
      chunk(completion_chunk_json(st.meta, text, nullptr));
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
    if (!f.delta.reasoning.empty() || !f.delta.content.empty())
      chunk(chat_chunk_json(st.meta, delta_json(f.delta), nullptr));
    if (!f.tool_calls.empty()) {
      tool_calls = true;
      chunk(chat_chunk_json(st.meta, {{"tool_calls", tool_calls_json(f.tool_calls, true)}}, nullptr));
    }
    chunk(chat_chunk_json(st.meta, OrderedJson::object(), finish_reason(o.stop_reason, tool_calls)));
  } else {
    chunk(completion_chunk_json(st.meta, "", finish_reason(o.stop_reason, false)));
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

// An event stream for `job`: next(out) appends the next events and returns true once it is complete.
template <class Next>
void start_event_stream(httplib::Response& res, std::shared_ptr<Job> job, Next next) {
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, next](size_t, httplib::DataSink& sink) mutable {
        std::string out;
        const bool done = next(out);
        // Nothing new: an SSE comment, which clients ignore; a failed write is how a vanished client shows.
        if (out.empty()) out = ": keep-alive\n\n";
        if (!sink.write(out.data(), out.size())) {
          job->cancel();
          return false;
        }
        if (done) sink.done();
        return true;
      },
      [job](bool success) {
        if (!success) job->cancel();  // the client went away (or the write failed): free the slot
      });
}

void start_stream(httplib::Response& res, std::shared_ptr<StreamState> st) {
  start_event_stream(res, st->job, [st](std::string& out) { return next_events(*st, out); });
}

void start_stream(httplib::Response& res, std::shared_ptr<ChatEventStream> st) {
  start_event_stream(res, st->job(), [st](std::string& out) { return st->next(out); });
}

// ---- handlers --------------------------------------------------------------------------------

ApiServer::ChatPrompt ApiServer::chat_prompt(ChatRequest& r, const char* param, bool check_fit) const {
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
  if (tools_on && (r.tool_choice == ToolChoice::Required || r.tool_choice == ToolChoice::Named)) {
    if (r.gen.grammar) bad_request("response_format", "'response_format' cannot be combined with a required or named tool call");
    r.gen.grammar = tool_call_grammar(r.tools, r.tool_choice == ToolChoice::Named ? r.tool_choice_name : "");
  }
  // Constrained output starts with the answer itself: no think block to write first.
  if (!forced.empty() || r.gen.grammar) co.enable_thinking = false;
  RenderedChat rendered;
  try {
    rendered = render_chat_marked(r.messages, tools_on ? r.tools : OrderedJson(), co);
  } catch (const Error& e) {
    bad_request("messages", e.what());
  }
  ChatPrompt p{encode_chat(rendered, forced), forced, tools_on};
  if (check_fit) check_context(p.tokens.size(), param);
  return p;
}

void ApiServer::handle_chat(const std::string& body, httplib::Response& res) {
  ChatRequest r = parse_chat_request(body, n_vocab_);
  check_model(r.model);
  const ChatPrompt p = chat_prompt(r);
  const bool tools_on = p.tools_on;
  const std::string& forced = p.forced;
  auto job = admit(p.tokens, r.gen);
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
  const AssistantOutput answer = split_answer(forced + collect(*job), tools_on);
  const JobOutcome& o = job->outcome();
  res.set_content(dump_json(chat_completion_json(meta, answer, finish_reason(o.stop_reason, !answer.tool_calls.empty()), o)), kJson);
}

void ApiServer::handle_messages(const std::string& body, httplib::Response& res) {
  ChatRequest r = parse_anthropic_request(body, n_vocab_, false);
  check_model(r.model);
  const ChatPrompt p = chat_prompt(r);
  const int prompt_tokens = static_cast<int>(p.tokens.size());
  auto job = admit(p.tokens, r.gen);
  const ResponseMeta meta{make_response_id("msg_"), static_cast<int64_t>(std::time(nullptr)), opt_.model_name};
  if (r.gen.stream) {
    start_stream(res, std::make_shared<ChatEventStream>(job, p.tools_on, p.forced, anthropic_stream_writer(meta, prompt_tokens)));
    return;
  }
  const AssistantOutput answer = split_answer(p.forced + collect(*job), p.tools_on);
  res.set_content(dump_json(anthropic_message_json(meta, answer, job->outcome())), kJson);
}

void ApiServer::handle_count_tokens(const std::string& body, httplib::Response& res) {
  ChatRequest r = parse_anthropic_request(body, n_vocab_, true);
  check_model(r.model);
  // The prompt /v1/messages would run for the same request (a forced tool call's start included),
  // counted even when it is too long to run: clients count to find out whether it fits.
  OrderedJson j;
  j["input_tokens"] = chat_prompt(r, "messages", false).tokens.size();
  res.set_content(dump_json(j), kJson);
}

void ApiServer::handle_responses(const std::string& body, httplib::Response& res) {
  ResponsesRequest r = parse_responses_request(body, n_vocab_);
  check_model(r.chat.model);
  const ChatPrompt p = chat_prompt(r.chat, "input");
  auto job = admit(p.tokens, r.chat.gen);
  const ResponseMeta meta{make_response_id("resp_"), static_cast<int64_t>(std::time(nullptr)), opt_.model_name};
  const TokenCounter count = [this](const std::string& text) {
    return static_cast<int>(tokenizer_->encode(text, false).size());
  };
  if (r.chat.gen.stream) {
    start_stream(res,
                 std::make_shared<ChatEventStream>(job, p.tools_on, p.forced, responses_stream_writer(r, meta, count)));
    return;
  }
  const AssistantOutput answer = split_answer(p.forced + collect(*job), p.tools_on);
  res.set_content(dump_json(response_json(r, meta, answer, job->outcome(), count)), kJson);
}

void ApiServer::handle_completion(const std::string& body, httplib::Response& res) {
  CompletionRequest r = parse_completion_request(body, n_vocab_);
  check_model(r.model);
  std::vector<int32_t> prompt = r.prompt_text ? encode_prompt(*r.prompt_text, true) : r.prompt_tokens;
  check_context(prompt.size(), "prompt");
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

void ApiServer::handle_tokenize(const std::string& body, httplib::Response& res) {
  TokenizeRequest r = parse_tokenize_request(body);
  OrderedJson j;
  if (r.content) {
    j["tokens"] = encode_prompt(*r.content, r.add_special);
  } else {
    if (!chat_ok_) bad_request("messages", "this model has no supported chat template (", chat_problem_, ")");
    RenderedChat rendered;
    try {
      rendered = render_chat_marked(r.messages, r.tools, ChatOptions{});
    } catch (const Error& e) {
      bad_request("messages", e.what());
    }
    // What /v1/chat/completions would run for these messages.
    j["tokens"] = encode_chat(rendered, "");
  }
  res.set_content(dump_json(j), kJson);
}

void ApiServer::handle_detokenize(const std::string& body, httplib::Response& res) {
  DetokenizeRequest r = parse_detokenize_request(body, n_vocab_);
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
  // Anthropic's model object beside OpenAI's (each SDK ignores the other's fields); no release date.
  m["type"] = "model";
  m["display_name"] = opt_.model_name;
  m["created_at"] = "1970-01-01T00:00:00Z";
  if (req.matches.size() > 1) {
    check_model(req.matches[1].str());
    res.set_content(dump_json(m), kJson);
    return;
  }
  OrderedJson j;
  j["object"] = "list";
  j["data"] = OrderedJson::array({m});
  j["has_more"] = false;  // Anthropic's paging fields
  j["first_id"] = opt_.model_name;
  j["last_id"] = opt_.model_name;
  res.set_content(dump_json(j), kJson);
}

void ApiServer::handle_webui(const std::string& name, httplib::Response& res) {
  const WebAsset* asset = find_webui_asset(name);
  if (!asset) throw ApiError(404, "invalid_request_error", "", "", cat("unknown route: GET /webui/", name));
  // The page may talk to this server only: nothing it loads or sends can leave for another host.
  res.set_header("Content-Security-Policy",
                 "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
                 "base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Cache-Control", "no-cache");
  res.set_content(std::string(asset->body), webui_content_type(asset->name));
}

GuardOptions ApiServer::guard_options() {
  GuardOptions g;
  g.request_deadline_s = opt_.timeout_s;
  g.keep_alive_s = kKeepAliveSeconds;
  g.max_connections = opt_.max_connections;
  g.health = [this] {
    return ready_.load() ? std::pair<int, std::string>(200, "{\"status\":\"ok\"}")
                         : std::pair<int, std::string>(503, "{\"status\":\"loading\"}");
  };
  return g;
}

void ApiServer::install_routes() {
  http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    Connection* conn = current_connection();
    // Requests without a body are whole once their headers are in; the body routes say so themselves
    // once they have read it (read_body).
    const bool has_body = req.method == "POST" || req.method == "PUT" || req.method == "PATCH" || req.method == "DELETE";
    if (conn && !has_body) conn->request_read();
    if (!opt_.cors_origin.empty()) {
      res.set_header("Access-Control-Allow-Origin", opt_.cors_origin);
      res.set_header("Vary", "Origin");
      if (req.method == "OPTIONS") {  // a browser's preflight: it carries no key
        res.status = 204;
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type, x-api-key, anthropic-version");
        res.set_header("Access-Control-Max-Age", "600");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    // The page's own files carry no data and load without a key (it asks for the key, then sends it
    // with every API call); they are there while the model loads, too.
    if (opt_.webui && req.method == "GET" && (req.path == "/" || req.path.rfind("/webui/", 0) == 0))
      return httplib::Server::HandlerResponse::Unhandled;
    const auto refuse = [&](int status, const std::string& message, const std::string& code) {
      if (conn && has_body) conn->close_after_answer();  // its body is not read
      if (status == 503) res.set_header("Retry-After", "1");
      send_route_error(req, res, status, message, code);
      return httplib::Server::HandlerResponse::Handled;
    };
    if (!opt_.api_key.empty()) {
      // "Authorization: Bearer <key>" (OpenAI's clients) or "x-api-key: <key>" (Anthropic's).
      const std::string auth = req.get_header_value("Authorization");
      const std::string prefix = "Bearer ";
      const bool bearer_ok = auth.rfind(prefix, 0) == 0 && same_secret(auth.substr(prefix.size()), opt_.api_key);
      const bool header_ok = req.has_header("x-api-key") && same_secret(req.get_header_value("x-api-key"), opt_.api_key);
      if (!bearer_ok && !header_ok) {
        res.set_header("WWW-Authenticate", "Bearer");
        return refuse(401, "invalid or missing API key (send 'Authorization: Bearer <key>' or 'x-api-key: <key>')",
                      "invalid_api_key");
      }
    }
    if (!ready_.load() && req.path != "/metrics") return refuse(503, "the model is loading", "");
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
    res.set_content(metrics_.render(g, ready_.load()) + experts_.metrics() + extra,
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  http_.Get("/v1/strata/experts", guarded([this](const auto&, auto& res) {
    res.set_content(dump_json(experts_.json(opt_.backend)), kJson);
  }));
  if (opt_.webui) {
    http_.Get("/", guarded([this](const auto&, auto& res) { handle_webui("index.html", res); }));
    http_.Get(R"(/webui/([A-Za-z0-9._-]+))", guarded([this](const auto& req, auto& res) { handle_webui(req.matches[1].str(), res); }));
  }
  // Anthropic's SDK sends anthropic-version with every request and reads errors in its own shape.
  const auto models = [this](const httplib::Request& req, httplib::Response& res) {
    const ErrorFormat format = req.has_header("anthropic-version") ? anthropic_error_body : ErrorFormat(error_body);
    answer_errors(res, [&] { handle_models(req, res); }, format);
  };
  http_.Get("/v1/models", models);
  http_.Get(R"(/v1/models/(.+))", models);
  const size_t limit = opt_.max_body_bytes;
  http_.Post("/v1/chat/completions", guarded_body(limit, [this](const auto& body, auto& res) { handle_chat(body, res); }));
  http_.Post("/v1/completions", guarded_body(limit, [this](const auto& body, auto& res) { handle_completion(body, res); }));
  http_.Post("/v1/messages", guarded_body(limit, [this](const auto& body, auto& res) { handle_messages(body, res); }, anthropic_error_body));
  http_.Post("/v1/messages/count_tokens",
             guarded_body(limit, [this](const auto& body, auto& res) { handle_count_tokens(body, res); }, anthropic_error_body));
  http_.Post("/v1/responses", guarded_body(limit, [this](const auto& body, auto& res) { handle_responses(body, res); }));
  http_.Post("/tokenize", guarded_body(limit, [this](const auto& body, auto& res) { handle_tokenize(body, res); }));
  http_.Post("/detokenize", guarded_body(limit, [this](const auto& body, auto& res) { handle_detokenize(body, res); }));
  // Any other route with a body: 404 without reading the body (the library would read it whole,
  // unbounded when chunked, before finding no route).
  const auto no_route = [](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader&) {
    if (Connection* conn = current_connection()) conn->close_after_answer();
    send_route_error(req, res, 404, cat("unknown route: ", req.method, " ", req.path));
  };
  http_.Post(".*", no_route);
  http_.Put(".*", no_route);
  http_.Patch(".*", no_route);
  http_.Delete(".*", no_route);

  // Statuses the library sets itself (404 no route, 413 body too large, 400 bad request line, ...)
  // get an error body too, in the route's API shape.
  http_.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string message;
    switch (res.status) {
      case 404: message = cat("unknown route: ", req.method, " ", req.path); break;
      case 413: message = "the request body is too large"; break;
      case 414: message = "the request URI is too long"; break;
      default: message = cat("HTTP ", res.status); break;
    }
    send_route_error(req, res, res.status, message);
    return httplib::Server::HandlerResponse::Handled;
  }));
  http_.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_route_error(req, res, 500, cat("internal error: ", what));
  });
  http_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    if (Connection* conn = current_connection()) conn->answer_written();
    metrics_.count_request(route_label(req.path), res.status);
  });
}

// Runs beside the listener: on SIGINT/SIGTERM it stops taking new work, lets running requests finish
// (for up to the grace period), cancels what is left, then stops the listener.
// It waits on its own flag for the listener's end (a signal may come before the accept loop runs;
// guard_.stop() then ends the loop as soon as it starts).
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
  guard_.stop();
}

int ApiServer::run() {
  check_serve_options(opt_);
  install_routes();
  http_.set_payload_max_length(opt_.max_body_bytes);
  http_.set_read_timeout(opt_.timeout_s, 0);
  http_.set_write_timeout(opt_.timeout_s, 0);
  http_.set_keep_alive_timeout(kKeepAliveSeconds);
  // SO_REUSEADDR only (a restart may bind while old connections linger): the library's default adds
  // SO_REUSEPORT, which lets a second server bind the same port and take part of the traffic.
  http_.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });

  g_stop_requested.store(false);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that vanished must not kill the server on write

  const int port = opt_.port == 0 ? http_.bind_to_any_port(opt_.host) : (http_.bind_to_port(opt_.host, opt_.port) ? opt_.port : -1);
  if (port <= 0) fail("cannot listen on ", opt_.host, ":", opt_.port, " (the port is taken or the address is not available)");
  std::fprintf(stderr, "strata serve: listening on http://%s:%d\n", opt_.host.c_str(), port);
  if (!is_loopback(opt_.host) && opt_.api_key.empty())
    std::fprintf(stderr, "strata serve: warning: listening on %s beyond this machine without an API key: anyone who can "
                         "reach it can use the model (set --api-key-file)\n", opt_.host.c_str());
  std::thread loader([this] { load(); });
  std::thread watcher([this] { watch_for_stop(); });
  const bool listened = guard_.listen();
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

void check_serve_options(const ServeOptions& o) {
  if (o.port < 0 || o.port > 65535) fail("--port must be 0..65535 (0: any free port), got ", o.port);
  if (o.host.empty()) fail("--host must not be empty");
  if (o.slots < 1) fail("--slots must be >= 1, got ", o.slots);
  if (o.queue < -1) fail("--queue must be >= 0, got ", o.queue);
  if (o.queue_timeout_s < 1) fail("--queue-timeout must be >= 1 second, got ", o.queue_timeout_s);
  if (o.ctx < 2) fail("--ctx must be >= 2, got ", o.ctx);
  if (o.timeout_s < 1) fail("--timeout must be >= 1 second, got ", o.timeout_s);
  if (o.max_body_bytes < 1) fail("--max-body must be >= 1 byte");
  if (o.threads < 0) fail("--threads must be >= 0 (0: automatic), got ", o.threads);
  if (o.shutdown_grace_s < 0) fail("--shutdown-grace must be >= 0, got ", o.shutdown_grace_s);
  if (o.cache_ram_mib < -1 || o.cache_ram_mib > (int64_t(1) << 30))
    fail("--cache-ram must be 0 (off) or a size in MiB up to ", int64_t(1) << 30, ", got ", o.cache_ram_mib);
  if (o.cache_ram_mib > 0 && o.backend == "gpu")
    fail("--cache-ram: the prompt cache is not available with --gpu (GPU sequences cannot save their state); "
         "leave --cache-ram out or pass 0");
  if (!o.cors_origin.empty() && o.cors_origin != "*") {
    // An origin is scheme://host[:port]: nothing that could end or add a header line, no path.
    const std::string& c = o.cors_origin;
    const size_t sep = c.find("://");
    const std::string allowed = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-.:[]";
    bool ok = sep != std::string::npos && sep > 0 && sep + 3 < c.size();
    for (size_t i = 0; ok && i < c.size(); ++i)
      ok = (i >= sep && i < sep + 3) || allowed.find(c[i]) != std::string::npos;
    if (!ok) fail("--cors must be '*' or an origin such as http://localhost:3000, got '", c, "'");
  }
  const ServeOptions d = with_defaults(o);
  if (d.max_connections < d.slots + d.queue + 1)
    fail("--max-connections ", d.max_connections, " leaves no room beside the ", d.slots, " slots and the queue of ",
         d.queue, " (needs at least ", d.slots + d.queue + 1, ")");
}

int run_server(const ServeOptions& options) {
  use_passive_omp_waits();  // may re-execute the process; see omp_wait_policy.h
  ApiServer server(options);
  return server.run();
}

}  // namespace strata::serve

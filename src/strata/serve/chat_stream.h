// A chat job's answer in the pieces every chat API reports: reasoning, content and tool calls, as a
// whole (split_answer) or as it streams (ChatEventStream). The API shapes (chat completions, Anthropic
// messages, OpenAI responses) differ only in how they write those pieces, which a ChatEventWriter does.
#pragma once

#include <memory>
#include <string>

#include "strata/serve/assistant_stream.h"
#include "strata/serve/job.h"
#include "strata/text/chat_template.h"

namespace strata::serve {

// A finished answer (the forced prefix, if any, then the generated text) split into reasoning,
// content and, when tools are on, tool calls. Without tools, <tool_call> text is just text.
AssistantOutput split_answer(const std::string& text, bool tools_on);

// Writes one API's events for a streamed chat answer; each call appends to `out`.
class ChatEventWriter {
 public:
  virtual ~ChatEventWriter() = default;
  virtual void begin(std::string& out) = 0;
  virtual void delta(const AssistantDelta& d, std::string& out) = 0;
  // Generation finished: the held-back text and the tool calls, then the outcome.
  virtual void end(const AssistantStreamSplitter::Final& last, const JobOutcome& outcome, std::string& out) = 0;
  // Generation failed or was cancelled (status 500 or 503).
  virtual void fail(int status, const std::string& message, std::string& out) = 0;
};

class ChatEventStream {
 public:
  // `forced`: text the prompt put in the model's mouth (a forced tool call's start), split as if generated.
  ChatEventStream(std::shared_ptr<Job> job, bool tools_on, std::string forced, std::unique_ptr<ChatEventWriter> writer)
      : job_(std::move(job)), splitter_(tools_on), forced_(std::move(forced)), writer_(std::move(writer)) {}

  // Appends the events for the text produced since the last call (waiting briefly for some);
  // returns true once the stream is complete.
  bool next(std::string& out);
  const std::shared_ptr<Job>& job() const { return job_; }

 private:
  std::shared_ptr<Job> job_;
  AssistantStreamSplitter splitter_;
  std::string forced_;
  std::unique_ptr<ChatEventWriter> writer_;
  bool started_ = false;
};

// "event: <name>\ndata: <json>\n\n", the named-event form Anthropic and the Responses API use.
std::string sse_event(const std::string& name, const OrderedJson& data);

}  // namespace strata::serve

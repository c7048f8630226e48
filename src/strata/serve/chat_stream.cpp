#include "strata/serve/chat_stream.h"

#include <chrono>

#include "strata/serve/responses.h"

namespace strata::serve {

AssistantOutput split_answer(const std::string& text, bool tools_on) {
  if (tools_on) return parse_assistant_output(text);
  AssistantStreamSplitter split(false);
  const AssistantDelta d = split.push(text);
  const AssistantStreamSplitter::Final f = split.finish();
  AssistantOutput answer;
  answer.reasoning_content = d.reasoning + f.delta.reasoning;
  answer.content = d.content + f.delta.content;
  return answer;
}

bool ChatEventStream::next(std::string& out) {
  using namespace std::chrono_literals;
  std::string text;
  const bool finished = job_->take(text, 500ms);
  if (!started_) {
    started_ = true;
    writer_->begin(out);
    if (!forced_.empty()) text.insert(0, forced_);
  }
  if (!text.empty()) {
    const AssistantDelta d = splitter_.push(text);
    if (!d.reasoning.empty() || !d.content.empty()) writer_->delta(d, out);
  }
  if (!finished) return false;
  const JobOutcome& o = job_->outcome();
  if (o.kind != JobOutcome::Kind::Finished) {
    const bool failed = o.kind == JobOutcome::Kind::Failed;
    writer_->fail(failed ? 500 : 503,
                  failed ? "generation failed: " + o.error : std::string("the request was cancelled: the server is shutting down"),
                  out);
    return true;
  }
  writer_->end(splitter_.finish(), o, out);
  return true;
}

std::string sse_event(const std::string& name, const OrderedJson& data) {
  return "event: " + name + "\n" + sse_data(data);
}

}  // namespace strata::serve

// The shared generation loop (strata::generate): it stops on end-of-generation tokens, honours the
// token limit, trims stop strings, stops promptly when cancelled, and counts what it did. The model
// is the qwen3_5_moe HF fixture with a byte-level tokenizer (tests/text_model_fixture.h); logit
// biases steer its random weights where a test needs a particular token.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "strata/base/error.h"
#include "strata/engine/generate.h"
#include "strata/engine/model.h"
#include "strata/engine/session.h"
#include "strata/text/tokenizer.h"
#include "text_model_fixture.h"

using namespace strata;

namespace {

constexpr float kBan = -std::numeric_limits<float>::infinity();

class Generate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = testing_fixture::make_text_model("test_generate_model");
    model_ = Model::load(path).release();
    tokenizer_ = new Tokenizer(vocab_from_gguf(model_->file()));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete model_;
  }

  // Greedy; end tokens banned unless allow_end; bytes >= 0x80 and padding banned when ascii_only, so
  // every token is exactly one ASCII character of text (one callback per token).
  static SamplerParams greedy(bool allow_end = false, bool ascii_only = true) {
    SamplerParams p;
    p.temperature = 0.0f;
    const int32_t n = static_cast<int32_t>(model_->config().n_vocab);
    for (int32_t id = 0; id < n; ++id) {
      const bool end = tokenizer_->is_end_of_generation(id);
      const bool non_ascii = id >= 128 && id < 256;
      const bool other = id >= 256 && !end;  // ChatML markers, think tags, padding
      if ((end && !allow_end) || (ascii_only && (non_ascii || other))) p.logit_bias[id] = kBan;
    }
    return p;
  }

  std::vector<int32_t> prompt() const { return tokenizer_->encode("def fibonacci(n):"); }

  static Model* model_;
  static Tokenizer* tokenizer_;
};

Model* Generate::model_ = nullptr;
Tokenizer* Generate::tokenizer_ = nullptr;

TEST_F(Generate, HonoursMaxTokensAndCountsWhatItDid) {
  Session session(*model_, 64);
  Sampler sampler(greedy());
  GenerationParams params;
  params.max_new_tokens = 12;
  std::string streamed;
  int calls = 0;
  const auto p = prompt();
  ASSERT_EQ(p.size(), std::string("def fibonacci(n):").size());  // byte tokens, no merges
  const GenerationResult r = generate(session, *tokenizer_, sampler, p, params, [&](std::string_view piece) {
    streamed += piece;
    ++calls;
    return true;
  });
  EXPECT_EQ(r.stop_reason, StopReason::MaxTokens);
  EXPECT_EQ(r.tokens.size(), 12u);
  EXPECT_EQ(r.stats.generated_tokens, 12);
  EXPECT_EQ(r.stats.prompt_tokens, static_cast<int>(p.size()));
  EXPECT_EQ(r.stats.decode_steps, 11);
  EXPECT_EQ(r.tokens_in_session, 11);
  EXPECT_EQ(session.n_past(), static_cast<int>(p.size()) + 11);  // the last sampled token is not fed
  EXPECT_GT(r.stats.prefill_seconds, 0.0);
  EXPECT_GT(r.stats.decode_seconds, 0.0);
  EXPECT_GT(r.stats.ttft_seconds, 0.0);
  EXPECT_GE(r.stats.ttft_seconds, r.stats.prefill_seconds);
  EXPECT_GT(r.stats.prompt_tokens_per_second(), 0.0);
  EXPECT_GT(r.stats.decode_tokens_per_second(), 0.0);
  // The streamed text is the decoding of the sampled ids, one piece per ASCII token.
  EXPECT_EQ(streamed, r.text);
  EXPECT_EQ(r.text, tokenizer_->decode(r.tokens, true));
  EXPECT_EQ(calls, 12);
}

TEST_F(Generate, GreedyMatchesTheEngineGreedyLoop) {
  // Without biases, temperature 0 must pick what generate_greedy (the engine's own loop) picks,
  // as long as no end token comes up (generate stops there, generate_greedy does not).
  const auto p = prompt();
  Session a(*model_, 64), b(*model_, 64);
  SamplerParams plain;
  plain.temperature = 0.0f;
  Sampler sampler(plain);
  GenerationParams params;
  params.max_new_tokens = 10;
  const GenerationResult r = generate(a, *tokenizer_, sampler, p, params, nullptr);
  const std::vector<int32_t> ref = generate_greedy(b, p, 10);
  size_t n = 0;
  while (n < ref.size() && !tokenizer_->is_end_of_generation(ref[n])) ++n;
  const std::vector<int32_t> expected(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(std::min(n + 1, ref.size())));
  EXPECT_EQ(r.tokens, expected);
}

TEST_F(Generate, StopsOnEndOfGenerationTokens) {
  for (const char* marker : {"<|endoftext|>", "<|im_end|>"}) {
    const int32_t end = tokenizer_->find_token(marker).value();
    ASSERT_TRUE(tokenizer_->is_end_of_generation(end));
    Session session(*model_, 64);
    SamplerParams sp = greedy();
    sp.logit_bias[end] = 1e6f;  // forced
    Sampler sampler(sp);
    GenerationParams params;
    params.max_new_tokens = 20;
    int calls = 0;
    const GenerationResult r = generate(session, *tokenizer_, sampler, prompt(), params, [&](std::string_view) {
      ++calls;
      return true;
    });
    EXPECT_EQ(r.stop_reason, StopReason::EndOfGeneration) << marker;
    EXPECT_EQ(r.tokens, std::vector<int32_t>{end});
    EXPECT_EQ(r.text, "");  // the end marker is not text
    EXPECT_EQ(calls, 0);
    EXPECT_EQ(r.tokens_in_session, 0);
    EXPECT_EQ(session.n_past(), static_cast<int>(prompt().size()));
  }
}

TEST_F(Generate, StopStringIsTrimmedAndNeverStreamed) {
  const auto p = prompt();
  GenerationParams params;
  params.max_new_tokens = 24;
  std::string full;
  {
    Session s(*model_, 64);
    Sampler sampler(greedy());
    full = generate(s, *tokenizer_, sampler, p, params, nullptr).text;
  }
  ASSERT_EQ(full.size(), 24u);
  // A stop string taken from the middle of the free-running text: the run must end right before
  // its first occurrence.
  const std::string stop = full.substr(10, 3);
  const size_t first = full.find(stop);
  params.stop_strings = {stop, "", "this never appears \x01"};
  Session s(*model_, 64);
  Sampler sampler(greedy());
  std::vector<std::string> pieces;
  const GenerationResult r = generate(s, *tokenizer_, sampler, p, params, [&](std::string_view piece) {
    pieces.emplace_back(piece);
    return true;
  });
  EXPECT_EQ(r.stop_reason, StopReason::StopString);
  EXPECT_EQ(r.text, full.substr(0, first));
  std::string joined;
  for (const auto& piece : pieces) joined += piece;
  EXPECT_EQ(joined, r.text);
  EXPECT_EQ(joined.find(stop), std::string::npos);
  EXPECT_EQ(r.tokens.size(), first + stop.size());  // one ASCII character per token
}

TEST_F(Generate, CancellationStopsAtTheNextToken) {
  std::atomic<bool> cancel{false};
  GenerationParams params;
  params.max_new_tokens = 30;
  params.cancel = &cancel;
  Session s(*model_, 64);
  Sampler sampler(greedy());
  int calls = 0;
  const GenerationResult r = generate(s, *tokenizer_, sampler, prompt(), params, [&](std::string_view) {
    if (++calls == 3) cancel.store(true);  // as a SIGINT handler would, mid-generation
    return true;
  });
  EXPECT_EQ(r.stop_reason, StopReason::Cancelled);
  EXPECT_EQ(r.tokens.size(), 3u);
  EXPECT_EQ(r.stats.generated_tokens, 3);

  // Already cancelled: nothing runs, the session is untouched.
  Session fresh(*model_, 64);
  const GenerationResult none = generate(fresh, *tokenizer_, sampler, prompt(), params, nullptr);
  EXPECT_EQ(none.stop_reason, StopReason::Cancelled);
  EXPECT_TRUE(none.tokens.empty());
  EXPECT_EQ(fresh.n_past(), 0);
}

TEST_F(Generate, CallbackReturningFalseStops) {
  GenerationParams params;
  params.max_new_tokens = 30;
  Session s(*model_, 64);
  Sampler sampler(greedy());
  int calls = 0;
  const GenerationResult r = generate(s, *tokenizer_, sampler, prompt(), params, [&](std::string_view) {
    return ++calls < 2;
  });
  EXPECT_EQ(r.stop_reason, StopReason::Cancelled);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(r.tokens.size(), 2u);
}

TEST_F(Generate, ContextLimits) {
  const auto p = prompt();
  const int n = static_cast<int>(p.size());
  GenerationParams params;
  params.max_new_tokens = 10;
  {
    // Room for 3 more tokens after the prompt: 4 can be sampled (the last one is never fed).
    Session s(*model_, n + 3);
    Sampler sampler(greedy());
    const GenerationResult r = generate(s, *tokenizer_, sampler, p, params, nullptr);
    EXPECT_EQ(r.stop_reason, StopReason::ContextFull);
    EXPECT_EQ(r.tokens.size(), 4u);
    EXPECT_EQ(s.n_past(), n + 3);
  }
  {
    Session s(*model_, n - 1);
    Sampler sampler(greedy());
    try {
      generate(s, *tokenizer_, sampler, p, params, nullptr);
      FAIL() << "a prompt longer than the context was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), cat("prompt of ", n, " tokens exceeds the context of ", n - 1));
    }
    EXPECT_EQ(s.n_past(), 0);
  }
  Session s(*model_, 64);
  Sampler sampler(greedy());
  EXPECT_THROW(generate(s, *tokenizer_, sampler, {}, params, nullptr), Error);
}

TEST_F(Generate, ContinuingASessionEqualsOneLongPrompt) {
  // What chat relies on when it feeds only a new turn: prompt A then B gives the tokens A+B gives.
  const std::vector<int32_t> a = tokenizer_->encode("def fib");
  const std::vector<int32_t> b = tokenizer_->encode("onacci(n):");
  std::vector<int32_t> ab = a;
  ab.insert(ab.end(), b.begin(), b.end());
  GenerationParams params;
  params.max_new_tokens = 8;
  Session one(*model_, 64);
  Sampler s1(greedy());
  const GenerationResult whole = generate(one, *tokenizer_, s1, ab, params, nullptr);

  Session two(*model_, 64);
  Sampler s2(greedy());
  GenerationParams first = params;
  first.max_new_tokens = 1;  // samples one token, feeds none of it
  const GenerationResult r1 = generate(two, *tokenizer_, s2, a, first, nullptr);
  ASSERT_EQ(r1.tokens_in_session, 0);
  ASSERT_EQ(two.n_past(), static_cast<int>(a.size()));
  const GenerationResult r2 = generate(two, *tokenizer_, s2, b, params, nullptr);
  EXPECT_EQ(r2.stats.prompt_tokens, static_cast<int>(b.size()));
  EXPECT_EQ(r2.tokens, whole.tokens);
}

TEST(StopStringFilter, HoldsBackPossibleStartsOnly) {
  StopStringFilter f({"llo"});
  EXPECT_EQ(f.push("Hel"), "He");  // "l" may start "llo"
  EXPECT_FALSE(f.stopped());
  EXPECT_EQ(f.push("lo world"), "");
  EXPECT_TRUE(f.stopped());
  EXPECT_EQ(f.push("more"), "");
  EXPECT_EQ(f.flush(), "");

  StopStringFilter g({"ab", "b"});
  EXPECT_EQ(g.push("xab"), "x");  // the earliest match wins ("ab" at 1 before "b" at 2)
  EXPECT_TRUE(g.stopped());

  StopStringFilter h({"\n\n"});
  EXPECT_EQ(h.push("line\n"), "line");
  EXPECT_EQ(h.push("next"), "\nnext");  // "\n" then "n": no longer a possible start
  EXPECT_EQ(h.push("\n"), "");
  EXPECT_EQ(h.flush(), "\n");  // generation ended: what was held is text
  EXPECT_FALSE(h.stopped());

  StopStringFilter none({});
  EXPECT_EQ(none.push("anything"), "anything");
}

}  // namespace

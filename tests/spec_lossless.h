// Speculative decoding must not change what is generated: greedy generation with a drafter gives the
// tokens, text, stop reason and final sequence state that generation without one gives. Shared by the
// CPU suite (test_spec.cpp) and the GPU suite (test_cuda_spec.cpp): they pass a factory of their
// sequences. Also the drafters and models both suites test with.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "strata/engine/drafter.h"
#include "strata/engine/generate.h"
#include "strata/engine/model.h"
#include "strata/engine/sequence.h"
#include "strata/gguf/gguf.h"
#include "strata/gguf/writer.h"
#include "strata/quant/fp16.h"
#include "strata/sample/sampler.h"
#include "strata/text/tokenizer.h"
#include "strata/text/vocab.h"
#include "logits_compare.h"
#include "text_model_fixture.h"

namespace strata::spec_test {

// A model file with its tokenizer.
struct Loaded {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string path;
};

// A fixture GGUF without a tokenizer gets the byte-level test tokenizer (ids only matter here).
inline Loaded load(const std::string& path) {
  Loaded l;
  l.path = path;
  l.model = Model::load(path);
  if (l.model->file().has("tokenizer.ggml.tokens"))
    l.tokenizer = std::make_unique<Tokenizer>(vocab_from_gguf(l.model->file()));
  else
    l.tokenizer = std::make_unique<Tokenizer>(testing_fixture::byte_vocab(static_cast<int32_t>(l.model->config().n_vocab)));
  return l;
}

constexpr float kBan = -std::numeric_limits<float>::infinity();

// Greedy with every end-of-generation token banned, so runs have their full length.
inline SamplerParams greedy_no_end(const Tokenizer& tok, int32_t n_vocab) {
  SamplerParams p;
  p.temperature = 0;
  for (int32_t id = 0; id < n_vocab; ++id)
    if (tok.is_end_of_generation(id)) p.logit_bias[id] = kBan;
  return p;
}

// Proposes the continuation of a known output (the plain run's), so every draft is accepted, or with
// every `corrupt_every`-th drafted token changed, so verification rejects there.
class ScriptDrafter final : public Drafter {
 public:
  ScriptDrafter(size_t prompt_size, std::vector<int32_t> reference, int corrupt_every = 0, int32_t n_vocab = 2)
      : prompt_size_(prompt_size), reference_(std::move(reference)), corrupt_every_(corrupt_every), n_vocab_(n_vocab) {}
  std::string name() const override { return "script"; }
  void propose(const std::vector<int32_t>& history, int max_tokens, Draft& out) override {
    out.clear();
    for (size_t i = history.size() - prompt_size_; i < reference_.size() && static_cast<int>(out.tokens.size()) < max_tokens; ++i) {
      int32_t t = reference_[i];
      if (corrupt_every_ > 0 && ++count_ % corrupt_every_ == 0) t = (t + 1) % n_vocab_;
      out.tokens.push_back(t);
    }
  }

 private:
  size_t prompt_size_;
  std::vector<int32_t> reference_;
  int corrupt_every_;
  int32_t n_vocab_;
  int count_ = 0;
};

// Drafts a token tree around the reference continuation: at each depth the right token sits among
// `width` - 1 wrong siblings at a rotating place, each wrong sibling with a wrong child, and every
// `corrupt_every`-th depth has no right token at all; so verification must find the kept path among
// siblings, descend, and stop inside the tree.
class TreeScriptDrafter final : public Drafter {
 public:
  TreeScriptDrafter(size_t prompt_size, std::vector<int32_t> reference, int width, int corrupt_every, int32_t n_vocab)
      : prompt_size_(prompt_size), ref_(std::move(reference)), width_(width), every_(corrupt_every), n_vocab_(n_vocab) {}
  std::string name() const override { return "tree-script"; }
  void propose(const std::vector<int32_t>& history, int max_tokens, Draft& out) override {
    out.clear();
    int parent = -1;
    for (size_t i = history.size() - prompt_size_; i < ref_.size(); ++i) {
      const bool corrupt = every_ > 0 && ++count_ % every_ == 0;
      const int right_at = count_ % width_;
      int next = -1;
      for (int w = 0; w < width_; ++w) {
        if (static_cast<int>(out.tokens.size()) >= max_tokens) return;
        const bool right = w == right_at && !corrupt;
        const int32_t t = right ? ref_[i] : static_cast<int32_t>((ref_[i] + 1 + w) % n_vocab_);
        if (!right && t == ref_[i]) continue;
        out.tokens.push_back(t);
        out.parents.push_back(parent);
        const int at = static_cast<int>(out.tokens.size()) - 1;
        if (right) {
          next = at;
        } else if (static_cast<int>(out.tokens.size()) < max_tokens) {  // a wrong child under a wrong sibling
          out.tokens.push_back(static_cast<int32_t>((t + 3) % n_vocab_));
          out.parents.push_back(at);
        }
      }
      if (next < 0) return;
      parent = next;
    }
  }

 private:
  size_t prompt_size_;
  std::vector<int32_t> ref_;
  int width_, every_;
  int32_t n_vocab_;
  int count_ = 0;
};

// A copy of `src` whose F32 / BF16 tensors are scaled by 1 + rel * N(0, 1) element by element: another
// model with the same vocabulary, agreeing with the original often but not always;
// written to `out`, which is returned.
inline std::string perturbed_copy(const std::string& src, const std::string& out, double rel) {
  const GgufFile in = GgufFile::open(src);
  GgufWriter w;
  for (const auto& [key, value] : in.metadata())
    if (key != "general.alignment") w.set(key, value);
  std::mt19937 rng(7);
  std::normal_distribution<double> noise(0.0, rel);
  std::vector<std::vector<uint8_t>> keep;
  for (const GgufTensorInfo& t : in.tensors()) {
    keep.emplace_back(t.data, t.data + t.nbytes);
    std::vector<uint8_t>& b = keep.back();
    if (t.type == GgmlType::F32) {
      for (size_t i = 0; i + 4 <= b.size(); i += 4) {
        float x;
        std::memcpy(&x, &b[i], 4);
        x = static_cast<float>(x * (1.0 + noise(rng)));
        std::memcpy(&b[i], &x, 4);
      }
    } else if (t.type == GgmlType::BF16) {
      for (size_t i = 0; i + 2 <= b.size(); i += 2) {
        uint16_t h;
        std::memcpy(&h, &b[i], 2);
        h = fp32_to_bf16(static_cast<float>(bf16_to_fp32(h) * (1.0 + noise(rng))));
        std::memcpy(&b[i], &h, 2);
      }
    }
    w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), b.data(), b.size());
  }
  w.write(out);
  return out;
}

// A repeating prompt of ids (the fixtures' random weights make text meaningless anyway).
inline std::vector<int32_t> pattern_prompt() {
  std::vector<int32_t> p;
  for (int r = 0; r < 4; ++r)
    for (int32_t id : {300, 41, 302, 77, 304, 41}) p.push_back(id);
  return p;
}

// Speculation ran, and verification both accepted and rejected drafts.
inline void expect_accepts_and_rejects(const GenerationStats& s, const std::string& what) {
  EXPECT_GT(s.spec_steps, 0) << what;
  EXPECT_GT(s.accepted_tokens, 0) << what << ": no draft was accepted, so acceptance was not exercised";
  EXPECT_LT(s.accepted_tokens, s.drafted_tokens) << what << ": no draft was rejected";
}

using MakeSequence = std::function<std::unique_ptr<Sequence>(int max_ctx)>;
using MakeDrafter = std::function<std::unique_ptr<Drafter>()>;

struct Case {
  std::vector<int32_t> prompt;
  int n_new = 32;
  int max_ctx = 0;  // 0: prompt + n_new + 1
  int draft_max = 8;
  SamplerParams sampling;  // temperature 0 unless a test says otherwise
  std::vector<std::string> stop_strings;
};

struct Outcome {
  GenerationResult result;
  int n_past = 0;
  std::vector<float> next_logits;  // the sequence's logits for the last token, fed after generation
};

// Generates the case on a fresh sequence (with `drafter` when given), then feeds the last generated
// token, which reads the state the generation left.
inline Outcome generate_case(const MakeSequence& make, const Tokenizer& tokenizer, const Case& c, Drafter* drafter) {
  const int ctx = c.max_ctx > 0 ? c.max_ctx : static_cast<int>(c.prompt.size()) + c.n_new + 1;
  std::unique_ptr<Sequence> s = make(ctx);
  Sampler sampler(c.sampling);
  GenerationParams params;
  params.max_new_tokens = c.n_new;
  params.stop_strings = c.stop_strings;
  params.spec.drafter = drafter;
  params.spec.draft_max = c.draft_max;
  Outcome o;
  o.result = generate(*s, tokenizer, sampler, c.prompt, params, {});
  o.n_past = s->n_past();
  const auto& toks = o.result.tokens;
  if (static_cast<int>(toks.size()) > o.result.tokens_in_session && s->n_past() < s->max_ctx()) {
    int32_t last = toks[static_cast<size_t>(o.result.tokens_in_session)];
    o.next_logits.resize(static_cast<size_t>(s->model().config().n_vocab));
    s->forward(&last, 1, o.next_logits.data(), false);
  }
  return o;
}

// Runs the case without and with a drafter from make_drafter and expects the same result: the tokens and
// text, and when check_logits the logits the state left behind gives, bit-equal (logits_tol 0) or
// within logits_tol relative error of the row. Returns the speculative run's stats.
inline GenerationStats expect_lossless(const MakeSequence& make, const Tokenizer& tokenizer, const Case& c,
                                       const MakeDrafter& make_drafter, bool check_logits = true,
                                       const std::string& what = "", double logits_tol = 0.0) {
  const Outcome plain = generate_case(make, tokenizer, c, nullptr);
  std::unique_ptr<Drafter> drafter = make_drafter();
  const Outcome spec = generate_case(make, tokenizer, c, drafter.get());
  EXPECT_EQ(spec.result.tokens, plain.result.tokens) << what;
  EXPECT_EQ(spec.result.text, plain.result.text) << what;
  EXPECT_EQ(spec.result.stop_reason, plain.result.stop_reason) << what;
  EXPECT_EQ(spec.result.tokens_in_session, plain.result.tokens_in_session) << what;
  EXPECT_EQ(spec.n_past, plain.n_past) << what;
  EXPECT_EQ(spec.result.stats.generated_tokens, plain.result.stats.generated_tokens) << what;
  EXPECT_EQ(spec.result.stats.decode_tokens, plain.result.stats.decode_tokens) << what;
  if (check_logits && logits_tol == 0.0) {
    EXPECT_EQ(spec.next_logits, plain.next_logits) << what << ": the state generation left differs";
  } else if (check_logits) {
    EXPECT_EQ(spec.next_logits.size(), plain.next_logits.size()) << what;
    if (spec.next_logits.size() == plain.next_logits.size()) {
      EXPECT_LE(test_util::max_row_rel_err(spec.next_logits, plain.next_logits, plain.next_logits.size()), logits_tol)
          << what << ": the state generation left differs";
    }
  }
  EXPECT_EQ(spec.result.stats.drafter, drafter->name()) << what;
  EXPECT_LE(spec.result.stats.accepted_tokens, spec.result.stats.drafted_tokens) << what;
  return spec.result.stats;
}

}  // namespace strata::spec_test

// What speculative decoding drafts with: given the tokens so far, propose tokens the target model is
// likely to produce next. The generation loop (engine/generate.h) runs the proposal through the target
// in one pending forward (Sequence::forward_pending) and keeps what verification accepts, so the output
// is what the target alone would produce (greedy: token for token; sampled: in distribution). The
// drafters themselves live in the spec module (spec/ngram_drafter.h, spec/draft_model.h).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "strata/sample/sampler.h"

namespace strata {

class Sequence;

// One position of a block drafter's block: candidate tokens with their probabilities, most likely first (a
// top-k of the drafter's distribution there). Tokens distinct, probabilities in [0, 1] and non-increasing.
struct PositionCandidates {
  std::vector<int32_t> tokens;
  std::vector<float> probs;
};

// A proposal: a chain (parents empty) or a token tree in the shape Sequence::forward_pending takes
// (parents[t] < t, -1 for a child of the last token; the children of one node carry distinct tokens).
// The generation loop verifies a tree from the root down: at each node it tries the children in the
// order given and moves to the first one verification keeps. Trees are deterministic proposals (q empty).
struct Draft {
  std::vector<int32_t> tokens;
  std::vector<int> parents;
  // q[t]: the distribution tokens[t] was drawn from. Empty: the drafter is deterministic (q one-hot at
  // each token), as a lookup or a greedy draft model is.
  std::vector<TokenDistribution> q;

  void clear() {
    tokens.clear();
    parents.clear();
    q.clear();
  }
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string name() const = 0;  // "ngram", "draft" (the stats and the bench say which)
  // Proposes at most max_tokens (>= 1) tokens to follow `history`: the tokens of this generation so
  // far (prompt, then every token sampled, the last one included). May propose none. A history that
  // does not extend the previous call's is a new text: the drafter starts over.
  virtual void propose(const std::vector<int32_t>& history, int max_tokens, Draft& out) = 0;
  // The sequence the drafts are for, given by the generation loop before its prompt runs. Drafters
  // conditioned on the target's states (MTP) hook in here; the others ignore it.
  virtual void attach(Sequence& target) { (void)target; }
};

// Where a drafter's head (MTP head, DFlash context and block) computes, decided at every attach: `near`,
// the sequence's own (Sequence::make_*_head), when it gave one; else the CPU's, kept when head already is
// one (CpuHead) or made by make_cpu. A GPU target that cannot hold the head still drafts, on the CPU,
// said once per reason (`told` remembers the last): it costs speed, not output.
template <class CpuHead, class Head, class MakeCpu>
void place_head(std::unique_ptr<Head>& head, std::unique_ptr<Head> near, const std::string& why, std::string& told,
                const char* what, MakeCpu make_cpu) {
  if (near) {
    head = std::move(near);
    return;
  }
  if (!why.empty() && why != told) std::fprintf(stderr, "%s runs on the CPU: %s\n", what, why.c_str());
  told = why;
  if (!dynamic_cast<CpuHead*>(head.get())) head = make_cpu();
}

}  // namespace strata

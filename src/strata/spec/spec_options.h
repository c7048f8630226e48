// The speculative-decoding options every command takes (--spec, -md/--model-draft, --draft-max,
// --draft-min, --spec-ngram-min/-max), checked in one place and turned into a drafter.
#pragma once

#include <functional>
#include <limits>
#include <memory>
#include <string>

#include "strata/engine/dflash.h"
#include "strata/engine/drafter.h"
#include "strata/engine/generate.h"
#include "strata/engine/model.h"
#include "strata/engine/sequence.h"
#include "strata/sample/sampler.h"
#include "strata/spec/ngram_drafter.h"

namespace strata {

struct SpecOptions {
  static constexpr int kDraftMaxUnset = std::numeric_limits<int>::min();
  std::string spec;         // "" (none unless a draft model is given), "ngram", "mtp", "draft", "draft:FILE",
                            // "dflash" (the model's own drafter, dflash_path_for) or "dflash:FILE"
  std::string draft_model;  // -md/--model-draft FILE: implies --spec draft
  int draft_max = kDraftMaxUnset;  // unset: default_draft_max of the drafter chosen
  int draft_min = 0;
  // --draft-p-min P: a draft model drafts on only while its most likely token has at least this
  // probability (DraftModelDrafter's p_min); kDraftPMinUnset: not given (kDraftPMinDefault).
  static constexpr float kDraftPMinUnset = std::numeric_limits<float>::lowest();
  float draft_p_min = kDraftPMinUnset;
  // -ngld/--n-gpu-layers-draft N, llama.cpp's spelling: where a draft model runs. -1 (the default, as
  // not given): where the target runs; 0: the CPU; N > 0: the GPU (strata places the whole model, not N
  // layers).
  int n_gpu_layers_draft = -1;
  NgramParams ngram;
  int dflash_top_k = 4;  // --spec-tree-k: candidates per block position of a DFlash draft
};

enum class SpecKind { None, Ngram, DraftModel, Mtp, DFlash };

// --draft-p-min when it is not given (llama.cpp's flag; strata's default, docs/PERF.md).
constexpr float kDraftPMinDefault = 0.75f;

// --draft-max when it is not given: 3 for the MTP head, whose chained rows cost a layer each and whose
// acceptance falls with depth, and for a DFlash drafter, whose later block positions rarely hold (each the
// bundled model's best, docs/PERF.md); 16 otherwise (llama.cpp's).
int default_draft_max(SpecKind kind);

struct SpecChoice {
  SpecKind kind = SpecKind::None;
  // DraftModel: the draft GGUF; DFlash: the drafter GGUF; "" for either: the model's own, next to it
  // (draft_path_for, dflash_path_for)
  std::string draft_path;
  float draft_p_min = 0.0f;  // DraftModel: DraftModelDrafter's p_min (its min_tokens: params.draft_min)
  SpeculativeParams params;  // drafter unset: the caller makes it (make_drafter)
};

// Validates the options together (kind, draft model given once and only for a draft, lengths) and says
// what they choose; throws strata::Error naming the flag.
SpecChoice check_spec_options(const SpecOptions& o);

// The DFlash drafter `--spec dflash` (no file) takes for a model: FILE.gguf -> FILE.dflash.gguf.
std::string dflash_path_for(const std::string& model_path);
// The draft model `--spec draft` (no file, no -md) takes for a model: FILE.gguf -> FILE.draft.gguf.
std::string draft_path_for(const std::string& model_path);
// The file a DFlash or draft-model choice drafts with: its FILE, or the target's own next to it
// (dflash_path_for, draft_path_for).
std::string drafter_file(const SpecChoice& choice, const Model& target);

// How a draft model drafts for a target sampling with `target`: the same temperature, truncation and
// logit bias (greedy when the target is greedy), no penalties, a seed stream of its own.
SamplerParams draft_sampling(const SamplerParams& target);

// Makes the draft model's sequence of max_ctx tokens (a command's backend factory); empty: a CPU Session.
using DraftSequenceMaker = std::function<std::unique_ptr<Sequence>(const Model& draft, int max_ctx)>;

// Drafters for several sequences of one target (serve's slots): a draft model is loaded and its
// vocabulary checked once (check_draft_vocabulary), then shared; each drafter made has a sequence and
// state of its own. --spec mtp: the target must have an MTP layer (refused naming the file otherwise);
// each drafter has its own head cache and reads the hidden states of the sequence it is attached to.
class DrafterFactory {
 public:
  DrafterFactory(const SpecChoice& choice, const SpecOptions& o, const Model& target,
                 DraftSequenceMaker make_sequence = {});
  // A drafter for sequences of max_ctx tokens (nullptr for SpecKind::None); sampling and n_allowed as
  // make_drafter's.
  std::unique_ptr<Drafter> make(int max_ctx, const SamplerParams& sampling, int32_t n_allowed) const;
  const Model* draft_model() const { return draft_.get(); }  // null unless a draft model drafts

 private:
  SpecKind kind_;
  const Model& target_;
  NgramParams ngram_;
  int dflash_top_k_;
  std::shared_ptr<const Model> draft_;
  float draft_p_min_ = 0.0f;
  int draft_min_ = 0;
  std::shared_ptr<const DFlashModel> dflash_;
  DraftSequenceMaker make_sequence_;
};

// The drafter `choice` names for `target` (nullptr for SpecKind::None). A draft model is loaded,
// its vocabulary checked against the target's (check_draft_vocabulary), and drafts like `sampling`
// (greedy when the target is greedy; else with its temperature and truncation, its own seed stream;
// with its logit bias either way).
// n_allowed: ids from here on are never drafted (the target's tokenizer ends there).
std::unique_ptr<Drafter> make_drafter(const SpecChoice& choice, const SpecOptions& o, const Model& target, int max_ctx,
                                      const SamplerParams& sampling, int32_t n_allowed,
                                      const DraftSequenceMaker& make_sequence = {});

}  // namespace strata

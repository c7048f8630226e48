#include "strata/spec/spec_options.h"

#include <filesystem>

#include "strata/base/error.h"
#include "strata/engine/session.h"
#include "strata/spec/dflash_drafter.h"
#include "strata/spec/draft_model.h"
#include "strata/spec/mtp_drafter.h"

namespace strata {

SpecChoice check_spec_options(const SpecOptions& o) {
  SpecChoice c;
  const std::string& s = o.spec;
  if (s.empty()) {
    if (!o.draft_model.empty()) c.kind = SpecKind::DraftModel, c.draft_path = o.draft_model;
  } else if (s == "ngram") {
    if (!o.draft_model.empty()) fail("--spec ngram drafts without a model: drop -md/--model-draft, or use --spec draft");
    c.kind = SpecKind::Ngram;
  } else if (s == "draft" || s.rfind("draft:", 0) == 0) {
    c.kind = SpecKind::DraftModel;
    c.draft_path = s == "draft" ? o.draft_model : s.substr(6);  // "": the model's own, next to it
    if (s != "draft" && !o.draft_model.empty()) fail("give the draft model once: --spec draft:FILE or -md/--model-draft FILE");
    if (s != "draft" && c.draft_path.empty()) fail("--spec draft:FILE needs a file name");
  } else if (s == "mtp") {
    if (!o.draft_model.empty()) fail("--spec mtp drafts with the model's own MTP layer: drop -md/--model-draft");
    c.kind = SpecKind::Mtp;
  } else if (s == "dflash" || s.rfind("dflash:", 0) == 0) {
    if (!o.draft_model.empty()) fail("--spec dflash drafts with a block drafter: drop -md/--model-draft");
    c.kind = SpecKind::DFlash;
    c.draft_path = s == "dflash" ? "" : s.substr(7);  // "": the model's own, next to it (dflash_path_for)
    if (s != "dflash" && c.draft_path.empty()) fail("--spec dflash:FILE needs a file name");
  } else {
    fail("--spec ", s, ": unknown drafter (available: ngram, mtp, draft, draft:FILE, dflash, dflash:FILE)");
  }
  if (o.dflash_top_k < 1) fail("--spec-tree-k must be >= 1, got ", o.dflash_top_k);
  c.params.draft_max = o.draft_max == SpecOptions::kDraftMaxUnset ? default_draft_max(c.kind) : o.draft_max;
  c.params.draft_min = o.draft_min;
  if (o.n_gpu_layers_draft < -1)
    fail("-ngld/--n-gpu-layers-draft must be >= 0 (or -1: where the target runs), got ", o.n_gpu_layers_draft);
  if (o.n_gpu_layers_draft != -1 && c.kind != SpecKind::DraftModel)
    fail("-ngld/--n-gpu-layers-draft places a draft model: give one with --spec draft, -md FILE or --spec draft:FILE");
  const bool p_min_given = o.draft_p_min != SpecOptions::kDraftPMinUnset;
  if (p_min_given && !(o.draft_p_min >= 0.0f && o.draft_p_min <= 1.0f))  // NaN too
    fail("--draft-p-min must be within 0..1, got ", o.draft_p_min);
  if (p_min_given && c.kind != SpecKind::DraftModel)
    fail("--draft-p-min stops a draft model's proposal: give one with --spec draft, -md FILE or --spec draft:FILE");
  c.draft_p_min = p_min_given ? o.draft_p_min : kDraftPMinDefault;
  validate_speculative_params(c.params);
  if (c.kind == SpecKind::Ngram) validate_ngram_params(o.ngram);
  return c;
}

namespace {

// FILE.gguf -> FILE<suffix> (a file without the extension gets the suffix appended).
std::string companion_path(const std::string& model_path, const char* suffix) {
  const std::string ext = ".gguf";
  const bool has_ext =
      model_path.size() > ext.size() && model_path.compare(model_path.size() - ext.size(), ext.size(), ext) == 0;
  return (has_ext ? model_path.substr(0, model_path.size() - ext.size()) : model_path) + suffix;
}

}  // namespace

std::string dflash_path_for(const std::string& model_path) { return companion_path(model_path, ".dflash.gguf"); }
std::string draft_path_for(const std::string& model_path) { return companion_path(model_path, ".draft.gguf"); }

std::string drafter_file(const SpecChoice& choice, const Model& target) {
  if (!choice.draft_path.empty()) return choice.draft_path;
  const std::string& model = target.file().path();
  return choice.kind == SpecKind::DFlash ? dflash_path_for(model) : draft_path_for(model);
}

namespace {

// drafter_file, refused clearly where the model's own is wanted and there is none.
std::string existing_drafter_file(const SpecChoice& choice, const Model& target) {
  const std::string path = drafter_file(choice, target);
  if (choice.draft_path.empty() && !std::filesystem::exists(path)) {
    const bool dflash = choice.kind == SpecKind::DFlash;
    fail(dflash ? "--spec dflash" : "--spec draft", ": no ", dflash ? "drafter" : "draft model", " next to the model (",
         path, "); pass ", dflash ? "--spec dflash:FILE" : "--spec draft:FILE or -md FILE");
  }
  return path;
}

}  // namespace

int default_draft_max(SpecKind kind) { return kind == SpecKind::Mtp || kind == SpecKind::DFlash ? 3 : 16; }

SamplerParams draft_sampling(const SamplerParams& target) {
  SamplerParams ds;
  ds.temperature = target.temperature;
  ds.top_k = target.top_k;
  ds.top_p = target.top_p;
  ds.min_p = target.min_p;
  ds.logit_bias = target.logit_bias;
  // A stream of its own, so the target's draws are the target's alone.
  if (target.seed) ds.seed = *target.seed ^ 0x9e3779b97f4a7c15ull;
  return ds;
}

DrafterFactory::DrafterFactory(const SpecChoice& choice, const SpecOptions& o, const Model& target,
                               DraftSequenceMaker make_sequence)
    : kind_(choice.kind),
      target_(target),
      ngram_(o.ngram),
      dflash_top_k_(o.dflash_top_k),
      make_sequence_(std::move(make_sequence)) {
  if (kind_ == SpecKind::Mtp && target.config().n_mtp == 0)
    fail("--spec mtp: ", target.file().path(), " has no multi-token-prediction layer (", target.config().arch_name,
         ".nextn_predict_layers is absent; convert a checkpoint with its mtp.* weights, or synth --mtp 1)");
  if (kind_ == SpecKind::DFlash) dflash_ = DFlashModel::load(existing_drafter_file(choice, target), target);
  if (kind_ != SpecKind::DraftModel) return;
  draft_ = Model::load(existing_drafter_file(choice, target));
  check_draft_vocabulary(target, *draft_);
  draft_p_min_ = choice.draft_p_min;
  draft_min_ = choice.params.draft_min;
}

std::unique_ptr<Drafter> DrafterFactory::make(int max_ctx, const SamplerParams& sampling, int32_t n_allowed) const {
  switch (kind_) {
    case SpecKind::None: return nullptr;
    case SpecKind::Ngram: return std::make_unique<NgramDrafter>(ngram_);
    case SpecKind::Mtp: return std::make_unique<MtpDrafter>(target_, max_ctx, n_allowed);
    case SpecKind::DFlash:
      return std::make_unique<DFlashDrafter>(dflash_, n_allowed, dflash_top_k_, max_ctx);
    case SpecKind::DraftModel: break;
  }
  std::unique_ptr<Sequence> seq = make_sequence_ ? make_sequence_(*draft_, max_ctx) : std::make_unique<Session>(*draft_, max_ctx);
  return std::make_unique<DraftModelDrafter>(std::move(seq), draft_sampling(sampling), n_allowed, draft_, draft_p_min_,
                                             draft_min_);
}

std::unique_ptr<Drafter> make_drafter(const SpecChoice& choice, const SpecOptions& o, const Model& target, int max_ctx,
                                      const SamplerParams& sampling, int32_t n_allowed,
                                      const DraftSequenceMaker& make_sequence) {
  return DrafterFactory(choice, o, target, make_sequence).make(max_ctx, sampling, n_allowed);
}

}  // namespace strata

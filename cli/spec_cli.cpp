#include "cli/spec_cli.h"

#include <cstdio>

namespace strata::cli {

void add_spec_options(CLI::App& sub, SpecOptions& o) {
  sub.add_option("--spec", o.spec,
                 "speculative decoding: ngram (prompt lookup), mtp (the model's multi-token-prediction layer, on the "
                 "GPU beside an all-GPU target), "
                 "draft:FILE, or draft (-md FILE, else MODEL.draft.gguf) (a draft model with the same vocabulary), "
                 "dflash:FILE or dflash (MODEL.dflash.gguf) (a DFlash block "
                 "drafter for this model; its draft is a token tree); output is what decoding without it "
                 "gives");
  sub.add_option("--model-draft", o.draft_model, "-md: draft model GGUF (implies --spec draft)");
  sub.add_option("--draft-max,--draft", o.draft_max,
                 "most tokens drafted per step (default 3 with --spec mtp or dflash, 16 otherwise)");
  sub.add_option(
      "--n-gpu-layers-draft,--gpu-layers-draft", o.n_gpu_layers_draft,
      "-ngld: where the draft model runs: 0 the CPU, any value > 0 the GPU (the whole model) (default: where the "
      "target runs)");
  sub.add_option("--draft-min", o.draft_min, "fewer drafted tokens than this run a plain step (default 0)");
  sub.add_option("--draft-p-min", o.draft_p_min,
                 "a draft model drafts on only while its most likely token has at least this probability (default "
                 "0.75)");
  sub.add_option("--spec-ngram-min", o.ngram.min_n, "--spec ngram: shortest n-gram looked up (default 2)");
  sub.add_option("--spec-ngram-max", o.ngram.max_n, "--spec ngram: longest n-gram looked up (default 4)");
  sub.add_option("--spec-ngram-branches", o.ngram.branches,
                 "--spec ngram: draft the continuations of up to N earlier occurrences as a token tree (default 1: "
                 "the most recent one, a chain)");
  sub.add_option("--spec-tree-k", o.dflash_top_k,
                 "--spec dflash: candidates per block position of the draft tree (default 4); --draft-max is its "
                 "node budget");
}

bool draft_on_gpu(const SpecChoice& choice, const SpecOptions& o, const BackendOptions& target_backend) {
  if (choice.kind != SpecKind::DraftModel) return false;
  return o.n_gpu_layers_draft > 0 || (o.n_gpu_layers_draft == -1 && target_backend.gpu);
}

std::unique_ptr<Drafter> make_cli_drafter(const SpecChoice& choice, const SpecOptions& o, const Model& target,
                                          int max_ctx, const SamplerParams& sampling, int32_t n_allowed,
                                          const BackendOptions& target_backend) {
  const bool gpu = draft_on_gpu(choice, o, target_backend);
  std::unique_ptr<Drafter> d = make_drafter(choice, o, target, max_ctx, sampling, n_allowed,
                                            gpu ? draft_sequence_maker(target_backend, 1) : DraftSequenceMaker{});
  if (choice.kind == SpecKind::DraftModel)
    std::fprintf(stderr, "draft model: %s (%s)\n", drafter_file(choice, target).c_str(), gpu ? "cuda" : "cpu");
  return d;
}

}  // namespace strata::cli

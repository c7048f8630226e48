// Speculative decoding on the command line (run, chat, bench): --spec ngram|mtp|draft|draft:FILE|dflash|dflash:FILE
// (draft alone: -md FILE, else MODEL.draft.gguf), -md/--model-draft FILE (llama.cpp's spelling; implies --spec
// draft), --draft-max/--draft N, --draft-min N, --draft-p-min P, --spec-ngram-min/--spec-ngram-max N. Checked by
// strata::check_spec_options.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/backend_cli.h"
#include "strata/engine/generate.h"
#include "strata/spec/spec_options.h"

namespace strata::cli {

void add_spec_options(CLI::App& sub, SpecOptions& o);

// Whether a draft model runs on the GPU: -ngld N > 0, or not given and the target runs there.
bool draft_on_gpu(const SpecChoice& choice, const SpecOptions& o, const BackendOptions& target_backend);

// The drafter `choice` (check_spec_options(o)) names for a command's target (nullptr: none); with a
// draft model, says on stderr which file drafts and where (draft_on_gpu).
std::unique_ptr<Drafter> make_cli_drafter(const SpecChoice& choice, const SpecOptions& o, const Model& target,
                                          int max_ctx, const SamplerParams& sampling, int32_t n_allowed,
                                          const BackendOptions& target_backend);

}  // namespace strata::cli

// Post-training recipes that chain the pipeline's steps (docs/design.md, "Post-training").
//
// instruct (instruction-aware distillation): stages 1-2 of distill (attention-output and hidden-state
// alignment) against an instruction-tuned teacher, writing the aligned student to OUT/distilled,
// then SFT of that student on conversations, writing the chat student to OUT. Stage 3 (end-to-end
// distillation on plain text) is replaced by SFT. Both steps checkpoint; --resume continues either.
#pragma once
#include <string>

#include "distill/sft.h"
#include "distill/stages.h"

namespace linearize {

struct InstructRecipeResult {
  DistillResult distill;
  SftResult sft;
};

// distill.out is the recipe's output folder; sft.model and sft.out are set here.
InstructRecipeResult run_instruct_recipe(DistillOptions distill_options, SftOptions sft_options);

}  // namespace linearize

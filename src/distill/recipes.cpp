// Post-training recipes (see recipes.h).
#include "distill/recipes.h"

#include <filesystem>
#include <iostream>

namespace linearize {

InstructRecipeResult run_instruct_recipe(DistillOptions d, SftOptions s) {
  const std::string out = d.out;
  d.stages = {1, 2};
  d.out = (std::filesystem::path(out) / "distilled").string();
  InstructRecipeResult r;
  if (!d.loop.quiet) std::cerr << "[recipe instruct] stages 1-2 -> " << d.out << ", then sft -> " << out << "\n";
  r.distill = distill(d);
  if (!r.distill.finished) return r;
  s.model = d.out;
  s.out = out;
  s.loop.run_dir = out;
  r.sft = run_sft(s);
  return r;
}

}  // namespace linearize

// linearize pretrain: train a Llama teacher from scratch (next-token cross-entropy).
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "io/error.h"
#include "train/pretrain.h"

namespace linearize::cli {

int cmd_pretrain(const std::vector<std::string>& argv) {
  const PretrainOptions defaults;  // the help's defaults are the code's
  CommandSpec spec{"pretrain",
                   "Train a Llama teacher from scratch with next-token cross-entropy and write a Hugging Face\n"
                   "Llama folder (config.json, model.safetensors, tokenizer files).",
                   "",
                   "Give either --steps or --tokens (total training tokens).",
                   {{"tokenizer", "DIR|FILE", "tokenizer folder or file (its vocabulary sizes the model)", "", true},
                    {"data", "FILE", ".u32 token shard (or .txt/.jsonl, tokenized on the fly)", "", true},
                    {"out", "DIR", "model folder to write (also holds checkpoints and metrics.jsonl)", "", true},
                    {"hidden", "N", "hidden size", default_text(defaults.hidden)},
                    {"layers", "N", "decoder layers", default_text(defaults.layers)},
                    {"heads", "N", "attention heads", default_text(defaults.heads)},
                    {"kv-heads", "N", "key/value heads (grouped-query attention)", default_text(defaults.kv_heads)},
                    {"intermediate", "N", "MLP size (default: 8/3 hidden rounded up to 32)"},
                    {"rope-theta", "X", "RoPE base", default_text(defaults.rope_theta)},
                    {"steps", "N", "optimizer steps", "1000"},
                    {"tokens", "N", "total training tokens (overrides --steps)"},
                    {"init", "DIR", "continue training a model folder (its shape; --hidden etc. are ignored)"}},
                   0, 0};
  for (auto& o : training_options(defaults.loop, defaults.seq_len, true)) spec.options.push_back(o);
  Args args(spec, argv);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  if (args.has("config")) args.apply_config_file(args.str("config"));
  PretrainOptions o;
  o.tokenizer = args.str("tokenizer");
  o.data = args.str("data");
  o.out = args.str("out");
  o.hidden = args.integer("hidden");
  o.layers = args.integer("layers");
  o.heads = args.integer("heads");
  o.kv_heads = args.integer("kv-heads");
  if (args.has("intermediate")) o.intermediate = args.integer("intermediate");
  o.rope_theta = args.number("rope-theta");
  o.seq_len = args.integer("seq-len");
  if (args.has("tokens")) o.tokens = args.integer("tokens");
  if (args.has("init")) o.init_from = args.str("init");
  o.loop = loop_options(args);
  o.loop.steps = args.integer("steps");
  o.loop.run_dir = o.out;
  pretrain(o);
  return 0;
}

}  // namespace linearize::cli

// linearize tokenize: ids of a text, or a token shard (.u32) from text/jsonl files.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "io/error.h"
#include "io/hf_config.h"
#include "data/tokenize_stream.h"

namespace linearize::cli {

int cmd_tokenize(const std::vector<std::string>& argv) {
  CommandSpec spec{
      "tokenize",
      "Print the token ids of a text, or tokenize files of any size into a token dataset: a folder of\n"
      "numbered shards (little-endian uint32 ids, documents separated by the EOS id) with index.json,\n"
      "which training reads memory-mapped; or one .u32 shard. Inputs are streamed (.txt: one document\n"
      "per file; .jsonl: one per line; either may be .gz or .zst compressed) and encoded by several\n"
      "threads; memory stays bounded. A folder left by an interrupted run is cleaned and started again.",
      "",
      "examples:\n  linearize tokenize --tokenizer MODEL_DIR --text \"Hello world\" --json\n"
      "  linearize tokenize --tokenizer MODEL_DIR --input 'corpus/*.jsonl.zst' --output tokens/\n"
      "  linearize tokenize --tokenizer MODEL_DIR --input a.txt,b.jsonl --output train.u32",
      {{"tokenizer", "DIR|FILE", "model folder or tokenizer file (tokenizer.json / tokenizer.model)", "", true},
       {"text", "TEXT", "text to tokenize (special tokens in it are recognised)"},
       {"json", "", "print ids as a JSON array"},
       {"input", "FILES", "comma-separated .txt / .jsonl files (.gz, .zst) or globs ('data/*.jsonl.gz')"},
       {"output", "DIR|FILE.u32", "dataset folder (shards + index.json), or one .u32 shard"},
       {"shard-tokens", "N", "tokens per shard", "268435456"},
       {"threads", "N", "encoding threads (default: the machine's cores)"},
       {"field", "NAME", "jsonl field holding the text", "text"},
       {"eos", "ID", "document separator id (default: the model's eos_token_id, else <|endoftext|>)"}},
      0, 0};
  Args args(spec, argv);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  const std::string tok_path = args.str("tokenizer");
  auto tok = load_tokenizer(tok_path);
  if (args.has("text")) {
    auto ids = tok->encode(args.str("text"), true);
    if (args.flag("json")) {
      std::cout << nlohmann::json(ids).dump() << "\n";
    } else {
      for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
      std::cout << "\n";
    }
    return 0;
  }
  if (!args.has("input") || !args.has("output"))
    throw Error("linearize tokenize: give --text, or --input FILES with --output FILE.u32 (see --help)");
  int64_t eos = -1;
  if (args.has("eos")) {
    eos = args.integer("eos");
    if (eos < 0 || eos >= static_cast<int64_t>(tok->vocab_size()))
      throw Error("linearize tokenize: --eos " + std::to_string(eos) + " is outside the tokenizer's vocabulary (0.." +
                  std::to_string(tok->vocab_size() - 1) + ")");
  } else {
    try {
      auto config = LlamaConfig::load(tok_path);
      if (!config.eos_token_ids.empty()) eos = config.eos_token_ids[0];
    } catch (const Error&) {
    }
    if (eos < 0) {
      if (auto id = tok->token_to_id("<|endoftext|>")) eos = *id;
      else if (auto id2 = tok->token_to_id("</s>")) eos = *id2;
      else throw Error("linearize tokenize: no EOS id known for this tokenizer; pass --eos ID");
    }
  }
  TokenizeOptions o;
  o.inputs = expand_inputs(args.str_list("input"));
  o.output = args.str("output");
  o.eos_id = eos;
  o.field = args.str("field");
  o.shard_tokens = args.integer("shard-tokens");
  if (args.has("threads")) o.threads = static_cast<int>(args.integer("threads"));
  o.tokenizer_source = tok_path;
  o.progress = [](const TokenizeProgress& p) {
    const double s = std::max(p.seconds, 1e-9);
    std::fprintf(stderr, "\r[tokenize] %.0f MB, %lld tokens, %lld documents, %.1f MB/s, %.2fM tokens/s%s", p.bytes / 1e6,
                 static_cast<long long>(p.tokens), static_cast<long long>(p.documents), p.bytes / 1e6 / s,
                 p.tokens / 1e6 / s, p.done ? "\n" : "");
  };
  const auto r = tokenize_to_dataset(*tok, o);
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  std::cerr << "wrote " << r.tokens << " tokens of " << r.documents << " documents from " << o.inputs.size()
            << " file(s) to " << o.output << " (eos " << eos << ") in " << r.seconds << " s; peak RSS "
            << ru.ru_maxrss / 1024 << " MiB\n";
  return 0;
}

}  // namespace linearize::cli

// linearize tokenizer <what>: tokenizer tools. `tokenizer train` trains a byte-level BPE (SmolLM2's
// pre-tokenizer and special tokens) on .txt/.jsonl files and writes a Hugging Face tokenizer folder.
// Deliberately not here: choosing other pre-tokenizers or special tokens, resuming a training.
#include <chrono>
#include <iostream>

#include "cli/args.h"
#include "cli/commands.h"
#include "io/bpe_trainer.h"
#include "io/error.h"

namespace linearize::cli {

namespace {

int tokenizer_train(const std::vector<std::string>& argv) {
  CommandSpec spec{
      "tokenizer train",
      "Train a byte-level BPE tokenizer (SmolLM2's pre-tokenizer: individual digits, then the GPT-2\n"
      "regex; special tokens <|endoftext|>, <|im_start|>, <|im_end|> at ids 0, 1, 2; then the 256\n"
      "bytes; then merges) and write OUT/tokenizer.json and OUT/tokenizer_config.json.",
      "",
      ".txt files are read line by line (as Hugging Face's Tokenizer.train(files) does); each .jsonl\n"
      "line gives one text from --field. Ties between equally frequent pairs go to the smallest\n"
      "(left id, right id), as in Hugging Face's BpeTrainer; the output is deterministic.\n\n"
      "example:\n  linearize tokenizer train --input a.txt,b.jsonl --vocab 8192 --out my-tok",
      {{"input", "FILES", "comma-separated .txt or .jsonl files", "", true},
       {"vocab", "N", "vocabulary size, the 256 bytes and 3 special tokens included, so at least 260 (one merge)", "", true},
       {"out", "DIR", "folder to write tokenizer.json and tokenizer_config.json into", "", true},
       {"min-frequency", "K", "stop when the most frequent pair occurs fewer than K times", "2"},
       {"max-bytes", "N", "read at most N bytes of text in all (default: everything)"},
       {"field", "NAME", "jsonl field holding the text", "text"},
       {"quiet", "", "no progress lines on stderr"}},
      0, 0};
  Args args(spec, argv);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  BpeTrainOptions o;
  o.vocab_size = args.integer("vocab");
  o.min_frequency = args.integer("min-frequency");
  if (args.has("max-bytes")) {
    o.max_bytes = args.integer("max-bytes");
    if (o.max_bytes < 0) throw Error("linearize tokenizer train: --max-bytes must be >= 0");
  }
  o.jsonl_field = args.str("field");
  if (!args.flag("quiet")) o.progress = [](const std::string& line) { std::cerr << line << "\n"; };
  std::vector<std::string> files;
  for (const auto& f : args.str_list("input"))
    if (!f.empty()) files.push_back(f);
  if (files.empty()) throw Error("linearize tokenizer train: --input: expected at least one file, found none");

  const auto t0 = std::chrono::steady_clock::now();
  TrainedBpe bpe = train_bpe(files, o);
  const std::string out = args.str("out");
  bpe.save(out);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "wrote " << out << "/tokenizer.json: vocabulary " << bpe.vocab.size() << ", "
            << bpe.merges.size() << " merges, from " << bpe.bytes_read << " bytes (" << bpe.words_total
            << " words, " << bpe.words_distinct << " distinct) in " << secs << " s\n";
  return 0;
}

}  // namespace

int cmd_tokenizer(const std::vector<std::string>& argv) {
  const std::string usage =
      "usage: linearize tokenizer <subcommand> [options]\n\nsubcommands:\n"
      "  train   train a byte-level BPE tokenizer on .txt/.jsonl files\n\n"
      "Run `linearize tokenizer train --help` for its options.\n";
  if (argv.empty() || argv[0] == "--help" || argv[0] == "-h") {
    std::cout << usage;
    return argv.empty() ? 2 : 0;
  }
  std::vector<std::string> rest(argv.begin() + 1, argv.end());
  if (argv[0] == "train") return tokenizer_train(rest);
  throw Error("linearize tokenizer: unknown subcommand \"" + argv[0] + "\" (available: train)");
}

}  // namespace linearize::cli

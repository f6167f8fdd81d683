// Pretraining a Llama teacher from scratch with next-token cross-entropy: for settings without a
// pretrained teacher (the demo, tests, our own small experiments). Writes a Hugging Face Llama folder
// (config.json, model.safetensors, the tokenizer files) that any Llama loader reads.
#pragma once
#include <string>

#include "io/hf_config.h"
#include "train/trainer.h"

namespace linearize {

struct PretrainOptions {
  std::string tokenizer;  // folder or file
  std::string data;       // .u32 shard (or .txt/.jsonl, tokenized on the fly)
  std::string out;        // model folder to write
  int64_t hidden = 256, layers = 4, heads = 4, kv_heads = 2, intermediate = 0;  // 0: 8/3 hidden, rounded to 32
  double rope_theta = 10000;
  int64_t seq_len = 512;
  int64_t tokens = 0;  // total training tokens; sets steps when > 0
  double init_std = 0.02;
  std::string init_from;  // a model folder to continue training from (its shape; the tokenizer must match)
  TrainLoopOptions loop = loop_with_schedule(ScheduleKind::cosine, 1e-3);  // steps, batch, lr (schedule), device, resume, ...
};

// Returns the final training loss.
double pretrain(const PretrainOptions& options);

}  // namespace linearize

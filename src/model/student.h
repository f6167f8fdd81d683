// A student: the teacher with every attention layer (or a chosen list of layers, for hybrids) replaced
// by one mixer kind. Embeddings, norms, MLPs and the LM head are the teacher's; each replaced layer's
// mixer starts from the teacher's attention (q, o copied; k, v with KV heads repeated where the mixer
// has no native GQA; see model/mixers/factory.h).
//
// On disk a student is a Hugging Face-style folder: config.json = the teacher's fields plus a
// "linearize" section {"mixer", "preset", "layers", "mixer_config", "defects"}; model.safetensors with the
// teacher's names for shared parts (model.layers.{i}.mlp..., model.norm.weight) and the reference
// (fla / xLSTM) names under each replaced layer's mixer, model.layers.{i}.attn.<name>; softmax
// layers that stay keep model.layers.{i}.self_attn.*.
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "model/causal_lm.h"
#include "model/mixers/mixer_config.h"

namespace linearize {

struct StudentSpec {
  std::string preset = "default";  // default | paper
  std::vector<int64_t> layers;     // replaced layers; empty = all
  MixerConfig mixer_config;        // resolved settings of every replaced layer (its kind: the mixer)
  bool study_gqa_unroll = false;   // K/V copied with the study's 32-row unroll (the gqa defect)
  std::vector<std::string> defects;  // the study's defects it was trained with, for the record

  bool replaces(int64_t layer) const;
  nlohmann::json to_json() const;  // the config.json "linearize" section
  static StudentSpec from_json(const nlohmann::json& j, const std::string& source);
  // The preset's mixer config for this teacher, with the layer list checked against it.
  static StudentSpec make(MixerKind mixer, const std::string& preset, const std::vector<int64_t>& layers,
                          const LlamaConfig& teacher);
};

// Mixer factory for CausalLM: replaced layers get `attn` mixers, others `self_attn` attention.
MixerFactory student_factory(const LlamaConfig& config, const StudentSpec& spec);

// Builds a student from a teacher in memory (weights copied, mixers initialised from the teacher).
// Returns the student on the teacher's device, in `dtype` (default: the teacher's); fresh weights are
// drawn in fp32 and never pass through a narrower type on the way to `dtype`. `notes` receives the
// init report when given.
CausalLM build_student(CausalLM& teacher, const StudentSpec& spec, std::vector<std::string>* notes = nullptr,
                       std::optional<torch::ScalarType> dtype = std::nullopt);

// config.json fields of a student (the teacher's plus the "linearize" section).
nlohmann::json student_config_json(const CausalLM& student, const StudentSpec& spec);

// Writes the student folder (config.json, model.safetensors, tokenizer files from `tokenizer_from`).
void save_student(CausalLM& student, const StudentSpec& spec, const std::string& folder,
                  const std::string& tokenizer_from);

}  // namespace linearize

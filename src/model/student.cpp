#include "model/student.h"

#include <algorithm>

#include "io/error.h"
#include "model/mixers/factory.h"
#include "model/model_io.h"

namespace linearize {

bool StudentSpec::replaces(int64_t layer) const {
  return layers.empty() || std::find(layers.begin(), layers.end(), layer) != layers.end();
}

nlohmann::json StudentSpec::to_json() const {
  nlohmann::json j = {{"mixer", to_string(mixer_config.kind)}, {"preset", preset}, {"layers", layers}, {"mixer_config", mixer_config.to_json()}};
  if (!defects.empty()) j["defects"] = defects;
  return j;
}

StudentSpec StudentSpec::from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw Error(source + ": \"linearize\" must be an object");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "mixer" && it.key() != "preset" && it.key() != "layers" && it.key() != "mixer_config" &&
        it.key() != "defects")
      throw Error(source + ": unknown key \"" + it.key() + "\" in the \"linearize\" section "
                  "(expected mixer, preset, layers, mixer_config, defects)");
  if (!j.contains("mixer") || !j["mixer"].is_string())
    throw Error(source + ": the \"linearize\" section has no \"mixer\" name");
  if (!j.contains("mixer_config")) throw Error(source + ": the \"linearize\" section has no \"mixer_config\"");
  StudentSpec s;
  const std::string mixer = j["mixer"].get<std::string>();
  s.preset = j.value("preset", std::string("default"));
  if (j.contains("layers")) s.layers = j["layers"].get<std::vector<int64_t>>();
  if (j.contains("defects")) s.defects = j["defects"].get<std::vector<std::string>>();
  try {
    s.mixer_config = MixerConfig::from_json(j["mixer_config"]).resolve();
  } catch (const Error& e) {
    throw Error(source + ": " + e.what());
  }
  if (to_string(s.mixer_config.kind) != mixer)
    throw Error(source + ": mixer \"" + mixer + "\" but mixer_config.kind \"" + to_string(s.mixer_config.kind) + "\"");
  return s;
}

StudentSpec StudentSpec::make(MixerKind mixer, const std::string& preset, const std::vector<int64_t>& layers,
                              const LlamaConfig& teacher) {
  StudentSpec s;
  s.preset = preset;
  s.layers = layers;
  std::sort(s.layers.begin(), s.layers.end());
  s.layers.erase(std::unique(s.layers.begin(), s.layers.end()), s.layers.end());
  for (int64_t l : s.layers)
    if (l < 0 || l >= teacher.num_hidden_layers)
      throw Error("layer " + std::to_string(l) + " does not exist: the teacher has layers 0.." +
                  std::to_string(teacher.num_hidden_layers - 1));
  s.mixer_config = mixer_preset(mixer, preset, teacher).resolve();
  return s;
}

MixerFactory student_factory(const LlamaConfig& config, const StudentSpec& spec) {
  return [config, spec](int64_t layer) -> std::pair<std::shared_ptr<TokenMixer>, std::string> {
    if (spec.replaces(layer)) return {make_mixer(spec.mixer_config), "attn"};
    return {std::make_shared<LlamaAttention>(config), "self_attn"};
  };
}

CausalLM build_student(CausalLM& teacher, const StudentSpec& spec, std::vector<std::string>* notes,
                       std::optional<torch::ScalarType> dtype) {
  const auto& c = teacher->config;
  CausalLM student(c, student_factory(c, spec));
  auto teacher_params = teacher->named_parameters(true);
  torch::NoGradGuard ng;
  for (auto& p : student->named_parameters(true)) {
    if (const auto* t = teacher_params.find(p.key())) p.value().copy_(*t);
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (!spec.replaces(i)) continue;
    const auto* attn = dynamic_cast<const LlamaAttention*>(teacher->layer(i)->mixer.get());
    if (!attn) throw Error("build_student: teacher layer " + std::to_string(i) + " is not softmax attention");
    auto lines = init_mixer_from_teacher(*student->layer(i)->mixer, *attn, spec.mixer_config, spec.study_gqa_unroll);
    if (notes)
      for (auto& l : lines) notes->push_back("layer " + std::to_string(i) + ": " + l);
  }
  auto w = teacher->lm_head_weight();
  student->to(w.device(), dtype.value_or(w.scalar_type()));
  return student;
}

nlohmann::json student_config_json(const CausalLM& student, const StudentSpec& spec) {
  nlohmann::json j = student->config.to_json();
  j["linearize"] = spec.to_json();
  return j;
}

void save_student(CausalLM& student, const StudentSpec& spec, const std::string& folder,
                  const std::string& tokenizer_from) {
  save_model(student, folder, tokenizer_from, {{"linearize", spec.to_json()}});
}

}  // namespace linearize

// linearize eval <what>: evaluation commands. `eval ppl` scores held-out text, `eval tasks` runs the
// zero-shot benchmarks, `eval niah` the needle-in-a-haystack grid, `eval all` both (and recovery
// against a teacher). Progress goes to stderr, results to stdout or --out; the JSON schemas are in
// eval/tasks.h and eval/niah.h.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "eval/niah.h"
#include "eval/perplexity.h"
#include "eval/recovery.h"
#include "eval/tasks.h"
#include "io/error.h"
#include "io/token_shards.h"

namespace linearize::cli {

namespace {

// A model folder's model on --device and its tokenizer: what eval tasks, niah and all read.
struct EvalModel {
  CausalLM model;
  std::unique_ptr<Tokenizer> tokenizer;
};
EvalModel load_eval_model(const std::string& folder, const Args& args) {
  LoadOptions lo;
  lo.device = parse_device(args.str("device"));
  lo.inference = true;
  return {load_model(folder, lo), model_tokenizer(folder)};
}

// --json, --out FILE and --device: the options of the commands whose results go through emit().
void add_result_options(CommandSpec& spec) {
  spec.options.push_back({"json", "", "print the results JSON on stdout"});
  spec.options.push_back({"out", "FILE", "also write the results JSON to FILE"});
  spec.options.push_back(device_option());
}

int eval_ppl(const std::vector<std::string>& argv) {
  CommandSpec spec{"eval ppl",
                   "Next-token perplexity over consecutive non-overlapping windows of N tokens (each window\n"
                   "scored from its first token).",
                   "",
                   "",
                   {{"model", "DIR", "model folder", "", true},
                    {"data", "FILE", ".u32 token shard, or .txt/.jsonl text tokenized with the model's tokenizer", "", true},
                    {"seq-len", "N", "window length in tokens", "512"},
                    {"batch", "B", "windows per forward pass", "8"},
                    {"max-tokens", "N", "score at most the first N tokens of the data"},
                    {"json", "", "print {\"nll\", \"ppl\", \"tokens\"} as JSON"},
                    device_option()},
                   0, 0};
  Args args(spec, argv);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  const std::string folder = args.str("model");
  const int64_t seq_len = args.integer("seq-len"), batch = args.integer("batch");
  LoadOptions lo;
  lo.device = parse_device(args.str("device"));
  lo.inference = true;
  auto model = load_model(folder, lo);
  std::unique_ptr<Tokenizer> tok;
  const std::string data = args.str("data");
  if (data.size() < 4 || data.substr(data.size() - 4) != ".u32") tok = model_tokenizer(folder);
  const int64_t eos = model->config.eos_token_ids.empty() ? -1 : model->config.eos_token_ids[0];
  auto tokens = load_tokens(data, tok.get(), eos, model->config.vocab_size);
  if (args.has("max-tokens") && static_cast<int64_t>(tokens.size()) > args.integer("max-tokens"))
    tokens.resize(args.integer("max-tokens"));
  const bool json = args.flag("json");
  auto r = perplexity(model, tokens, seq_len, batch, [&](int64_t done, int64_t total) {
    if (!json) std::cerr << "\rscoring windows " << done << "/" << total << std::flush;
  });
  if (!json) std::cerr << "\n";
  nlohmann::json j = {{"nll", r.nll}, {"ppl", r.ppl}, {"tokens", r.tokens}};
  if (json) std::cout << j.dump() << "\n";
  else std::cout << "nll " << r.nll << "  ppl " << r.ppl << "  tokens " << r.tokens << "\n";
  return 0;
}

// ---- shared by tasks / niah / all ----

std::string default_shared(const std::string& sub) {
  // ../shared/data/<sub> next to the working directory, as the project layout puts it.
  return (std::filesystem::path("..") / "shared" / "data" / sub).string();
}

std::vector<OptionSpec> task_options() {
  return {{"tasks", "LIST", "comma-separated tasks", "lambada,arc_easy,arc_challenge,hellaswag,piqa,winogrande,openbookqa"},
          {"data-dir", "DIR", "folder with the evaluation files", default_shared("eval")},
          {"limit", "N", "score only the first N items of each task"},
          {"batch", "N", "sequences per forward pass", "16"}};
}

std::vector<OptionSpec> niah_options(const std::string& lengths, const std::string& samples) {
  return {{"lengths", "LIST", "prompt lengths in tokens (prompt + generation budget)", lengths},
          {"samples", "N", "prompts per length (RULER's own runs: 500)", samples},
          {"max-new-tokens", "N", "generation budget per prompt (RULER: 128)", "128"},
          {"no-newline-stop", "", "generate the whole budget instead of stopping at the first newline"},
          {"chat", "", "ask through the model folder's chat template (chat models)"},
          {"haystack", "FILE", "prose for s_niah_2/3 (RULER uses Paul Graham's essays)",
           default_shared("corpus/austen_emma.txt")},
          {"seed", "S", "seed of keys, values and needle depths", "0"}};
}

nlohmann::json run_tasks(CausalLM& model, const Tokenizer& tok, const std::string& folder, const Args& args) {
  ScoreOptions so;
  so.batch = args.integer("batch");
  const int64_t limit = args.has("limit") ? args.integer("limit") : -1;
  std::vector<TaskResult> results;
  for (const auto& name : args.str_list("tasks")) {
    const TaskData task = load_task(name, args.str("data-dir"), limit);
    so.progress = [&](int64_t d, int64_t t) { progress_line(name + ": scored", d, t); };
    results.push_back(evaluate_task(model, tok, task, so));
    const auto& r = results.back();
    std::cerr << name << ": n " << r.n << "  acc " << r.acc << "  acc_norm " << r.acc_norm << "\n";
  }
  return results_json(folder, results);
}

NiahOptions niah_settings(const Args& args, const std::string& task) {
  NiahOptions o;
  o.task = task;
  o.lengths = args.int_list("lengths");
  o.samples = args.integer("samples");
  o.max_new_tokens = args.integer("max-new-tokens");
  o.stop_at_newline = !args.flag("no-newline-stop");
  o.chat = args.flag("chat");
  o.haystack_file = args.str("haystack");
  o.seed = static_cast<uint64_t>(args.integer("seed"));
  return o;
}

nlohmann::json run_niah_cli(EvalModel& m, const std::string& folder, const NiahOptions& o) {
  const auto encode = niah_encoder(m.model, *m.tokenizer, folder, o.chat);
  return run_niah(m.model, *m.tokenizer, o, encode, [&](int64_t d, int64_t t) { progress_line(o.task + ": prompts", d, t); });
}

void print_tasks(const nlohmann::json& r) {
  std::vector<std::string> order;  // the paper's order, then any other task
  for (const auto& n : task_names())
    if (r["tasks"].contains(n)) order.push_back(n);
  for (const auto& [n, v] : r["tasks"].items())
    if (std::find(order.begin(), order.end(), n) == order.end()) order.push_back(n);
  for (const auto& name : order) {
    const auto& t = r["tasks"][name];
    std::printf("%-14s n %5lld  acc %.4f ± %.4f  acc_norm %.4f ± %.4f  [%s %.4f]", name.c_str(),
                static_cast<long long>(t["n"].get<int64_t>()), t["acc"].get<double>(), t["acc_stderr"].get<double>(),
                t["acc_norm"].get<double>(), t["acc_norm_stderr"].get<double>(),
                t["metric"].get<std::string>().c_str(), t["score"].get<double>());
    if (t.contains("ppl")) std::printf("  ppl %.3f", t["ppl"].get<double>());
    std::printf("\n");
  }
  std::printf("average of headline metrics: %.4f\n", r["average"].get<double>());
}

void print_niah(const nlohmann::json& r) {
  std::printf("%s  accuracy by length (%lld samples each, needle depths drawn at random)\n",
              r["task"].get<std::string>().c_str(), static_cast<long long>(r["samples"].get<int64_t>()));
  for (const auto& len : r["lengths"]) {
    const auto key = std::to_string(len.get<int64_t>());
    std::printf("%8s  %6.1f%%\n", key.c_str(), 100 * r["per_length"][key].get<double>());
  }
  std::printf("average %.1f%%\n", 100 * r["average"].get<double>());
}

int eval_tasks(const std::vector<std::string>& argv) {
  CommandSpec spec{"eval tasks",
                   "Zero-shot multiple-choice and LAMBADA tasks with lm-eval-harness semantics (see\n"
                   "src/eval/tasks.h): acc, acc_norm, their stderr and each task's headline metric.",
                   "", "", {{"model", "DIR", "model folder", "", true}}, 0, 0};
  for (auto& o : task_options()) spec.options.push_back(o);
  add_result_options(spec);
  Args args(spec, argv);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  const std::string folder = args.str("model");
  auto m = load_eval_model(folder, args);
  const auto r = run_tasks(m.model, *m.tokenizer, folder, args);
  emit(r, args, [&] { print_tasks(r); });
  return 0;
}

int eval_niah(const std::vector<std::string>& argv) {
  CommandSpec spec{"eval niah",
                   "RULER single-needle retrieval (see src/eval/niah.h): RULER's prompts filled to each length\n"
                   "in the model's tokens, the needle at a random depth, greedy decoding, the sample right when\n"
                   "the needle's value occurs in the output (case-insensitive); accuracy per length.",
                   "", "",
                   {{"model", "DIR", "model folder", "", true},
                    {"task", "NAME", "s_niah_1 (noise), s_niah_2 (prose, number), s_niah_3 (prose, UUID)", "s_niah_1"}},
                   0, 0};
  for (auto& o : niah_options("512,1024,2048,4096", "20")) spec.options.push_back(o);
  spec.options.push_back({"dump", "FILE", "write every prompt, reference and output to FILE (jsonl)"});
  add_result_options(spec);
  Args args(spec, argv);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  const std::string folder = args.str("model");
  auto m = load_eval_model(folder, args);
  auto settings = niah_settings(args, args.str("task"));
  if (args.has("dump")) settings.dump = args.str("dump");
  auto r = run_niah_cli(m, folder, settings);
  r["model"] = folder;
  emit(r, args, [&] { print_niah(r); });
  return 0;
}

// Tasks and NIAH for one model folder, with the metadata options attached.
nlohmann::json evaluate_all(const std::string& folder, const Args& args, const std::string& role) {
  auto m = load_eval_model(folder, args);
  std::cerr << "== " << role << " " << folder << "\n";
  nlohmann::json r = run_tasks(m.model, *m.tokenizer, folder, args);
  r["role"] = role;
  r["niah"] = nlohmann::json::object();
  for (const auto& task : args.str_list("niah-tasks"))
    r["niah"][task] = run_niah_cli(m, folder, niah_settings(args, task));
  return r;
}

int eval_all(const std::vector<std::string>& argv) {
  CommandSpec spec{"eval all",
                   "Zero-shot tasks and NIAH for a model, and with --teacher the same for the teacher and\n"
                   "the recovery % = mean(student scores) / mean(teacher scores) x 100. Writes OUT/<name>.json\n"
                   "(and OUT/<teacher name>.json) for `linearize report`.",
                   "", "",
                   {{"model", "DIR", "model folder (student)", "", true},
                    {"teacher", "DIR", "teacher model folder: adds its results and the recovery"},
                    {"out", "DIR", "folder for the results JSON files", "eval_results"},
                    {"label", "NAME", "display name in reports (default: the folder name)"},
                    {"mixer", "NAME", "token mixer, recorded for the report's charts"},
                    {"scale", "X", "model scale (e.g. parameters in billions), recorded for the charts"},
                    {"tokens", "N", "distillation token budget, recorded for the charts"},
                    {"niah-tasks", "LIST", "NIAH tasks", "s_niah_1"}},
                   0, 0};
  for (auto& o : task_options()) spec.options.push_back(o);
  for (auto& o : niah_options("512,1024", "10")) spec.options.push_back(o);
  spec.options.push_back(device_option());
  Args args(spec, argv);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  const std::string out_dir = args.str("out");
  nlohmann::json student = evaluate_all(args.str("model"), args, args.has("teacher") ? "student" : "model");
  if (args.has("label")) student["label"] = args.str("label");
  if (args.has("mixer")) student["mixer"] = args.str("mixer");
  if (args.has("scale")) student["scale"] = args.number("scale");
  if (args.has("tokens")) student["tokens"] = args.number("tokens");
  if (args.has("teacher")) {
    nlohmann::json teacher = evaluate_all(args.str("teacher"), args, "teacher");
    if (args.has("scale")) teacher["scale"] = args.number("scale");
    student["teacher"] = args.str("teacher");
    student["recovery"] = recovery_percent(student, teacher);
    write_json(teacher, (std::filesystem::path(out_dir) / (result_file_name(teacher) + ".teacher.json")).string());
  }
  const std::string path = (std::filesystem::path(out_dir) / (result_file_name(student) + ".json")).string();
  write_json(student, path);
  print_tasks(student);
  for (const auto& [task, n] : student["niah"].items()) print_niah(n);
  if (student.contains("recovery")) std::printf("recovery vs teacher: %.1f%%\n", student["recovery"].get<double>());
  std::printf("results written to %s\n", path.c_str());
  return 0;
}

}  // namespace

int cmd_eval(const std::vector<std::string>& argv) {
  const std::string usage =
      "usage: linearize eval ppl|tasks|niah|instruct|all [options]   (run `linearize eval <what> --help`)\n";
  if (argv.empty() || argv[0] == "--help" || argv[0] == "-h") {
    std::cout << usage;
    return argv.empty() ? 2 : 0;
  }
  std::vector<std::string> rest(argv.begin() + 1, argv.end());
  if (argv[0] == "ppl") return eval_ppl(rest);
  if (argv[0] == "tasks") return eval_tasks(rest);
  if (argv[0] == "niah") return eval_niah(rest);
  if (argv[0] == "instruct") return eval_instruct(rest);
  if (argv[0] == "all") return eval_all(rest);
  throw Error("linearize eval: unknown evaluation \"" + argv[0] + "\" (available: ppl, tasks, niah, instruct, all)");
}

}  // namespace linearize::cli

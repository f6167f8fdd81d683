// The subcommands of the `linearize` tool. Each takes its arguments (after the command name) and
// returns the process exit code; errors are thrown as linearize::Error and printed by run_cli.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace linearize::cli {

using CommandFn = std::function<int(const std::vector<std::string>& args)>;

struct Command {
  std::string name;     // first word: "info", "eval", ...
  std::string summary;  // one line for `linearize --help`
  CommandFn run;
};

int cmd_info(const std::vector<std::string>& args);
int cmd_tokenize(const std::vector<std::string>& args);
int cmd_tokenizer(const std::vector<std::string>& args);
int cmd_generate(const std::vector<std::string>& args);
int cmd_eval(const std::vector<std::string>& args);
int cmd_demo(const std::vector<std::string>& args);
int cmd_pretrain(const std::vector<std::string>& args);
int cmd_distill(const std::vector<std::string>& args);
int cmd_report(const std::vector<std::string>& args);
int cmd_launch(const std::vector<std::string>& args);
int cmd_sft(const std::vector<std::string>& args);
int cmd_chat(const std::vector<std::string>& args);
int cmd_study(const std::vector<std::string>& args);
int cmd_serve(const std::vector<std::string>& args);
int cmd_export(const std::vector<std::string>& args);
int cmd_import(const std::vector<std::string>& args);
int eval_instruct(const std::vector<std::string>& args);  // `eval instruct` (cmd_eval_instruct.cpp)

const std::vector<Command>& commands();

// Entry point used by main(): dispatches, prints one clear line on error, returns the exit code.
int run_cli(int argc, char** argv);

}  // namespace linearize::cli

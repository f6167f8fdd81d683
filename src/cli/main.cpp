// linearize: the command-line tool. All work happens in the library; see src/cli/commands.h.
#include "cli/commands.h"

int main(int argc, char** argv) { return linearize::cli::run_cli(argc, argv); }

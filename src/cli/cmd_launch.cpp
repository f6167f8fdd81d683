// linearize launch: start one training process per device, with torchrun's environment contract
// (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), and wait for them.
// Each process is this same binary running the given command; the training loop sees the variables
// and trains data parallel (src/train/data_parallel.h). If one process fails, the others are stopped
// and its exit code is returned; SIGINT/SIGTERM are passed on to every process.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <thread>

#include "cli/commands.h"
#include "cli/common.h"
#include "compat/child_process.h"
#include "io/error.h"

namespace linearize::cli {

namespace {

std::vector<pid_t> g_children;

void forward_signal(int sig) {
  for (pid_t p : g_children)
    if (p > 0) ::kill(p, sig);
}

// A TCP port that is free on this machine right now (single-node runs need no fixed port).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error("launch: cannot open a socket to find a free port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw Error("launch: cannot find a free port (give --master-port)");
  }
  const int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

}  // namespace

int cmd_launch(const std::vector<std::string>& argv) {
  CommandSpec spec{"launch",
                   "Run a training command data parallel: one process per device (GPU, or CPU processes),\n"
                   "gradients averaged through torch's c10d (NCCL on CUDA, Gloo on CPU).",
                   "-- <pretrain|distill|sft> [OPTIONS]",
                   "Every process gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT,\n"
                   "the contract of torchrun, so `torchrun --nproc-per-node N linearize distill ...` or a cluster\n"
                   "scheduler that sets them works too. --batch stays the global batch: each of the N processes\n"
                   "computes batch/N sequences per step (batch must be divisible by N x --grad-accum), so a run\n"
                   "gives the same losses on any number of processes. With --device cuda, process k uses cuda:k.\n"
                   "Rank 0 prints progress and writes checkpoints and the model; --resume works with a different\n"
                   "number of processes. Several machines: run launch on each with --nnodes, --node-rank and the\n"
                   "address of node 0 (--master-addr, --master-port); the run folder must be shared.\n\n"
                   "Example: linearize launch --nproc-per-node 8 -- distill --teacher T --data D.u32 --out S \\\n"
                   "           --mixer gated_deltanet --device cuda --batch 64",
                   {{"nproc-per-node", "N", "processes on this machine", "", true},
                    {"nnodes", "M", "machines taking part", "1"},
                    {"node-rank", "R", "this machine's index, 0 .. M-1", "0"},
                    {"master-addr", "HOST", "address of node 0 (rendezvous)", "127.0.0.1"},
                    {"master-port", "PORT", "rendezvous port (default: a free port when --nnodes 1, else 29500)"}},
                   0, 0};
  // Everything after `--` is the command to run.
  auto sep = std::find(argv.begin(), argv.end(), "--");
  std::vector<std::string> own(argv.begin(), sep), child;
  if (sep != argv.end()) child.assign(sep + 1, argv.end());
  Args args(spec, own);
  if (args.help_requested()) return std::cout << help_text(spec), 0;
  if (child.empty()) throw Error("launch: give the command after `--`, e.g. launch --nproc-per-node 2 -- distill ...");
  const std::string& command = child[0];
  if (command != "pretrain" && command != "distill" && command != "sft")
    throw Error("launch: \"" + command + "\" is not a training command (expected pretrain, distill or sft)");

  const int64_t nproc = args.integer("nproc-per-node"), nnodes = args.integer("nnodes"),
                node_rank = args.integer("node-rank");
  if (nproc < 1) throw Error("launch: --nproc-per-node must be at least 1");
  if (nnodes < 1) throw Error("launch: --nnodes must be at least 1");
  if (node_rank < 0 || node_rank >= nnodes)
    throw Error("launch: --node-rank " + std::to_string(node_rank) + " is not in 0 .. " + std::to_string(nnodes - 1));
  const std::string addr = args.str("master-addr");
  const int port = args.has("master-port") ? static_cast<int>(args.integer("master-port"))
                   : nnodes == 1            ? free_port()
                                            : 29500;
  const std::string exe = self_exe();
  // CPU processes share the cores (as torchrun does, unless the user set OMP_NUM_THREADS).
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::string omp = std::to_string(std::max<int64_t>(1, static_cast<int64_t>(cores) / nproc));

  struct sigaction sa{};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);

  for (int64_t local = 0; local < nproc; ++local) {
    const std::vector<ChildEnv> env = {{"RANK", std::to_string(node_rank * nproc + local)},
                                       {"LOCAL_RANK", std::to_string(local)},
                                       {"WORLD_SIZE", std::to_string(nnodes * nproc)},
                                       {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
                                       {"GROUP_RANK", std::to_string(node_rank)},
                                       {"MASTER_ADDR", addr},
                                       {"MASTER_PORT", std::to_string(port)},
                                       {"OMP_NUM_THREADS", omp, /*overwrite=*/false}};
    try {
      g_children.push_back(start_child(exe, child, env));
    } catch (const Error&) {
      forward_signal(SIGTERM);
      throw Error("launch: cannot start process " + std::to_string(local) + " of " + std::to_string(nproc));
    }
  }
  std::cerr << "[launch] " << nproc << " processes on this node (" << nnodes * nproc << " in all), rendezvous "
            << addr << ":" << port << "\n";

  // Wait for every process; the first failure stops the rest.
  int exit_code = 0;
  size_t running = g_children.size();
  while (running > 0) {
    const auto ended = wait_any_child();
    if (!ended) break;
    auto it = std::find(g_children.begin(), g_children.end(), ended->pid);
    if (it == g_children.end()) continue;
    const int64_t local = it - g_children.begin();
    *it = -1;
    --running;
    const int code = ended->code;
    if (code != 0 && exit_code == 0) {
      exit_code = code;
      std::cerr << "[launch] local rank " << local << " exited with code " << code << "; stopping the others\n";
      forward_signal(SIGTERM);
    }
  }
  return exit_code;
}

}  // namespace linearize::cli

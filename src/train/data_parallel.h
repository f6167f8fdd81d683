// Data-parallel training over torch's c10d process groups: one process per device, each holding a
// full replica; every rank computes gradients on its own rows of the global batch, and the gradients
// are averaged with all-reduce (ProcessGroupNCCL on CUDA, ProcessGroupGloo on CPU) before the
// identical optimizer step on every rank. Rendezvous through c10d's TCPStore on MASTER_ADDR:MASTER_PORT.
//
// The environment contract is torchrun's: RANK, LOCAL_RANK, WORLD_SIZE (and LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT). `linearize launch` sets it; torchrun or a cluster scheduler may too.
// A process started without WORLD_SIZE trains alone and never touches c10d.
//
// Gradient averaging is bucketed and overlaps the backward pass: a hook on each parameter copies its
// finished gradient into a flat bucket (parameters in reverse order of registration, about the order
// in which backward produces them), and a full bucket's all-reduce starts at once, asynchronously,
// while backward goes on. finish() waits for the buckets and writes sum / world_size back into .grad.
// With gradient accumulation only the last micro-batch's backward communicates.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

namespace linearize {

// What a launcher tells each process.
struct LaunchEnv {
  bool launched = false;  // WORLD_SIZE is set
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;

  // Reads the variables; a malformed or inconsistent value is an error naming the variable.
  static LaunchEnv from_environment();
};

// True in a process that should write files and print progress: rank 0, or a process not launched.
bool is_main_process();

// The device this rank trains on: `requested` as given, except that plain "cuda" becomes
// cuda:LOCAL_RANK in a launched process.
torch::Device device_for_rank(torch::Device requested);

class DataParallelGroup {
 public:
  // The process group of this launched process, created (rendezvous included) on the first call;
  // nullptr when the process was not launched. `device` picks the backend: NCCL for CUDA, Gloo for CPU.
  static DataParallelGroup* get(torch::Device device);

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  torch::Device device() const { return device_; }

  // Copies rank 0's values into every rank's tensors (in place).
  void broadcast_from_rank0(const std::vector<torch::Tensor>& tensors);
  // Sum over ranks, in place, waiting for the result.
  void allreduce_sum(torch::Tensor& tensor);
  // The mean of a number over ranks.
  double mean(double value);
  void barrier();

  // Starts an asynchronous sum over ranks of `tensor` (in place); wait() on the handle.
  class Pending;
  std::unique_ptr<Pending> allreduce_sum_async(torch::Tensor tensor);

  ~DataParallelGroup();

 private:
  struct Impl;
  DataParallelGroup(const LaunchEnv& env, torch::Device device);
  LaunchEnv env_;
  torch::Device device_;
  std::unique_ptr<Impl> impl_;
};

class DataParallelGroup::Pending {
 public:
  virtual ~Pending() = default;
  virtual void wait() = 0;
};

// Averages the gradients of `params` over the ranks of `group`, in buckets, overlapping backward.
// Hooks are removed when the object goes away.
class GradientSync {
 public:
  GradientSync(DataParallelGroup& group, const std::vector<torch::Tensor>& params,
               int64_t bucket_bytes = 25 << 20);
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  // Whether the next backward communicates (true for the last micro-batch of a step).
  void arm(bool on) { armed_ = on; }
  // After the armed backward: completes every bucket and sets each .grad to the mean over ranks.
  void finish();
  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }

 private:
  struct Bucket {
    std::vector<size_t> members;  // indices into params_
    torch::Tensor flat;           // [sum of numels]
    size_t ready = 0;
    std::unique_ptr<DataParallelGroup::Pending> pending;
  };
  // Parameter i's place in its bucket, shaped like the parameter.
  torch::Tensor slot(size_t i) const;
  void on_gradient(size_t param, const torch::Tensor& grad);
  void launch(Bucket& bucket);

  DataParallelGroup& group_;
  std::vector<torch::Tensor> params_;
  std::vector<size_t> bucket_of_, offset_of_;
  std::vector<bool> seen_;
  std::vector<unsigned> hook_ids_;
  std::vector<Bucket> buckets_;
  bool armed_ = false;
};

}  // namespace linearize

#include "train/data_parallel.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef LINEARIZE_WITH_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef LINEARIZE_WITH_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <cstdlib>

#include "compat/torch_compat.h"
#include "io/error.h"

namespace linearize {

namespace {

// A variable as an integer >= min, or `fallback` when unset.
int env_int(const char* name, int fallback, int min) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < min || x > (1 << 30))
    throw Error(std::string("environment variable ") + name + "=\"" + v + "\": expected an integer >= " +
                std::to_string(min));
  return static_cast<int>(x);
}

// Seconds a rank waits for the others at rendezvous and in a collective before giving up.
std::chrono::milliseconds timeout() {
  return std::chrono::milliseconds(1000LL * env_int("LINEARIZE_DIST_TIMEOUT_S", 600, 1));
}

#ifdef LINEARIZE_WITH_GLOO
// Gloo's network device: GLOO_SOCKET_IFNAME when set (as in torch), loopback when every rank runs on
// this machine, else this host's address.
std::shared_ptr<::gloo::transport::Device> gloo_device(const LaunchEnv& env) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"))
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  if (env.local_world_size == env.world_size) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}
#endif

class PendingWork : public DataParallelGroup::Pending {
 public:
  explicit PendingWork(c10::intrusive_ptr<c10d::Work> work) : work_(std::move(work)) {}
  void wait() override { work_->wait(); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
};

}  // namespace

LaunchEnv LaunchEnv::from_environment() {
  LaunchEnv e;
  const char* ws = std::getenv("WORLD_SIZE");
  if (!ws || !*ws) return e;
  e.launched = true;
  e.world_size = env_int("WORLD_SIZE", 1, 1);
  e.rank = env_int("RANK", 0, 0);
  e.local_rank = env_int("LOCAL_RANK", 0, 0);
  e.local_world_size = env_int("LOCAL_WORLD_SIZE", e.world_size, 1);
  if (e.rank >= e.world_size)
    throw Error("environment: RANK=" + std::to_string(e.rank) + " is not below WORLD_SIZE=" + std::to_string(e.world_size));
  if (e.local_rank >= e.local_world_size)
    throw Error("environment: LOCAL_RANK=" + std::to_string(e.local_rank) + " is not below LOCAL_WORLD_SIZE=" +
                std::to_string(e.local_world_size));
  if (const char* a = std::getenv("MASTER_ADDR"); a && *a) e.master_addr = a;
  else if (e.world_size > 1) throw Error("environment: WORLD_SIZE is set but MASTER_ADDR is not");
  e.master_port = env_int("MASTER_PORT", 29500, 1);
  if (e.master_port > 65535) throw Error("environment: MASTER_PORT=" + std::to_string(e.master_port) + " is not a port");
  return e;
}

bool is_main_process() { return LaunchEnv::from_environment().rank == 0; }

torch::Device device_for_rank(torch::Device requested) {
  if (!requested.is_cuda() || requested.has_index()) return requested;
  const auto env = LaunchEnv::from_environment();
  if (!env.launched) return requested;
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
}

struct DataParallelGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<compat::CommBackend> backend;
};

DataParallelGroup* DataParallelGroup::get(torch::Device device) {
  static std::unique_ptr<DataParallelGroup> group;
  if (group) {
    if (group->device_.type() != device.type())
      throw Error("data-parallel group was created for " + group->device_.str() + ", now asked for " + device.str());
    return group.get();
  }
  const auto env = LaunchEnv::from_environment();
  if (!env.launched) return nullptr;
  group.reset(new DataParallelGroup(env, device));
  return group.get();
}

DataParallelGroup::DataParallelGroup(const LaunchEnv& env, torch::Device device)
    : env_(env), device_(device), impl_(std::make_unique<Impl>()) {
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(env.master_port);
    so.isServer = env.rank == 0;
    so.numWorkers = env.world_size;
    so.waitWorkers = true;
    so.timeout = timeout();
    impl_->store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
    if (device.is_cuda()) {
#ifdef LINEARIZE_WITH_NCCL
      c10::cuda::set_device(device.index());
      impl_->backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(impl_->store, env.rank, env.world_size,
                                                                   c10d::ProcessGroupNCCL::Options::create());
#else
      throw Error("this build has no NCCL; data-parallel training on CUDA needs the GPU build");
#endif
    } else {
#ifdef LINEARIZE_WITH_GLOO
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout());
      opts->devices.push_back(gloo_device(env));
      impl_->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(impl_->store, env.rank, env.world_size, opts);
#else
      throw Error("this build has no Gloo (gloo headers were not found at configure time); data-parallel "
                  "training on CPU needs libgloo-dev");
#endif
    }
  } catch (const c10::Error& e) {
    throw Error("rank " + std::to_string(env.rank) + ": joining the process group at " + where +
                " failed: " + e.what_without_backtrace());
  }
}

DataParallelGroup::~DataParallelGroup() = default;

std::unique_ptr<DataParallelGroup::Pending> DataParallelGroup::allreduce_sum_async(torch::Tensor tensor) {
  std::vector<at::Tensor> v{std::move(tensor)};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  return std::make_unique<PendingWork>(impl_->backend->allreduce(v, opts));
}

void DataParallelGroup::allreduce_sum(torch::Tensor& tensor) { allreduce_sum_async(tensor)->wait(); }

double DataParallelGroup::mean(double value) {
  auto t = torch::full({1}, value, torch::TensorOptions().dtype(torch::kDouble).device(device_));
  allreduce_sum(t);
  return t.item<double>() / env_.world_size;
}

void DataParallelGroup::barrier() {
  // A one-element all-reduce on our own device: the same on both backends, and NCCL need not guess
  // which device this rank uses.
  auto t = torch::zeros({1}, torch::TensorOptions().device(device_));
  allreduce_sum(t);
}

void DataParallelGroup::broadcast_from_rank0(const std::vector<torch::Tensor>& tensors) {
  torch::NoGradGuard ng;
  for (const auto& t : tensors) {
    auto buf = t.detach().contiguous();
    std::vector<at::Tensor> v{buf};
    c10d::BroadcastOptions opts;
    opts.rootRank = 0;
    impl_->backend->broadcast(v, opts)->wait();
    if (!buf.is_same(t)) t.detach().copy_(buf);
  }
}

// ---------------------------------------------------------------------------------------------------
// GradientSync

GradientSync::GradientSync(DataParallelGroup& group, const std::vector<torch::Tensor>& params, int64_t bucket_bytes)
    : group_(group) {
  for (const auto& p : params)
    if (p.requires_grad()) params_.push_back(p);
  const size_t n = params_.size();
  bucket_of_.resize(n);
  offset_of_.resize(n);
  seen_.assign(n, false);
  // Reverse registration order: backward finishes the last layers first.
  std::vector<int64_t> sizes;
  int64_t bytes = 0;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = n - 1 - k;
    const auto& p = params_[i];
    const bool fresh = buckets_.empty() || bytes >= bucket_bytes ||
                       params_[buckets_.back().members.front()].scalar_type() != p.scalar_type();
    if (fresh) {
      buckets_.emplace_back();
      sizes.push_back(0);
      bytes = 0;
    }
    bucket_of_[i] = buckets_.size() - 1;
    offset_of_[i] = static_cast<size_t>(sizes.back());
    buckets_.back().members.push_back(i);
    sizes.back() += p.numel();
    bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const auto& first = params_[buckets_[b].members.front()];
    buckets_[b].flat = torch::zeros({sizes[b]}, first.options().requires_grad(false));
  }
  for (size_t i = 0; i < n; ++i)
    hook_ids_.push_back(params_[i].register_hook([this, i](torch::Tensor grad) {
      if (armed_) on_gradient(i, grad);
    }));
}

GradientSync::~GradientSync() {
  for (size_t i = 0; i < params_.size(); ++i) params_[i].remove_hook(hook_ids_[i]);
}

torch::Tensor GradientSync::slot(size_t i) const {
  const auto& p = params_[i];
  return buckets_[bucket_of_[i]].flat.narrow(0, static_cast<int64_t>(offset_of_[i]), p.numel()).view(p.sizes());
}

void GradientSync::on_gradient(size_t i, const torch::Tensor& grad) {
  torch::NoGradGuard ng;
  const auto& p = params_[i];
  auto& bucket = buckets_[bucket_of_[i]];
  auto s = slot(i);
  s.copy_(grad);
  // With accumulation, .grad holds the earlier micro-batches; autograd adds `grad` to it after this
  // hook, and finish() overwrites the sum with the mean over ranks.
  if (p.grad().defined()) s.add_(p.grad());
  if (!seen_[i]) {
    seen_[i] = true;
    if (++bucket.ready == bucket.members.size()) launch(bucket);
  }
}

void GradientSync::launch(Bucket& bucket) { bucket.pending = group_.allreduce_sum_async(bucket.flat); }

void GradientSync::finish() {
  torch::NoGradGuard ng;
  // Parameters that got no gradient in this backward (every rank runs the same graph, so the same
  // ones on every rank): send what .grad holds, or zeros.
  std::vector<bool> had_grad(params_.size(), true);
  for (auto& bucket : buckets_) {
    if (bucket.pending) continue;
    for (size_t i : bucket.members) {
      if (seen_[i]) continue;
      if (params_[i].grad().defined()) slot(i).copy_(params_[i].grad());
      else {
        slot(i).zero_();
        had_grad[i] = false;
      }
    }
    launch(bucket);
  }
  for (auto& bucket : buckets_) {
    bucket.pending->wait();
    bucket.pending.reset();
    bucket.ready = 0;
  }
  // Sum -> mean once per bucket, then one copy per parameter.
  const double scale = 1.0 / group_.world_size();
  if (scale != 1.0)
    for (auto& bucket : buckets_) bucket.flat.mul_(scale);
  for (size_t i = 0; i < params_.size(); ++i) {
    seen_[i] = false;
    if (!had_grad[i]) continue;  // stays without a gradient, as in a single process
    auto& p = params_[i];
    if (p.grad().defined()) p.mutable_grad().copy_(slot(i));
    else p.mutable_grad() = slot(i).clone();
  }
}

}  // namespace linearize

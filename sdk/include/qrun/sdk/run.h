// qrun/sdk/run.h - the kinds that distribute or observe a run: transport, sharding, profiler.
//
// Note [Ranks and global batches]
// A run of world size W is W processes (ranks), launched the torchrun way (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), the SLURM way, or by
// `qrun --nproc-per-node W`. Every rank reads the same deterministic stream of micro-batches; an
// optimizer step takes train.grad_accum of them (the global batch, the same for any W that
// divides it) and each rank runs its share, chosen to balance real tokens. The loss is normalised
// by the loss tokens of the whole global batch, so W ranks compute exactly the gradient one
// process computes for the same step, and a checkpoint written by N ranks resumes on M.
//
// Added in SDK 1 (profiler), SDK 4 (transport, the sharding interface below; the first cut of
// SDK 1 was never implemented).
#pragma once

#include <qrun/sdk/component.h>
#include <qrun/sdk/model.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace qrun {

// Where this process sits among the ranks.
struct DistributedEnv {
  int rank = 0;
  int local_rank = 0;        // index on this node: picks the GPU
  int world_size = 1;
  int local_world_size = 1;  // ranks on this node
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "single process";  // "torchrun", "SLURM", "qrun --nproc-per-node"
  // torchrun's agent already serves the TCPStore on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE):
  // every rank is a client, under the prefix of the agent's restart count.
  bool agent_store = false;
  int restart_count = 0;
  bool distributed() const { return world_size > 1; }
};

// A collective in flight. wait(): on CUDA, the current stream waits for it (no host sync); on the
// CPU, returns when it is done. Destroying an unwaited work waits for it.
class CommWork {
 public:
  virtual ~CommWork() = default;
  virtual void wait() = 0;
};

// Collectives over the ranks of a run, on tensors of the run's device. Tensors are contiguous;
// every rank calls the same collectives in the same order with the same shapes and dtypes.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // t <- sum over ranks of t, in place.
  virtual std::unique_ptr<CommWork> all_reduce_sum(at::Tensor& t) = 0;
  // out [W * n] <- the ranks' in [n], in rank order.
  virtual std::unique_ptr<CommWork> all_gather(at::Tensor& out, const at::Tensor& in) = 0;
  // out [n] <- sum over ranks of chunk `rank` of in [W * n].
  virtual std::unique_ptr<CommWork> reduce_scatter_sum(at::Tensor& out, const at::Tensor& in) = 0;
  // t <- root's t.
  virtual std::unique_ptr<CommWork> broadcast(at::Tensor& t, int root) = 0;
  // Returns when every rank has called it (host-side).
  virtual void barrier() = 0;
};

// Connects the ranks of a run: c10d's TCPStore rendezvous and a process group (ProcessGroupNCCL
// on GPUs). The host picks the transport for the run's device; recipes do not name one.
class Transport : public Component {
 public:
  static constexpr const char* kKind = "transport";
  // Empty when it connects ranks whose tensors live on `device`; else one sentence why not.
  virtual std::string unsupported(c10::DeviceType device) const = 0;
  // Rendezvous and the process group; `device` is this rank's device. Throws UserError when the
  // rendezvous fails (the master address unreachable, the port taken) within `timeout_s`.
  virtual std::unique_ptr<Communicator> connect(const DistributedEnv& env, const c10::Device& device,
                                                double timeout_s) = 0;
};

// The optimizer's view of one tensor a rank updates.
struct ShardedParam {
  std::string name;   // the model's parameter name, or "<unit>/<dtype>/shard" for a flat shard
  at::Tensor tensor;  // a leaf whose .grad holds the global gradient after finish_gradients()
  // A flat shard: the length of the whole (unpadded) flat group it is part of; rank r holds
  // elements [r * tensor.numel(), (r + 1) * tensor.numel()) of it, zero-padded past the end.
  // 0: the tensor is a whole parameter, the same on every rank.
  int64_t full_numel = 0;
};

// Places parameters, gradients and optimizer state across ranks (none, ddp, fsdp2).
class Sharding : public Component {
 public:
  static constexpr const char* kKind = "sharding";
  // Once, after Model::build(), before the optimizer: takes over the model's parameters and
  // returns what this rank's optimizer updates. `comm` is null for a single process.
  virtual std::vector<ShardedParam> wrap(Model& model, Communicator* comm) = 0;
  // Before each micro-batch's forward; `last`: the step's last micro-batch on this rank (the one
  // whose backward reduces the gradients).
  virtual void begin_micro_batch(bool last) = 0;
  // After the step's last backward: every ShardedParam's .grad is the sum over ranks of the
  // gradients (pending collectives waited for).
  virtual void finish_gradients() = 0;
  // Sum of squares of this rank's part of the gradients, for the global norm (the host adds the
  // ranks' values): every rank's full gradients for replicated parameters count once overall.
  virtual at::Tensor grad_square_sum() = 0;
  // After the optimizer stepped: make the model's parameters the updated ones where they are
  // copies (nothing for none/ddp).
  virtual void after_optimizer_step() = 0;
  // The model's full parameters, one at a time in the model's order, for a consolidated
  // checkpoint; `fn` runs on every rank (collectives inside), with the full tensor on rank 0
  // (undefined elsewhere).
  virtual void for_each_full_parameter(
      const std::function<void(const std::string& name, const at::Tensor& full)>& fn) = 0;
  // Bytes per rank for parameters, gradients and optimizer state of a model with `numel`
  // parameters of `param_bytes` each (AdamW: two states of `state_bytes`, masters of 4 bytes when
  // `master`), for the memory model printed at start.
  struct Memory {
    double params = 0, grads = 0, optimizer = 0;
  };
  virtual Memory memory_per_rank(double numel, int param_bytes, int state_bytes, bool master,
                                 int world_size) const = 0;
};

struct StepRecord {
  int64_t step = 0;
  double seconds = 0;        // wall time of the step
  int64_t real_tokens = 0;
  int64_t padding_tokens = 0;
  int64_t loss_tokens = 0;
  double loss = 0;
};

// Observes steps. Called on the main thread around each optimizer step.
class Profiler : public Component {
 public:
  static constexpr const char* kKind = "profiler";
  // `run_dir`: where the profiler may write files (traces, tables).
  virtual void on_run_start(const std::string& run_dir) = 0;
  virtual void on_step_begin(int64_t step) = 0;
  virtual void on_step_end(const StepRecord& record) = 0;
  virtual void on_run_end() = 0;
  // Added in SDK 2. Extra per-step metrics, asked for right after on_step_end(): the host adds
  // each (name, value) to that step's metrics.jsonl line and to TensorBoard (tag "train/<name>",
  // like its own metrics). NaN means "not available": null in the JSON, no TensorBoard point.
  // Names are lowercase snake_case and must not repeat the host's own metric names.
  virtual std::vector<std::pair<std::string, double>> step_metrics() { return {}; }
};

}  // namespace qrun

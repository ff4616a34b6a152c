// framework/session.h - what a training run and a benchmark share: the components a recipe
// builds (in dependency order), the device and what is known about it, and one optimizer step.
#pragma once

#include "optimizer.h"
#include "recipe.h"
#include "registry.h"

#include <qrun/sdk/batch.h>
#include <qrun/sdk/data.h>
#include <qrun/sdk/kernels.h>
#include <qrun/sdk/model.h>
#include <qrun/sdk/ops.h>
#include <qrun/sdk/run.h>

#include <c10/core/Device.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace qrun {

c10::Device pick_device(const Config& run);

// What the device is, for reports and MFU. `peak_flops`: dense bf16 FLOP/s from
// train.peak_tflops when set, else from the table of known devices (known_peak_tflops), else NaN
// (MFU is then reported as null, never guessed).
struct DeviceInfo {
  std::string name;          // "NVIDIA H200", "cpu"
  std::string driver;        // "13.0" (CUDA driver API version), "" on CPU
  std::string cuda_runtime;  // the CUDA runtime LibTorch runs with, "" on CPU
  double peak_flops = std::nan("");
  double memory_bytes = 0;   // the device's memory (0: unknown, or the CPU)
  std::string peak_source;   // "train.peak_tflops", "device table (H200)", "unknown device"
};
DeviceInfo device_info(const c10::Device& device, const Config& train);
// Dense bf16 tensor-core TFLOP/s of a device by its name, NaN when the name is not in the table.
double known_peak_tflops(const std::string& device_name, std::string* matched = nullptr);

void reset_peak_device_memory(const c10::Device& d);
// {allocated, reserved} peaks in MiB since the last reset.
std::pair<double, double> peak_device_memory_mib(const c10::Device& d);

// Everything a step needs, built from the recipe: kernels, then the model (on the device), the
// data components and the profilers. The dataset is optional only for benchmarks that bring
// their own data (none do today: `bench --synthetic` names the synthetic dataset plugin).
struct Session {
  const Recipe& recipe;
  const Registry& registry;
  std::filesystem::path run_dir;
  c10::Device device = c10::Device(c10::kCPU);
  std::unique_ptr<Attention> attention;
  std::unique_ptr<LinearAttention> linear_attention;
  std::unique_ptr<Conv1d> conv1d;
  std::unique_ptr<Ops> ops;            // the recipe's kernels.ops backend
  std::unique_ptr<Ops> reference_ops;  // the reference ops under it (Note [Ops per operation])
  OpTable op_table;                    // what the model calls: each operation and its provider
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatFormat> chat;
  std::unique_ptr<Dataset> dataset;
  std::unique_ptr<Collator> collator;
  std::vector<std::unique_ptr<Profiler>> profilers;
  double build_seconds = 0;  // building the model (initialisation or checkpoint load)
  // The ranks (sdk run.h, Note [Ranks and global batches]): this process's place, the collectives
  // (null for one process) and the sharding (null when none is installed: one process, the model's
  // parameters are the optimizer's).
  DistributedEnv env;
  std::unique_ptr<Transport> transport;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Sharding> sharding;
  std::vector<ShardedParam> optimized;  // what this rank's optimizer updates

  Session(const Recipe& r, const Registry& reg);
  bool is_rank0() const { return env.rank == 0; }
  DataContext data_context() const;
  // The evaluation data: data.eval_dataset, else the training data (as `qrun eval`).
  const char* eval_path() const;
  std::vector<std::pair<std::string, at::Tensor>> trainable_parameters() const;
  AdamWOptions adamw_options() const;
  // The step's optimizer kernels from the recipe's ops backend where it provides them and the
  // run is on CUDA (sdk ops.h AdamWStep and SquareSum): `opt` gets the AdamW step, `square_sum`
  // is set for the gradient norm; else LibTorch's fused AdamW and _foreach_norm. Logs which.
  void pick_step_kernels(AdamW& opt);
  op::SquareSum::Fn square_sum;  // empty: LibTorch's _foreach_norm
  std::string square_sum_name = "libtorch _foreach_norm";
};

// One optimizer step over `micro` (its micro-batches, CPU tensors):
//   forward + backward of each, the loss of each scaled by 1 / (loss tokens of the whole step),
//   so N micro-batches give exactly the gradient of one batch of the same samples;
//   the global gradient norm, clipping to `clip` (0 = off), the NaN/Inf guard;
//   when finite, AdamW at `lr` and zeroed gradients (not finite: the gradients stay for the
//   caller to report and zero). One host read per step (loss and norm together); on CUDA the
//   step ends synchronised, so its wall time is its GPU time.
struct StepOutcome {
  double loss = std::nan("");  // mean over the loss tokens; NaN without loss tokens
  double grad_norm = 0;
  bool finite = true;
  int64_t loss_tokens = 0, real = 0, pad = 0;
  std::vector<int64_t> seq_lens, sample_ids;
  bool stop = false;  // some rank asked to stop after this step
};
// `micro`: the whole global batch of the step (every rank's micro-batches, the same on every
// rank); this rank runs its share (rank_share) and the outcome is global: the loss over every
// micro-batch, the norm of the summed gradients, the counts of the whole batch. `stop_requested`
// (this rank got SIGINT/SIGTERM) is agreed on by all ranks: StepOutcome::stop.
StepOutcome train_step(Session& s, AdamW& opt,
                       const std::vector<std::pair<std::string, at::Tensor>>& trainable,
                       const std::vector<Batch>& micro, double clip, double lr, bool stop_requested = false);

// The indices of `micro` that `rank` of `world` runs: the largest batches (by real tokens) first,
// each to the rank with the fewest tokens so far among those with fewer than their equal share of
// batches. The same on every rank.
std::vector<size_t> rank_share(const std::vector<Batch>& micro, int rank, int world);

// The hints of a CUDA out-of-memory error, naming the recipe's own settings where it has them.
std::string oom_hints(const Recipe& r);

}  // namespace qrun

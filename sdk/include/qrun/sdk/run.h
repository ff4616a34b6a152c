// qrun/sdk/run.h - the kinds that observe or distribute a run: sharding and profiler.
//
// Added in SDK 1. The sharding interface is the first cut for `none`, `ddp` and `fsdp2`; it will
// grow with them (an ABI bump, see plugin.h).
#pragma once

#include <qrun/sdk/component.h>
#include <qrun/sdk/model.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace qrun {

// Where this process sits among the ranks (torchrun / SLURM conventions).
struct DistributedEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

// Places parameters, gradients and optimizer state across ranks.
class Sharding : public Component {
 public:
  static constexpr const char* kKind = "sharding";
  virtual void setup(const DistributedEnv& env) = 0;
  // Called once after Model::build(); may replace parameters by shards.
  virtual void wrap(Model& model) = 0;
  // Called after backward, before the optimizer step: make gradients the global ones.
  virtual void reduce_gradients(Model& model) = 0;
  // Sum of a scalar over ranks (token counts, losses for logging).
  virtual double all_reduce_sum(double value) = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
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

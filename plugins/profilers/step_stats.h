// plugins/profilers/step_stats.h - `step-stats`: the counts that exposed the seed's 6x slowdown,
// for every step:
//   cpu_ops      ATen operator calls on the CPU side (an at::RecordFunction callback counts every
//                FUNCTION-scope call on any thread between step begin and end: forward, backward
//                and optimizer; the autograd engine's device threads included)
//   gpu_kernels  GPU kernels launched (a CUDA-only Kineto session per step)
//   gpu_busy     the union of the kernels' device intervals / the step's wall time
// Where no GPU can be profiled (a CPU machine, `gpu: false`, or a step torch-profiler is
// recording) the GPU numbers are n/a (null in metrics.jsonl), never zeros.
// With `kernel_table: true` each traced step also writes <run.dir>/kernels-step-<N>.tsv (every
// kernel by name: launches, total device time).
// The numbers go into each step's metrics (Profiler::step_metrics), one row per step into
// <run.dir>/step_stats.tsv, and a summary (mean/min/max) to the log at the end of the run.
#pragma once

#include <qrun/sdk.h>

#include "kineto_session.h"

#include <ATen/record_function.h>

#include <cstdio>
#include <vector>

namespace qrun_profilers {

class StepStats : public qrun::Profiler {
 public:
  explicit StepStats(const qrun::Config& c);
  ~StepStats() override;
  void on_run_start(const std::string& run_dir) override;
  void on_step_begin(int64_t step) override;
  void on_step_end(const qrun::StepRecord& record) override;
  void on_run_end() override;
  std::vector<std::pair<std::string, double>> step_metrics() override;

 private:
  void stop_callback();
  void write_kernel_table(int64_t step, const kp::ProfilerResult& result);
  bool gpu_wanted_;
  bool kernel_table_;
  std::string run_dir_;
  bool gpu_ = false;             // this run profiles GPU kernels
  bool tracing_step_ = false;    // a Kineto session is open for the current step
  bool in_step_ = false;
  at::CallbackHandle handle_ = 0;
  std::FILE* table_ = nullptr;
  std::string table_path_;
  double cpu_ops_ = 0, kernels_ = 0, busy_ = 0;  // the last step's numbers (NaN = n/a)
  std::vector<double> all_ops_, all_kernels_, all_busy_;
};

}  // namespace qrun_profilers

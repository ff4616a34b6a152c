// plugins/profilers/torch_profiler.h - `torch-profiler`: LibTorch's Kineto profiler driven by the
// seed's schedule. Steps are counted from the first step of the run (of this process):
//
//   | wait | warmup | active | wait | warmup | active | ...   (`repeat` cycles; 0 = no limit)
//
// During warm-up the profiler is prepared (Kineto initialised, nothing kept); during the active
// steps it records CPU operators (and CUDA kernels, memcpys and runtime calls when a GPU is there).
// After the last active step of cycle N it writes, under <run.dir>/profiler/:
//   trace-<N>.json         Chrome trace (chrome://tracing, ui.perfetto.dev)
//   key_averages-<N>.txt   the key-averages table sorted by `sort_by`, `row_limit` rows
// and prints the table to the log. A run that ends inside a window saves what it recorded.
#pragma once

#include "kineto_tables.h"

#include <qrun/sdk.h>

#include <ATen/record_function.h>

#include <memory>

namespace qrun_profilers {

class TorchProfiler : public qrun::Profiler {
 public:
  explicit TorchProfiler(const qrun::Config& c);
  ~TorchProfiler() override;
  void on_run_start(const std::string& run_dir) override;
  void on_step_begin(int64_t step) override;
  void on_step_end(const qrun::StepRecord& record) override;
  void on_run_end() override;

 private:
  enum class Phase { None, Warmup, Record, RecordLast };
  Phase phase(int64_t n) const;
  void start_recording();
  void stop_and_save();

  int64_t wait_, warmup_, active_, repeat_, row_limit_;
  SortKey sort_;
  bool record_shapes_, print_table_;
  std::string dir_;
  int64_t steps_done_ = 0;  // steps completed since the run started
  bool in_step_ = false;
  bool prepared_ = false, recording_ = false;
  int64_t cycle_ = 0, first_step_ = 0, last_step_ = 0;
  std::unique_ptr<at::RecordFunction> step_range_;  // "ProfilerStep#<step>" in the trace
};

}  // namespace qrun_profilers

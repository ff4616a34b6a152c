// plugins/profilers/kineto_tables.h - what the two profilers compute from Kineto's events.
//
// LibTorch's C++ API returns the raw events of a profiling window (ProfilerResult::events());
// PyTorch's key_averages() and the kernel counts live in Python. These functions redo the part we
// need in C++, on plain records (KeyEvent) so that they are unit-testable without a profiler.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qrun_profilers {

// One event of a profiling window, reduced to what the tables need.
struct KeyEvent {
  enum class Kind { CpuOp, GpuKernel, GpuOther, Ignored };
  Kind kind = Kind::Ignored;
  std::string name;
  uint64_t thread = 0;         // CPU events: the thread that ran them
  uint64_t start_ns = 0, end_ns = 0;
  uint64_t correlation = 0;    // CPU ops: the id GPU work launched inside them refers to
  uint64_t linked = 0;         // GPU work: the correlation id of the CPU op that launched it
};

// One row of the key-averages table: events aggregated by name (PyTorch's key_averages()).
struct KeyAverage {
  std::string name;
  int64_t calls = 0;
  double self_cpu_us = 0, cpu_total_us = 0;    // self = minus the time of nested ops
  double self_cuda_us = 0, cuda_total_us = 0;  // device time of work launched by the op (total:
                                               // including nested ops); a kernel row: its own
};

enum class SortKey { SelfCpu, CpuTotal, SelfCuda, CudaTotal, Calls };
SortKey parse_sort_key(const std::string& name);  // the torch-profiler `sort_by` choices

// Aggregates the events by name; CPU ops nest per thread by their intervals.
std::vector<KeyAverage> key_averages(const std::vector<KeyEvent>& events);

// Sorted by `key` (largest first, ties by name), at most `row_limit` rows, as a text table.
// `with_cuda`: show the CUDA columns (only when the window had GPU work).
std::string format_table(std::vector<KeyAverage> rows, SortKey key, int64_t row_limit, bool with_cuda);

// Nanoseconds during which at least one of the intervals was running (their union's length).
uint64_t busy_ns(std::vector<std::pair<uint64_t, uint64_t>> intervals);

}  // namespace qrun_profilers

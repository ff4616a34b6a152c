// plugins/profilers/kineto_session.h - the LibTorch Kineto profiler as both components use it.
//
// Kineto runs one session per process at a time. torch-profiler owns it while its schedule is
// in warm-up or recording; step-stats opens a short CUDA-only session per step otherwise, and
// reports that step's GPU numbers as n/a when torch-profiler holds it.
#pragma once

#include "kineto_tables.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <set>
#include <vector>

namespace qrun_profilers {

namespace kp = torch::autograd::profiler;

// True while torch-profiler holds the Kineto session (prepared or recording).
bool& kineto_held_by_torch_profiler();

// True while step-stats traces the current step. Kept here rather than asked of LibTorch:
// isProfilerEnabledInMainThread() does not see step-stats' CUDA-only session, and preparing a
// second session while it runs cancels it (seen on the GPU: the step's disableProfiler() then
// fails with "Can't disable Kineto profiler when it's not running").
bool& kineto_traced_by_step_stats();

// Whether a CUDA device can be profiled (false on CPU-only machines and builds).
bool cuda_available();

std::set<torch::profiler::impl::ActivityType> activities(bool cpu, bool cuda);

kp::ProfilerConfig kineto_config(bool record_shapes);

// The events of a finished window in the form kineto_tables.h works on.
std::vector<KeyEvent> key_events(const kp::ProfilerResult& result);

}  // namespace qrun_profilers

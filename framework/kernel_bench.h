// framework/kernel_bench.h - `qrun check --bench <kind>/<name>`: a kernel backend timed against the
// reference of its kind (and, for attention, against LibTorch's SDPA per sample) at the 27B
// layer shapes on the GPU: forward and forward + backward milliseconds (median, host clock around
// a device sync) and the peak memory a forward + backward adds. A benchmark, not a test: it
// asserts nothing and CI never runs it.
#pragma once

#include "registry.h"

#include <string>
#include <vector>

namespace qrun {

int run_kernel_bench(const std::vector<std::string>& args, const Registry& registry);

}  // namespace qrun

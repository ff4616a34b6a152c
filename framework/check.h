// framework/check.h - `qrun check <kind>/<name>...`: the conformance suite of the kernel kinds.
//
// Runs an installed backend against the reference of its kind (attention -> sdpa,
// linear_attention -> gdn-reference, conv1d -> conv-reference, ops -> reference) over a grid of
// shapes, forward and backward. For the kinds that see sample boundaries every case runs the
// backend on a packed stream and on a right-padded batch and compares both with the reference run
// on each sample alone, so a backend that leaks state, attention or conv taps across samples
// fails. fp32 on CPU; on CUDA (when available) fp32 and bf16 with looser tolerances.
// Prints a pass/fail table with the worst errors (max |backend - reference| / max |reference|).
#pragma once

#include "registry.h"

#include <string>
#include <vector>

namespace qrun {

// args: one or more "kind/name". Returns 0 when every case of every backend passes, 2 when one
// fails (a bad plugin) or an argument names no installed backend.
int run_check(const std::vector<std::string>& args, const Registry& registry);

}  // namespace qrun

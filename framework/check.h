// framework/check.h - `qrun check <kind>/<name>...`: the conformance suite of the kernel kinds.
//
// Runs an installed backend against the reference of its kind (attention -> sdpa,
// linear_attention -> gdn-reference, conv1d -> conv-reference, ops -> reference) over a grid of
// shapes, forward and backward. For the kinds that see sample boundaries every case runs the
// backend on a packed stream and on a right-padded batch and compares both with the reference run
// on each sample alone, so a backend that leaks state, attention or conv taps across samples
// fails. Settings: fp32 on CPU; on CUDA (when available) fp32 and bf16. fp32 errors are
// max |backend - reference| / max |reference|; bf16 errors are norm-wise and count only what lies
// beyond the bf16 rounding of the stored result (check.cpp, Note [Error metrics]); every kind is
// held to 2e-3 there. On CUDA the grids include the 27B shapes (QRUN_CHECK_SMALL=1: not). A
// setting the backend refuses (unsupported(), or a UserError from a first call: a CUDA-only or
// bf16-only kernel) is listed as unsupported with the backend's message, unless it was asked for
// with --device/--dtype; a check in which no setting ran fails. An ops backend is judged on the
// operations it provides; the others are named as left to the reference.
// Options (anywhere among the arguments): --device cpu|cuda, --dtype fp32|bf16, --seed N|random
// (default 1234; the seed is printed so a failure replays), --set key=value (repeatable: a scalar
// setting of every backend under test, spelled and checked as in a recipe; the reference keeps
// its defaults).
#pragma once

#include "registry.h"

#include <string>
#include <vector>

namespace qrun {

// args: one or more "kind/name" and the options above. Returns 0 when every case of every backend passes, 2 when one
// fails (a bad plugin) or an argument names no installed backend.
int run_check(const std::vector<std::string>& args, const Registry& registry);

}  // namespace qrun

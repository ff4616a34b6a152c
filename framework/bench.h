// framework/bench.h - `qrun bench` and `qrun compare`: measuring a recipe's training step.
//
//   qrun bench <recipe.yaml> [--steps N] [--warmup N] [--synthetic SPEC] [--set k=v ...]
//              [--json FILE] [--profile] [--label NAME]
//   qrun compare <a.yaml> [<b.yaml>] [--set-a k=v ...] [--set-b k=v ...] [--set k=v ...]
//              [--steps N] [--warmup N] [--synthetic SPEC] [--json FILE] [--profile]
//              [--loss-tol X] [--grad-tol X]
//
// bench builds the recipe's model and data as a run does (framework/session.h), takes warm-up
// steps, then N measured steps through the same train_step() as the trainer, then one counting
// step under step-stats (CPU operator calls, GPU kernels, GPU busy; with --profile also the
// step's kernels, grouped and ranked). No checkpoint, no evaluation, and batches are pulled as
// the steps need them (no pass over the whole epoch first). --synthetic replaces data.dataset
// with the synthetic dataset plugin: SPEC is `chat` (log-normal lengths, median 900, sigma 0.75,
// capped at the collator's tokens_per_batch: the mix of ../shared/bench/hf_anchor.py) or the
// plugin's settings as `key=value,key=value` (e.g. `lengths=fixed,median=8192`).
// The report is printed, written as JSON (default <run.dir>/bench.json) and plotted next to it
// as a PNG by scripts/plot_bench.py (matplotlib) when a Python with matplotlib is found.
//
// compare runs A, then B, with the same seed and data, prints both side by side with B/A
// ratios, and judges the numerics: per-step loss difference and gradient-norm difference
// against the tolerances (default 1e-2 absolute loss, 5e-2 relative gradient norm). Exit code 0
// when they agree, 3 when they diverge, 2 for bad input.
#pragma once

#include <string>
#include <vector>

namespace qrun {

int run_bench_command(const std::vector<std::string>& args);
int run_compare_command(const std::vector<std::string>& args);

// The kernel group a GPU kernel's name belongs to (GEMM, attention, gated delta, ...), for the
// profile table and the plot. Exposed for tests.
std::string kernel_group(const std::string& kernel_name);

}  // namespace qrun

// framework/main.cpp - the `qrun` command line.
//
//   qrun <recipe.yaml> [--set a.b=v ...] [--resume]  run (train) a recipe
//   qrun --nproc-per-node N <recipe.yaml> [...]      N ranks of the run on this node
//   qrun validate <recipe.yaml> [--set ...]  check a recipe without running it
//   qrun eval <recipe.yaml> [--set ...]      mean loss and perplexity as JSON
//   qrun check <kind>/<name>                 conformance of a backend against its reference
//   qrun check --bench <kind>/<name>         its time and memory against the reference (GPU)
//   qrun bench <recipe.yaml> [...]           measure the training step (framework/bench.h)
//   qrun compare <a.yaml> [<b.yaml>] [...]   two recipes side by side, numerics judged
//   qrun tokenize --tokenizer DIR [--chat]   token ids (and loss masks) of stdin lines as JSON
//   qrun data inspect <recipe.yaml> [-n N]   the first examples and the collator's statistics
//   qrun plugins list                        what is installed, and what failed to load
//   qrun plugins explain <kind>/<name>       a component's settings with defaults and docs
//   qrun --version                           qrun, LibTorch, CUDA and every plugin's build id
//
// Exit codes: 0 success, 2 bad input (recipe, data, checkpoint, plugin), 1 internal error, 3 compare: the numerics diverged.
// Every failure is one clean message on stderr; library code throws, only main() exits.
#include "commands.h"
#include "host_info.h"
#include "log_backend.h"
#include "recipe.h"

#include <qrun/sdk/error.h>
#include <qrun/sdk/log.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

namespace {

const char* kUsage =
    "usage: qrun <recipe.yaml> [--set key.path=value ...] [--resume]\n"
    "       qrun --nproc-per-node N <recipe.yaml> [...]   N ranks on this node (torchrun's variables)\n"
    "       qrun validate <recipe.yaml> [--set key.path=value ...]\n"
    "       qrun eval <recipe.yaml> [--set key.path=value ...]\n"
    "       qrun check <kind>/<name> [--set key=value ...]   a backend against its kind's reference\n"
    "       qrun check --bench <kind>/<name> [--iters N]     its time and memory at the 27B shapes (GPU)\n"
    "       qrun bench <recipe.yaml> [--steps N] [--warmup N] [--synthetic SPEC] [--set ...] [--json FILE] [--profile]\n"
    "       qrun compare <a.yaml> [<b.yaml>] [--set-a ...] [--set-b ...] [--steps N] [--synthetic SPEC] [--json FILE]\n"
    "       qrun tokenize --tokenizer DIR [--chat]   (text lines or JSONL conversations on stdin)\n"
    "       qrun data inspect <recipe.yaml> [-n N] [--set key.path=value ...]\n"
    "       qrun plugins list\n"
    "       qrun plugins explain <kind>/<name>\n"
    "       qrun --version | --help\n"
    "\n"
    "Environment: QRUN_PLUGIN_PATH (extra plugin folders or files, ':'-separated),\n"
    "             QRUN_LOG_LEVEL (debug, info, warn, error),\n"
    "             RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun)\n"
    "             or SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_NODELIST (srun).\n";

}  // namespace

int main(int argc, char** argv) {
  qrun::init_logging();
  qrun::detail::log_sink() = &qrun::log_write;

  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
      std::fputs(kUsage, args.empty() ? stderr : stdout);
      return args.empty() ? 2 : 0;
    }
    return qrun::dispatch(args);
  } catch (const qrun::RecipeError& e) {
    // Diagnostics already start with their location, compiler-style: no prefix.
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const qrun::Error& e) {
    std::fprintf(stderr, "qrun: %s%s\n", e.is_user_error() ? "" : "internal error: ", e.what());
    return e.is_user_error() ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qrun: internal error: %s\n", e.what());
    return 1;
  }
}

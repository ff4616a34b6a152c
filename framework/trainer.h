// framework/trainer.h - the host's main job: train a recipe's model on its data.
//
// Promises (tests/trainer): gradient accumulation of N micro-batches equals one batch of the same
// samples; checkpoints are atomic (checkpoint.h) and hold the model as Hugging Face safetensors
// (model/), the parameters, optimizer and RNG state (trainer.pt), the data cursor and collator
// state (state.json) and the resolved recipe; a resumed run reproduces the uninterrupted run's
// per-step losses on CPU; SIGINT/SIGTERM finish the current step, save a checkpoint and exit 0.
// Per-step metrics go to <run.dir>/metrics.jsonl.
#pragma once

#include "recipe.h"
#include "registry.h"

namespace qrun {

// Returns the exit code. `resume`: continue from the newest complete checkpoint.
int train(const Recipe& recipe, const Registry& registry, bool resume);

// Mean loss and perplexity over data.eval_dataset (else data.dataset), printed as one JSON line.
int evaluate(const Recipe& recipe, const Registry& registry);

}  // namespace qrun

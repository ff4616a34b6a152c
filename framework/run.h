// framework/run.h - running a validated recipe.
#pragma once

#include "recipe.h"
#include "registry.h"

namespace qrun {

// Builds every component the recipe names and runs it. Returns the exit code.
int run_recipe(const Recipe& recipe, const Registry& registry, bool resume = false);

}  // namespace qrun

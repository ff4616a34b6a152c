// framework/kernel_check.h - the recipe's kernel backends against the model, before any weight is
// loaded (sdk kernels.h, Note [What a backend can run]), and the table of operations the model
// receives (sdk ops.h, Note [Ops per operation]).
#pragma once

#include "kernel_backend.h"
#include "recipe.h"
#include "registry.h"

#include <qrun/sdk/kernels.h>
#include <qrun/sdk/model.h>
#include <qrun/sdk/ops.h>

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace qrun {

// The device a recipe's run.device means for checking: cuda -> CUDA (whether or not this machine
// has one: `qrun validate` checks the recipe, not the machine), cpu -> CPU, auto -> what a run
// here would pick.
c10::DeviceType recipe_device_type(const Config& run);
c10::ScalarType recipe_compute_dtype(const Recipe& r);

// Checks every kernel use of `model` against the backend the recipe names for its kind
// (`backends`: kind -> the created component, absent when the recipe has none), for each layout
// in `layouts`. Throws RecipeError with one diagnostic per problem, located where the recipe
// names the backend, naming the backends of that kind that can run the use.
void check_kernel_uses(const Recipe& r, const Registry& reg, const Model& model,
                       const std::map<std::string, const KernelBackend*>& backends,
                       c10::DeviceType device, c10::ScalarType dtype,
                       const std::vector<Layout>& layouts);

// The layouts a recipe's collator makes (both when it does not say).
std::vector<Layout> recipe_layouts(const Recipe& r, const Registry& reg);

// The operations a model gets: the reference ops (when installed), then the recipe's ops backend
// over them. `reference` keeps the reference backend alive beside the recipe's.
OpTable compose_ops(const Recipe& r, const Registry& reg, Ops* recipe_ops,
                    std::unique_ptr<Ops>& reference);

// Validates the kernels of a recipe with a model without building it: creates the kernel
// components and the model component (no weights), then check_kernel_uses(). For `qrun validate`.
void validate_kernels(const Recipe& r, const Registry& reg);

}  // namespace qrun

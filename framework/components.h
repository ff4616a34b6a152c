// framework/components.h - creating the component a recipe path names, with the recipe as context.
#pragma once

#include "recipe.h"
#include "registry.h"

namespace qrun {

template <typename T>
std::unique_ptr<T> make_component(const Recipe& r, const Registry& reg, const std::string& path) {
  const ComponentSpec* c = r.component(path);
  QRUN_CHECK(c != nullptr, "{}: this run needs {} in the recipe", r.file, path);
  try {
    return reg.create<T>(c->name, c->config);
  } catch (Error& e) {
    e.add_context(fmt::format("while creating {} '{}' ({})", path, c->name, r.file));
    throw;
  }
}

}  // namespace qrun

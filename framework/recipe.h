// framework/recipe.h - loading and validating a recipe.
//
// A recipe is one YAML file naming every part of a run and its settings. The host validates the
// whole file against the recipe layout (this file's .cpp) and against the schema of every
// component it names, *before any work starts*, and reports every problem at once, each with
// `file:line:col`, the bad value, what is allowed and the nearest valid name. `--set a.b=v`
// overrides are applied to the YAML tree first and go through the same validator; their
// problems are located as `--set a.b=v`.
#pragma once

#include "registry.h"

#include <qrun/sdk/config.h>

#include <yaml-cpp/yaml.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace qrun {

struct Diagnostic {
  std::string location;  // "recipe.yaml:14:5", "--set a.b=v", or "recipe.yaml"
  std::string message;
};

// Thrown with every problem found; what() lists them one per line.
class RecipeError : public UserError {
 public:
  RecipeError(const std::string& file, std::vector<Diagnostic> diags);
  const std::vector<Diagnostic>& diagnostics() const { return diags_; }

 private:
  std::vector<Diagnostic> diags_;
};

// One component instance the recipe asks for.
struct ComponentSpec {
  std::string path;      // where in the recipe: "model", "kernels.attention", "profiler[1]"
  std::string kind;
  std::string name;      // registered component name
  Config config;         // validated settings, defaults filled in
  const RegistryEntry* entry = nullptr;
  std::string location;  // where the recipe names it ("recipe.yaml:4:22", "--set ...", or
                         // "kernels.ops (default)" for a slot filled by its default)
};

class Recipe {
 public:
  std::string file;                                  // as given on the command line
  std::map<std::string, Config> sections;            // host sections ("run", ...)
  std::map<std::string, ComponentSpec> components;   // by path
  std::vector<ComponentSpec> profilers;              // the `profiler:` list, in order

  const ComponentSpec* component(const std::string& path) const {
    auto it = components.find(path);
    return it == components.end() ? nullptr : &it->second;
  }
  const Config& section(const std::string& name) const { return sections.at(name); }

  // The fully resolved recipe: every default filled in, each component annotated with the
  // plugin library, version and build id that provides it. Loads back as an equivalent recipe.
  // `op_providers` (operation, backend), when given, is written as a comment under kernels: which
  // backend each operation of kernels.ops comes from (sdk ops.h).
  std::string resolved_yaml(const std::vector<std::pair<std::string, std::string>>& op_providers = {}) const;
};

// Parses `--set a.b=v` into (path, value text). Throws UserError for a malformed override.
std::pair<std::string, std::string> parse_override(const std::string& text);

// Loads, applies overrides, validates. Throws RecipeError (exit code 2) listing every problem.
Recipe load_recipe(const std::string& file, const std::vector<std::string>& overrides,
                   const Registry& registry);

// The same from text already in memory (`file` names it in messages); used by the fuzzer.
Recipe load_recipe_text(const std::string& text, const std::string& file,
                        const std::vector<std::string>& overrides, const Registry& registry);

// Validates one component's settings (a YAML map without the `plugin` key handled by the
// caller) against a schema; used by the recipe loader and by `qrun check`.
Config validate_settings(const std::string& path, const Schema& schema, const YAML::Node& map,
                         const std::string& file, std::vector<Diagnostic>& diags);

}  // namespace qrun

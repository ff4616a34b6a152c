// framework/commands.cpp - argument parsing and the small subcommands (validate, plugins, version).
// The argument grammar is small and positional (`qrun <recipe>` with no verb), which argument
// libraries model awkwardly, so it is parsed by hand here with "did you mean" for unknown flags.
#include "commands.h"

#include "bench.h"
#include "check.h"
#include "data_commands.h"
#include "distributed.h"
#include "host_info.h"
#include "kernel_bench.h"
#include "kernel_check.h"
#include "plugin_loader.h"
#include "recipe.h"
#include "registry.h"
#include "run.h"
#include "trainer.h"
#include "text.h"

#include <qrun/sdk/ops.h>
#include <qrun/sdk/plugin.h>

#include <cstdio>
#include <iostream>

namespace qrun {
namespace {

struct RecipeArgs {
  std::string recipe;
  std::vector<std::string> overrides;
  std::map<std::string, std::string> options;  // --name value
};

// Parses `<recipe.yaml> [--set k=v]... [--opt value]...`; `value_options` lists the accepted
// --options that take a value, `flag_options` those that take none.
RecipeArgs parse_recipe_args(const std::string& command, const std::vector<std::string>& args,
                             size_t first, const std::vector<std::string>& value_options = {},
                             const std::vector<std::string>& flag_options = {}) {
  RecipeArgs out;
  std::vector<std::string> known = {"--set"};
  known.insert(known.end(), value_options.begin(), value_options.end());
  known.insert(known.end(), flag_options.begin(), flag_options.end());
  for (size_t i = first; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--set" || a.rfind("--set=", 0) == 0) {
      std::string v;
      if (a == "--set") {
        QRUN_CHECK(i + 1 < args.size(), "{}: --set needs key.path=value", command);
        v = args[++i];
      } else {
        v = a.substr(6);
      }
      out.overrides.push_back(v);
    } else if (a.rfind("--", 0) == 0) {
      std::string name = a.substr(0, a.find('='));
      bool takes_value =
          std::find(value_options.begin(), value_options.end(), name) != value_options.end();
      bool is_flag = std::find(flag_options.begin(), flag_options.end(), name) != flag_options.end();
      QRUN_CHECK(takes_value || is_flag, "{}: unknown option '{}'{}; allowed: {}", command, name,
                 did_you_mean(name, known), join(known));
      if (is_flag) {
        out.options[name] = "true";
      } else if (a.find('=') != std::string::npos) {
        out.options[name] = a.substr(a.find('=') + 1);
      } else {
        QRUN_CHECK(i + 1 < args.size(), "{}: {} needs a value", command, name);
        out.options[name] = args[++i];
      }
    } else {
      QRUN_CHECK(out.recipe.empty(), "{}: more than one recipe given ('{}' and '{}')", command,
                 out.recipe, a);
      out.recipe = a;
    }
  }
  QRUN_CHECK(!out.recipe.empty(), "{}: no recipe given; usage: qrun {}<recipe.yaml> [--set key=value]",
             command, command == "run" ? "" : command + " ");
  return out;
}

int cmd_validate(const std::vector<std::string>& args) {
  RecipeArgs a = parse_recipe_args("validate", args, 1);
  Registry registry;
  load_plugins(registry);
  Recipe r = load_recipe(a.recipe, a.overrides, registry);
  validate_kernels(r, registry);
  std::vector<std::string> parts;
  for (const auto& [path, c] : r.components) parts.push_back(path + "=" + c.name);
  for (const auto& p : r.profilers) parts.push_back(p.path + "=" + p.name);
  std::printf("%s: ok (%s)\n", a.recipe.c_str(), join(parts).c_str());
  return 0;
}

std::string default_text(const Field& f) {
  if (f.required) return "required";
  if (std::holds_alternative<std::monostate>(f.default_value)) return "optional";
  return format_value(f.default_value);
}

int cmd_plugins(const std::vector<std::string>& args) {
  static const std::vector<std::string> verbs = {"list", "explain"};
  QRUN_CHECK(args.size() >= 2, "plugins: expected a verb: {}", join(verbs));
  Registry registry;
  load_plugins(registry);
  const std::string& verb = args[1];
  if (verb == "list") {
    QRUN_CHECK(args.size() == 2, "plugins list: takes no arguments");
    std::printf("%-17s %-22s %-26s %s\n", "KIND", "NAME", "PLUGIN", "SUMMARY");
    for (const RegistryEntry* e : registry.entries()) {
      std::string plugin = fmt::format("{} {}", e->origin->name, e->origin->version);
      std::string summary = e->info.summary;
      if (!e->conflicts.empty()) summary = "CONFLICT: " + registry.conflict_message(*e);
      std::printf("%-17s %-22s %-26s %s\n", e->info.kind.c_str(), e->info.name.c_str(),
                  plugin.c_str(), summary.c_str());
    }
    std::printf("\nplugin libraries:\n");
    for (const auto& o : registry.plugins())
      std::printf("  %s %s (build %s) %s\n", o->name.c_str(), o->version.c_str(),
                  o->build_id.c_str(), o->path.c_str());
    if (!registry.failures().empty()) {
      std::printf("\nfailed to load:\n");
      for (const auto& f : registry.failures())
        std::printf("  %s: %s\n", f.path.c_str(), f.reason.c_str());
    }
    std::printf("\nsearch path: %s\n", join(plugin_search_path(), ":").c_str());
    return 0;
  }
  if (verb == "explain") {
    QRUN_CHECK(args.size() == 3, "plugins explain: expected <kind>/<name>, e.g. collator/packed-collator");
    const std::string& what = args[2];
    size_t slash = what.find('/');
    QRUN_CHECK(slash != std::string::npos, "plugins explain: expected <kind>/<name>, got '{}'", what);
    std::string kind = what.substr(0, slash), name = what.substr(slash + 1);
    const auto& kinds = component_kinds();
    QRUN_CHECK(std::find(kinds.begin(), kinds.end(), kind) != kinds.end(),
               "plugins explain: unknown kind '{}'{}; kinds: {}", kind, did_you_mean(kind, kinds),
               join(kinds));
    const RegistryEntry& e = registry.get(kind, name);
    std::printf("%s/%s: %s\n", kind.c_str(), name.c_str(), e.info.summary.c_str());
    std::printf("provided by %s %s (build %s), %s\n\n", e.origin->name.c_str(),
                e.origin->version.c_str(), e.origin->build_id.c_str(), e.origin->path.c_str());
    if (e.info.schema.fields().empty()) std::printf("  (no settings)\n");
    for (const auto& f : e.info.schema.fields()) {
      std::string type = f.type == FieldType::Enum ? "one of " + join(f.choices, "|")
                                                   : field_type_name(f.type);
      std::string range;
      if (f.min_value || f.max_value)
        range = fmt::format(" in [{}, {}]", f.min_value ? fmt::format("{}", *f.min_value) : "-inf",
                            f.max_value ? fmt::format("{}", *f.max_value) : "inf");
      std::printf("  %-22s %s%s, default: %s\n      %s\n", f.name.c_str(), type.c_str(),
                  range.c_str(), default_text(f).c_str(), f.help.c_str());
    }
    if (kind == Ops::kKind) {
      // Which operations it provides (with its default settings); the rest come from the
      // reference in a run (sdk ops.h, Note [Ops per operation]).
      std::vector<std::string> own, rest;
      try {
        std::map<std::string, Value> v;
        for (const auto& f : e.info.schema.fields()) v[f.name] = f.default_value;
        auto ops = registry.create<Ops>(name, Config("kernels.ops", v));
        OpTable t;
        ops->provide(t, name);
        for (const auto& [op, p] : t.providers()) own.push_back(op);
        if (const RegistryEntry* re = registry.find(Ops::kKind, "reference"); re && name != "reference") {
          OpTable all;
          registry.create<Ops>("reference", Config("kernels.ops", {}))->provide(all, "reference");
          for (const auto& [op, p] : all.providers())
            if (std::find(own.begin(), own.end(), op) == own.end()) rest.push_back(op);
        }
      } catch (const std::exception& ex) {
        own = {fmt::format("(cannot list: {})", ex.what())};
      }
      std::printf("\noperations it provides: %s\n", join(own).c_str());
      if (!rest.empty()) std::printf("from the reference in a run: %s\n", join(rest).c_str());
    }
    return 0;
  }
  throw UserError(fmt::format("plugins: unknown verb '{}'{}; verbs: {}", verb,
                              did_you_mean(verb, verbs), join(verbs)));
}

int cmd_version() {
  Registry registry;
  load_plugins(registry);
  std::printf("%s\n", version_report().c_str());
  for (const auto& o : registry.plugins())
    std::printf("plugin %s %s (build %s, %s)\n", o->name.c_str(), o->version.c_str(),
                o->build_id.c_str(),
                o->cuda_major ? fmt::format("CUDA {}", o->cuda_major).c_str() : "CPU");
  for (const auto& f : registry.failures())
    std::printf("plugin FAILED %s: %s\n", f.path.c_str(), f.reason.c_str());
  return 0;
}

int cmd_run(const std::vector<std::string>& args, size_t first) {
  RecipeArgs a = parse_recipe_args("run", args, first, {}, {"--resume"});
  Registry registry;
  load_plugins(registry);
  Recipe r = load_recipe(a.recipe, a.overrides, registry);
  return run_recipe(r, registry, a.options.count("--resume") > 0);
}

int cmd_eval(const std::vector<std::string>& args) {
  RecipeArgs a = parse_recipe_args("eval", args, 1);
  Registry registry;
  load_plugins(registry);
  Recipe r = load_recipe(a.recipe, a.overrides, registry);
  return evaluate(r, registry);
}

}  // namespace

int dispatch(const std::vector<std::string>& args) {
  static const std::vector<std::string> commands = {"run",      "validate", "eval",    "check",
                                                   "bench",    "compare",  "tokenize", "data",
                                                   "plugins",  "--version"};
  // qrun --nproc-per-node N <command...>: N ranks of the command on this node (distributed.h).
  if (args[0] == "--nproc-per-node" || args[0].rfind("--nproc-per-node=", 0) == 0) {
    std::string n = args[0].size() > 17 ? args[0].substr(17) : "";
    size_t rest = 1;
    if (n.empty()) {
      QRUN_CHECK(args.size() >= 2, "--nproc-per-node needs a number of ranks, then the command");
      n = args[1];
      rest = 2;
    }
    char* end = nullptr;
    const long nproc = std::strtol(n.c_str(), &end, 10);
    QRUN_CHECK(!n.empty() && *end == '\0' && nproc >= 1 && nproc <= 1024,
               "--nproc-per-node '{}' is not a number of ranks in [1, 1024]", n);
    QRUN_CHECK(args.size() > rest, "--nproc-per-node {}: no command to run (e.g. qrun --nproc-per-node {} "
               "recipes/qwen27b_packed.yaml)", n, n);
    return launch_local(static_cast<int>(nproc), {args.begin() + rest, args.end()});
  }
  const std::string& c = args[0];
  if (c == "--version" || c == "version") return cmd_version();
  if (c == "validate") return cmd_validate(args);
  if (c == "plugins") return cmd_plugins(args);
  if (c == "run") return cmd_run(args, 1);
  if (c == "eval") return cmd_eval(args);
  if (c == "bench") return run_bench_command(args);
  if (c == "compare") return run_compare_command(args);
  if (c == "check") {
    Registry registry;
    load_plugins(registry);
    if (std::find(args.begin(), args.end(), "--bench") != args.end())
      return run_kernel_bench({args.begin() + 1, args.end()}, registry);
    return run_check({args.begin() + 1, args.end()}, registry);
  }
  if (c == "tokenize" || c == "data") {
    Registry registry;
    load_plugins(registry);
    if (c == "tokenize") return run_tokenize(args, registry);
    static const std::vector<std::string> verbs = {"inspect"};
    QRUN_CHECK(args.size() >= 2 && args[1] == "inspect", "data: expected a verb: {}{}", join(verbs),
               args.size() >= 2 ? did_you_mean(args[1], verbs) : "");
    return run_data_inspect(args, registry);
  }
  if (c.rfind("-", 0) == 0)
    throw UserError(fmt::format("unknown option '{}'{}; see qrun --help", c, did_you_mean(c, commands)));
  // `qrun <recipe.yaml>`: a path, unless it looks like a misspelt command.
  if (c.find('.') == std::string::npos && c.find('/') == std::string::npos) {
    std::string near = nearest(c, commands);
    if (!near.empty())
      throw UserError(fmt::format("unknown command '{}'; did you mean '{}'? see qrun --help", c, near));
  }
  return cmd_run(args, 0);
}

}  // namespace qrun

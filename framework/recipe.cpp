// framework/recipe.cpp - the recipe layout and its validator (see recipe.h).
//
// Note [Recipe layout]
// The layout below is the single description of which sections a recipe may have. Sections are:
//   * host sections: settings the host itself reads, validated against a Schema;
//   * component slots: `name` or `{plugin: name, <settings>}`, validated against the schema the
//     named component registered;
//   * component lists: a sequence of slots (profilers);
//   * groups: maps of the above.
// A group may carry defaults that apply only when another part of the recipe is present (the
// kernel defaults apply once a model is named), so a recipe never has to spell out the reference
// backends but a data-only recipe does not need them installed.
#include "recipe.h"

#include "text.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace fs = std::filesystem;

namespace qrun {
namespace {

// Indentation columns or open brackets beyond this are not a recipe (and would let a crafted
// file exhaust the parser's stack).
constexpr int kMaxNesting = 200;

struct SectionSpec {
  enum class Type { Host, Slot, List, Group };
  Type type = Type::Host;
  std::string key;
  std::string doc;
  Schema schema;                     // Host
  std::string kind;                  // Slot / List
  std::string default_name;          // Slot: used when absent and the group's condition holds
  std::string required_if;           // Slot: required when this recipe path is present
  bool soft_default = false;         // Slot: a default that is not installed is left out quietly
  std::vector<SectionSpec> children; // Group
  std::string defaults_if;           // Group: path whose presence turns on the children's defaults
};

SectionSpec host(std::string key, std::string doc, Schema schema) {
  SectionSpec s;
  s.type = SectionSpec::Type::Host;
  s.key = std::move(key);
  s.doc = std::move(doc);
  s.schema = std::move(schema);
  return s;
}
SectionSpec slot(std::string key, std::string kind, std::string doc, std::string def = "",
                 std::string required_if = "") {
  SectionSpec s;
  s.type = SectionSpec::Type::Slot;
  s.key = std::move(key);
  s.kind = std::move(kind);
  s.doc = std::move(doc);
  s.default_name = std::move(def);
  s.required_if = std::move(required_if);
  return s;
}
SectionSpec soft(SectionSpec s) {
  s.soft_default = true;
  return s;
}
SectionSpec list(std::string key, std::string kind, std::string doc) {
  SectionSpec s = slot(std::move(key), std::move(kind), std::move(doc));
  s.type = SectionSpec::Type::List;
  return s;
}
SectionSpec group(std::string key, std::string doc, std::vector<SectionSpec> children,
                  std::string defaults_if = "") {
  SectionSpec s;
  s.type = SectionSpec::Type::Group;
  s.key = std::move(key);
  s.doc = std::move(doc);
  s.children = std::move(children);
  s.defaults_if = std::move(defaults_if);
  return s;
}

// See Note [Recipe layout].
const SectionSpec& recipe_layout() {
  static const SectionSpec layout = group(
      "", "recipe",
      {
          host("run", "where and how the run happens",
               Schema{
                   Field::string("name").optional().doc(
                       "run name; defaults to the recipe file's stem"),
                   Field::path("dir").doc("run directory; defaults to runs/<name>"),
                   Field::choice("device", "auto", {"auto", "cpu", "cuda"})
                       .doc("compute device; auto picks cuda when a GPU is present"),
                   Field::integer("seed", 0).min(0).doc("seed of every random choice of the run"),
                   Field::number("dist_timeout_s", 300.0).min(1).doc(
                       "seconds a rank waits at the rendezvous or in a collective before it fails "
                       "(a rank that died makes the others stop within this bound)"),
               }),
          slot("model", "model", "the network: builds it, loads and saves HF checkpoints"),
          soft(slot("sharding", "sharding",
                    "parameters, gradients and optimizer state across ranks (none, ddp, fsdp2)", "none")),
          group("kernels", "the backends the model's layers call",
                {
                    // A model that needs a kernel nobody installed says so when it is built.
                    soft(slot("attention", "attention", "full attention backend", "sdpa")),
                    soft(slot("linear_attention", "linear_attention",
                              "gated delta rule backend", "gdn-reference")),
                    soft(slot("conv1d", "conv1d", "causal depthwise conv backend", "conv-reference")),
                    soft(slot("ops", "ops", "norms, activations and loss", "reference")),
                },
                /*defaults_if=*/"model"),
          group("data", "where examples come from and how they become batches",
                {
                    slot("tokenizer", "tokenizer", "text to token ids", "", "data.dataset"),
                    slot("chat_format", "chat_format", "conversation rendering and loss masks",
                         "chatml"),
                    slot("dataset", "dataset", "training examples"),
                    slot("collator", "collator", "examples to batches", "packed-collator"),
                    slot("eval_dataset", "dataset", "evaluation examples (optional)"),
                },
                /*defaults_if=*/"data.dataset"),
          host("optimizer", "the optimizer (framework/optimizer.h)",
               Schema{
                   Field::choice("name", "adamw", {"adamw"}).doc("optimizer"),
                   Field::number("lr", 1e-5).min(0).doc("peak learning rate"),
                   Field::float_list("betas", {0.9, 0.95}).size(2).min(0).max(0.999999).doc(
                       "Adam betas (beta1, beta2)"),
                   Field::number("eps", 1e-8).min(0).doc("Adam epsilon"),
                   Field::number("weight_decay", 0.0).min(0).doc(
                       "decoupled weight decay, applied to every parameter"),
               }),
          host("schedule", "the learning-rate schedule",
               Schema{
                   Field::choice("name", "cosine", {"constant", "linear", "cosine"})
                       .doc("shape after warm-up"),
                   Field::integer("warmup_steps", 0).min(0).doc("linear warm-up from 0"),
                   Field::number("min_lr_ratio", 0.0).min(0).max(1).doc(
                       "final learning rate as a fraction of the peak"),
               }),
          host("train", "the training loop",
               Schema{
                   Field::integer("epochs", 1).min(1).doc("passes over the dataset"),
                   Field::integer("max_steps", 0).min(0).doc(
                       "stop after this many optimizer steps; 0 = when the epochs end"),
                   Field::integer("grad_accum", 1).min(1).doc("micro-batches per optimizer step"),
                   Field::number("clip_grad_norm", 1.0).min(0).doc(
                       "clip the global gradient norm to this; 0 = off"),
                   Field::choice("on_nonfinite", "halt", {"halt", "skip"})
                       .doc("a NaN/Inf loss or gradient halts the run, or skips the step"),
                   Field::integer("log_every", 1).min(1).doc("log a line every N steps"),
                   Field::number("peak_tflops", 0.0).min(0).doc(
                       "peak FLOP/s of one device for MFU, in TFLOP/s; 0 = known GPUs only"),
                   Field::integer("eval_every", 0).min(0).doc(
                       "evaluate on data.eval_dataset (else data.dataset) every N steps and at "
                       "the end; 0 = never"),
                   Field::integer("eval_batches", 0).min(0).doc(
                       "batches per evaluation; 0 = all of the evaluation data"),
                   Field::boolean("tensorboard", true).doc(
                       "write TensorBoard event files (events.out.tfevents.*) to run.dir"),
               }),
          host("precision", "dtypes of parameters and activations",
               Schema{
                   Field::choice("param", "fp32", {"fp32", "bf16"}).doc("parameter storage dtype"),
                   Field::choice("compute", "fp32", {"fp32", "bf16"}).doc("activation dtype"),
                   Field::boolean("master_weights", false).doc(
                       "keep fp32 master copies of bf16 parameters in the optimizer"),
               }),
          host("checkpoint", "saving and resuming",
               Schema{
                   Field::path("dir").optional().doc("defaults to <run.dir>/checkpoints"),
                   Field::integer("every_steps", 0).min(0).doc(
                       "save every N steps; 0 = only at the end (and on SIGINT/SIGTERM)"),
                   Field::integer("keep", 2).min(1).doc("checkpoints kept (oldest deleted)"),
                   Field::choice("resume", "never", {"never", "auto"}).doc(
                       "auto: continue from the newest complete checkpoint"),
                   Field::boolean("save_final", true).doc(
                       "save a checkpoint at the end of the run (false: only every_steps and on "
                       "SIGINT/SIGTERM; for runs that only measure)"),
               }),
          list("profiler", "profiler", "observers of the training steps"),
      });
  return layout;
}

// yaml-cpp pitfalls avoided below: operator[] on a non-const node inserts, assigning one Node to
// another rebinds or overwrites depending on its state, and a default-constructed Node counts as
// defined. So lookups go through this helper and absence is an Undefined node.
YAML::Node undefined_node() { return YAML::Node(YAML::NodeType::Undefined); }

YAML::Node lookup(const YAML::Node& map, const std::string& key) {
  std::optional<YAML::Node> out;
  if (map.IsDefined() && map.IsMap())
    for (auto it = map.begin(); it != map.end(); ++it)
      if (it->first.IsScalar() && it->first.Scalar() == key) out.emplace(it->second);
  return out ? *out : undefined_node();
}

std::string mark_location(const std::string& file, const YAML::Mark& m) {
  if (m.is_null() || m.line < 0) return file;
  return fmt::format("{}:{}:{}", file, m.line + 1, m.column + 1);
}

std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null: return "nothing (null)";
    case YAML::NodeType::Scalar: return "'" + n.Scalar() + "'";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a mapping";
    default: return "nothing";
  }
}

class Validator {
 public:
  Validator(std::string file, const Registry& registry,
            std::map<std::string, std::string> override_sources)
      : file_(std::move(file)), registry_(registry), overrides_(std::move(override_sources)) {}

  std::vector<Diagnostic> diags;
  Recipe recipe;

  // Where a problem at recipe path `path` (node `n`) is reported: the --set that wrote it, else
  // the node's line:col in the file, else the file.
  std::string loc(const YAML::Node& n, const std::string& path) const {
    std::string best;
    for (const auto& [p, text] : overrides_)
      if ((path == p || path.rfind(p + ".", 0) == 0) && p.size() >= best.size()) best = p;
    if (!best.empty()) return "--set " + overrides_.at(best);
    if (n.IsDefined() && !n.Mark().is_null() && n.Mark().line >= 0) return mark_location(file_, n.Mark());
    return file_;
  }
  void error(const YAML::Node& n, const std::string& path, std::string msg) {
    diags.push_back({loc(n, path), std::move(msg)});
  }

  // Reports keys that appear twice in any mapping (yaml-cpp keeps both silently).
  void check_duplicates(const YAML::Node& n, const std::string& path) {
    if (n.IsMap()) {
      std::map<std::string, YAML::Mark> seen;
      for (auto it = n.begin(); it != n.end(); ++it) {
        std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
        std::string sub = path.empty() ? key : path + "." + key;
        auto [pos, inserted] = seen.emplace(key, it->first.Mark());
        if (!inserted)
          error(it->first, sub,
                fmt::format("duplicate key '{}' (first given at line {}); each key may appear "
                            "once per mapping",
                            key, pos->second.line + 1));
        check_duplicates(it->second, sub);
      }
    } else if (n.IsSequence()) {
      for (size_t i = 0; i < n.size(); ++i)
        check_duplicates(n[i], fmt::format("{}[{}]", path, i));
    }
  }

  bool present(const YAML::Node& root, const std::string& dotted) const {
    YAML::Node cur = root;
    size_t start = 0;
    while (start <= dotted.size()) {
      size_t end = dotted.find('.', start);
      if (end == std::string::npos) end = dotted.size();
      std::string key = dotted.substr(start, end - start);
      if (!cur.IsMap()) return false;
      YAML::Node next = lookup(cur, key);
      if (!next.IsDefined() || next.IsNull()) return false;
      cur.reset(next);
      start = end + 1;
    }
    return true;
  }

  void validate(const YAML::Node& root) {
    if (!root.IsMap()) {
      error(root, "", fmt::format("a recipe is a mapping of sections ({}), but this file holds {}",
                                  section_keys(recipe_layout()), describe(root)));
      return;
    }
    check_duplicates(root, "");
    walk_group(recipe_layout(), root, "", root, /*defaults_on=*/false);
  }

  static std::string section_keys(const SectionSpec& g) {
    std::vector<std::string> keys;
    for (const auto& c : g.children) keys.push_back(c.key);
    return join(keys);
  }

  void walk_group(const SectionSpec& spec, const YAML::Node& node, const std::string& path,
                  const YAML::Node& root, bool defaults_on) {
    std::vector<std::string> keys;
    for (const auto& c : spec.children) keys.push_back(c.key);
    if (node.IsDefined() && !node.IsNull()) {
      if (!node.IsMap()) {
        error(node, path, fmt::format("{} must be a mapping with keys {}, got {}", path,
                                      join(keys), describe(node)));
        return;
      }
      for (auto it = node.begin(); it != node.end(); ++it) {
        std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
        if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
          std::string where = path.empty() ? "at the top level" : "in " + path;
          error(it->first, path.empty() ? key : path + "." + key,
                fmt::format("unknown key '{}' {}{}; allowed: {}", key, where,
                            did_you_mean(key, keys), join(keys)));
        }
      }
    }
    bool child_defaults = defaults_on || (!spec.defaults_if.empty() && present(root, spec.defaults_if));
    for (const auto& child : spec.children) {
      YAML::Node sub = lookup(node, child.key);
      std::string sub_path = path.empty() ? child.key : path + "." + child.key;
      switch (child.type) {
        case SectionSpec::Type::Group:
          walk_group(child, sub, sub_path, root, child_defaults);
          break;
        case SectionSpec::Type::Host:
          walk_host(child, sub, sub_path);
          break;
        case SectionSpec::Type::Slot:
          walk_slot(child, sub, sub_path, root, node, child_defaults);
          break;
        case SectionSpec::Type::List:
          walk_list(child, sub, sub_path);
          break;
      }
    }
  }

  void walk_host(const SectionSpec& spec, const YAML::Node& node, const std::string& path) {
    const YAML::Node& map = node;
    if (node.IsDefined() && !node.IsNull() && !node.IsMap()) {
      error(node, path, fmt::format("{} must be a mapping, got {}", path, describe(node)));
      return;
    }
    recipe.sections[path] = settings(path, spec.schema, map, "");
  }

  // `anchor` locates problems that have no node of their own (a missing required key).
  // `label` names the section in messages ("data.collator (zoo-collator)"); `path` is its recipe
  // path, used to locate --set overrides.
  Config settings(const std::string& path, const Schema& schema, const YAML::Node& map,
                  const std::string& skip_key, const YAML::Node& anchor = undefined_node(),
                  std::string label = "") {
    if (label.empty()) label = path;
    std::map<std::string, Value> values;
    std::map<std::string, std::string> locations;
    std::vector<std::string> names;
    for (const auto& f : schema.fields()) names.push_back(f.name);
    if (map.IsMap()) {
      for (auto it = map.begin(); it != map.end(); ++it) {
        std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
        if (key == skip_key) continue;
        if (schema.find(key) == nullptr)
          error(it->first, path + "." + key,
                fmt::format("unknown key '{}' in {}{}; allowed: {}", key, label,
                            did_you_mean(key, names), names.empty() ? "(none)" : join(names)));
      }
    }
    for (const auto& f : schema.fields()) {
      YAML::Node v = lookup(map, f.name);
      std::string fpath = path + "." + f.name;
      std::string flabel = label + "." + f.name;
      if (!v.IsDefined()) {
        if (f.required)
          error(map.IsDefined() ? map : anchor, fpath,
                fmt::format("missing required key '{}' in {} ({}){}", f.name, label,
                            f.type == FieldType::Enum ? "one of " + join(f.choices, ", ")
                                                      : std::string(field_type_name(f.type)),
                            f.help.empty() ? "" : ": " + f.help));
        values[f.name] = f.default_value;
        continue;
      }
      locations[f.name] = loc(v, fpath);
      values[f.name] = convert(f, v, fpath, flabel);
    }
    return Config(path, std::move(values), std::move(locations));
  }

  static std::string describe_choices(const Field& f) {
    return f.type == FieldType::Enum ? join(f.choices, "|") : "";
  }

  // Converts one scalar to the element type; reports a diagnostic and returns monostate on error.
  Value scalar(const Field& f, FieldType t, const YAML::Node& n, const std::string& path,
               const std::string& label) {
    std::string expected = field_type_name(t);
    if (!n.IsScalar()) {
      error(n, path, fmt::format("{}: expected {}, got {}", label,
                                 t == FieldType::Enum ? "one of " + join(f.choices, ", ") : expected,
                                 describe(n)));
      return {};
    }
    std::string why;
    Value v = parse_scalar(f, t, n.Scalar(), label, why);
    if (!why.empty()) error(n, path, why);
    return v;
  }

  Value convert(const Field& f, const YAML::Node& n, const std::string& path,
                const std::string& label) {
    auto list_of = [&](FieldType elem, auto tag) -> Value {
      using T = decltype(tag);
      if (!n.IsSequence()) {
        error(n, path, fmt::format("{}: expected {}, got {}", label, field_type_name(f.type), describe(n)));
        return {};
      }
      if (f.list_size && n.size() != *f.list_size) {
        error(n, path, fmt::format("{}: expected a list of {} values, got {}", label, *f.list_size, n.size()));
        return {};
      }
      std::vector<T> out;
      bool ok = true;
      for (size_t i = 0; i < n.size(); ++i) {
        Value v = scalar(f, elem, n[i], path, fmt::format("{}[{}]", label, i));
        if (auto* p = std::get_if<T>(&v)) out.push_back(*p);
        else ok = false;
      }
      return ok ? Value(std::move(out)) : Value();
    };
    switch (f.type) {
      case FieldType::IntList: return list_of(FieldType::Int, int64_t{});
      case FieldType::FloatList: return list_of(FieldType::Float, double{});
      case FieldType::StringList: return list_of(FieldType::String, std::string{});
      default: break;
    }
    if (n.IsNull()) {
      if (!f.required && std::holds_alternative<std::monostate>(f.default_value)) return {};
      error(n, path, fmt::format("{}: expected {}, got nothing (null)", label,
                                 f.type == FieldType::Enum ? "one of " + join(f.choices, ", ")
                                                           : std::string(field_type_name(f.type))));
      return {};
    }
    return scalar(f, f.type, n, path, label);
  }

  ComponentSpec component(const std::string& kind, const YAML::Node& node, const std::string& path) {
    ComponentSpec spec;
    spec.path = path;
    spec.kind = kind;
    YAML::Node name_node = undefined_node();
    if (node.IsScalar()) {
      name_node.reset(node);
    } else if (node.IsMap()) {
      name_node.reset(lookup(node, "plugin"));
      if (!name_node.IsDefined()) {
        error(node, path, fmt::format("{}: missing key 'plugin' naming the {} to use; installed: {}",
                                      path, kind, join(registry_.names(kind))));
        return spec;
      }
      if (!name_node.IsScalar()) {
        error(name_node, path + ".plugin",
              fmt::format("{}.plugin: expected a {} name, got {}", path, kind, describe(name_node)));
        return spec;
      }
    } else {
      error(node, path, fmt::format("{}: expected a {} name or a mapping with 'plugin:', got {}",
                                    path, kind, describe(node)));
      return spec;
    }
    spec.name = name_node.Scalar();
    spec.location = loc(name_node, path);
    const RegistryEntry* e = registry_.find(kind, spec.name);
    if (e == nullptr) {
      error(name_node, path, fmt::format("{}: {}", path, registry_.unknown_message(kind, spec.name)));
      return spec;
    }
    if (!e->conflicts.empty()) {
      error(name_node, path, fmt::format("{}: {}", path, registry_.conflict_message(*e)));
      return spec;
    }
    spec.entry = e;
    spec.config = settings(path, e->info.schema, node.IsMap() ? node : undefined_node(), "plugin",
                           node, fmt::format("{} ({})", path, spec.name));
    return spec;
  }

  void walk_slot(const SectionSpec& spec, const YAML::Node& node, const std::string& path,
                 const YAML::Node& root, const YAML::Node& parent, bool defaults_on) {
    (void)parent;
    if (!node.IsDefined() || node.IsNull()) {
      if (!spec.required_if.empty() && present(root, spec.required_if)) {
        error(node.IsDefined() ? node : root, path,
              fmt::format("missing {}: it is required when {} is set; installed {}: {}", path,
                          spec.required_if, spec.kind, join(registry_.names(spec.kind))));
        return;
      }
      if (!defaults_on || spec.default_name.empty()) return;
      ComponentSpec c;
      c.path = path;
      c.kind = spec.kind;
      c.name = spec.default_name;
      c.location = path + " (default)";
      const RegistryEntry* e = registry_.find(spec.kind, c.name);
      if (e == nullptr && spec.soft_default) return;
      if (e == nullptr || !e->conflicts.empty()) {
        error(root, path,
              fmt::format("{} defaults to '{}', but {}; name one in the recipe", path, c.name,
                          e == nullptr ? registry_.unknown_message(spec.kind, c.name)
                                       : registry_.conflict_message(*e)));
        return;
      }
      c.entry = e;
      c.config = settings(path, e->info.schema, undefined_node(), "plugin");
      recipe.components[path] = std::move(c);
      return;
    }
    ComponentSpec c = component(spec.kind, node, path);
    if (c.entry != nullptr) recipe.components[path] = std::move(c);
  }

  void walk_list(const SectionSpec& spec, const YAML::Node& node, const std::string& path) {
    if (!node.IsDefined() || node.IsNull()) return;
    if (!node.IsSequence()) {
      if (node.IsMap() || node.IsScalar()) {  // a single component is a list of one
        ComponentSpec c = component(spec.kind, node, path + "[0]");
        if (c.entry != nullptr) recipe.profilers.push_back(std::move(c));
        return;
      }
      error(node, path, fmt::format("{}: expected a list of {}s, got {}", path, spec.kind, describe(node)));
      return;
    }
    for (size_t i = 0; i < node.size(); ++i) {
      ComponentSpec c = component(spec.kind, node[i], fmt::format("{}[{}]", path, i));
      if (c.entry != nullptr) recipe.profilers.push_back(std::move(c));
    }
  }

 private:
  std::string file_;
  const Registry& registry_;
  std::map<std::string, std::string> overrides_;
};

// Reads the file; a missing file, a directory or an unreadable file is reported here.
std::string read_recipe_file(const std::string& file) {
  std::error_code ec;
  if (!fs::exists(file, ec))
    throw RecipeError(file, {{file, "no such file"}});
  if (fs::is_directory(file, ec))
    throw RecipeError(file, {{file, "is a directory, not a recipe file; pass the .yaml file inside it"}});
  std::ifstream in(file, std::ios::binary);
  if (!in) throw RecipeError(file, {{file, "cannot be read (permission denied?)"}});
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Rejects what YAML parsers report poorly: empty text, binary data, tabs in indentation and
// nesting too deep to be a recipe (yaml-cpp recurses once per level).
void check_recipe_text(const std::string& file, const std::string& text) {
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    throw RecipeError(file, {{file, "is empty; a recipe names at least a dataset or a model"}});
  // Binary data: NUL bytes or invalid UTF-8.
  size_t line = 1, col = 1;
  for (size_t i = 0; i < text.size();) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len != 0 && i + len <= text.size() && c != 0;
    for (size_t k = 1; ok && k < len; ++k)
      ok = (static_cast<unsigned char>(text[i + k]) >> 6) == 0x2;
    if (!ok)
      throw RecipeError(file, {{fmt::format("{}:{}:{}", file, line, col),
                                fmt::format("not a text file: byte 0x{:02x} at offset {} is {}; a "
                                            "recipe is UTF-8 YAML",
                                            c, i, c == 0 ? "a NUL" : "not valid UTF-8")}});
    if (c == '\n') line++, col = 1;
    else col++;
    i += len;
  }
  // Tabs in indentation (YAML forbids them; parsers report them cryptically).
  std::vector<Diagnostic> problems;
  line = 1;
  size_t start = 0;
  int depth = 0, max_depth = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    size_t i = start;
    for (; i < end && (text[i] == ' ' || text[i] == '\t'); ++i)
      if (text[i] == '\t') {
        problems.push_back({fmt::format("{}:{}:{}", file, line, i - start + 1),
                            "tab character in indentation; YAML indents with spaces only"});
        break;
      }
    max_depth = std::max(max_depth, static_cast<int>(i - start));
    for (size_t j = start; j < end; ++j) {
      if (text[j] == '[' || text[j] == '{') max_depth = std::max(max_depth, ++depth);
      else if ((text[j] == ']' || text[j] == '}') && depth > 0) --depth;
    }
    start = end + 1;
    line++;
  }
  if (max_depth > kMaxNesting)
    problems.push_back({file, fmt::format("nesting deeper than {} levels; a recipe is a few "
                                          "levels deep",
                                          kMaxNesting)});
  if (!problems.empty()) throw RecipeError(file, std::move(problems));
}

// Sets `value` at dotted `path` inside root, creating mappings as needed. A component given as
// a bare name becomes {plugin: name} when a setting under it is overridden.
void apply_override(YAML::Node root, const std::string& path, const YAML::Node& value,
                    const std::string& text) {
  std::vector<std::string> keys;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('.', start);
    if (end == std::string::npos) end = path.size();
    keys.push_back(path.substr(start, end - start));
    start = end + 1;
  }
  YAML::Node cur = root;
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string& k = keys[i];
    bool last = i + 1 == keys.size();
    if (cur.IsSequence()) {
      int64_t idx;
      if (!parse_int(k, idx) || idx < 0 || static_cast<size_t>(idx) >= cur.size())
        throw RecipeError("--set", {{"--set " + text,
                                     fmt::format("'{}' is not an index of the list at '{}' (size {})",
                                                 k, join({keys.begin(), keys.begin() + i}, "."), cur.size())}});
      if (last) {
        cur[static_cast<size_t>(idx)] = value;
        return;
      }
      cur.reset(cur[static_cast<size_t>(idx)]);
      continue;
    }
    if (!cur.IsMap() && !cur.IsNull())
      throw RecipeError("--set", {{"--set " + text,
                                   fmt::format("cannot set '{}': '{}' is not a mapping", path,
                                               join({keys.begin(), keys.begin() + i}, "."))}});
    if (last) {
      cur[k] = value;
      return;
    }
    YAML::Node next = cur[k];
    if (!next.IsDefined() || next.IsNull()) cur[k] = YAML::Node(YAML::NodeType::Map);
    YAML::Node child = cur[k];
    if (child.IsScalar()) {  // bare component name -> {plugin: name}
      std::string name = child.Scalar();
      YAML::Node m(YAML::NodeType::Map);
      m["plugin"] = name;
      cur[k] = m;
      child.reset(cur[k]);
    }
    cur.reset(child);
  }
}

}  // namespace

RecipeError::RecipeError(const std::string& file, std::vector<Diagnostic> diags)
    : UserError([&] {
        std::string m;
        for (const auto& d : diags) m += fmt::format("{}: error: {}\n", d.location, d.message);
        m += fmt::format("{} problem{} in {}", diags.size(), diags.size() == 1 ? "" : "s", file);
        return m;
      }()),
      diags_(std::move(diags)) {}

std::pair<std::string, std::string> parse_override(const std::string& text) {
  size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UserError(fmt::format("expected key.path=value, e.g. --set data.collator.tokens_per_batch=4096"));
  std::string path = text.substr(0, eq);
  for (size_t i = 0; i < path.size(); ++i) {
    char c = path[i];
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' ||
              (c == '.' && i > 0 && i + 1 < path.size() && path[i + 1] != '.');
    if (!ok)
      throw UserError(fmt::format("'{}' is not a key path (letters, digits, _ and - "
                                  "separated by single dots)",
                                  path));
  }
  return {path, text.substr(eq + 1)};
}

Recipe load_recipe(const std::string& file, const std::vector<std::string>& overrides,
                   const Registry& registry) {
  return load_recipe_text(read_recipe_file(file), file, overrides, registry);
}

Recipe load_recipe_text(const std::string& text, const std::string& file,
                        const std::vector<std::string>& overrides, const Registry& registry) {
  check_recipe_text(file, text);
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw RecipeError(file, {{mark_location(file, e.mark), "YAML syntax error: " + e.msg}});
  }
  if (root.IsNull())
    throw RecipeError(file, {{file, "holds no settings (only comments?); a recipe names at least a dataset or a model"}});
  std::map<std::string, std::string> sources;
  std::vector<Diagnostic> set_diags;
  for (const auto& o : overrides) {
    try {
      auto [path, value_text] = parse_override(o);
      YAML::Node value;
      try {
        value = YAML::Load(value_text);
      } catch (const YAML::Exception& e) {
        set_diags.push_back({"--set " + o, "value is not valid YAML: " + e.msg});
        continue;
      }
      if (root.IsMap()) apply_override(root, path, value, o);
      sources[path] = o;
    } catch (const RecipeError& e) {
      for (const auto& d : e.diagnostics()) set_diags.push_back(d);
    } catch (const UserError& e) {
      set_diags.push_back({"--set " + o, e.message()});
    }
  }
  Validator v(file, registry, sources);
  v.diags = std::move(set_diags);
  v.validate(root);
  if (!v.diags.empty()) throw RecipeError(file, std::move(v.diags));
  Recipe r = std::move(v.recipe);
  r.file = file;
  // run.name / run.dir defaults depend on the file name.
  Config& run = r.sections["run"];
  auto vals = run.values();
  auto locs = std::map<std::string, std::string>();
  for (const auto& [k, _] : vals)
    if (run.location(k).find("(default)") == std::string::npos) locs[k] = run.location(k);
  if (!run.has("name")) vals["name"] = fs::path(file).stem().string();
  if (!run.has("dir")) vals["dir"] = "runs/" + std::get<std::string>(vals["name"]);
  run = Config("run", vals, locs);
  return r;
}

Config validate_settings(const std::string& path, const Schema& schema, const YAML::Node& map,
                         const std::string& file, std::vector<Diagnostic>& diags) {
  Registry empty;
  Validator v(file, empty, {});
  Config c = v.settings(path, schema, map, "plugin");
  for (auto& d : v.diags) diags.push_back(std::move(d));
  return c;
}

namespace {
void emit_value(YAML::Emitter& out, const Value& v) {
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::monostate>) out << YAML::Null;
        else if constexpr (std::is_same_v<T, std::vector<int64_t>> ||
                           std::is_same_v<T, std::vector<double>> ||
                           std::is_same_v<T, std::vector<std::string>>) {
          out << YAML::Flow << YAML::BeginSeq;
          for (const auto& e : x) out << e;
          out << YAML::EndSeq;
        } else if constexpr (std::is_same_v<T, double>) {
          out << fmt::format("{}", x);
        } else out << x;
      },
      v);
}

void emit_component(YAML::Emitter& out, const ComponentSpec& c) {
  out << YAML::BeginMap << YAML::Key << "plugin" << YAML::Value << c.name;
  out << YAML::Comment(fmt::format("{} {} (build {}) from {}", c.entry->origin->name,
                                   c.entry->origin->version, c.entry->origin->build_id,
                                   c.entry->origin->path));
  for (const auto& f : c.entry->info.schema.fields()) {
    out << YAML::Key << f.name << YAML::Value;
    emit_value(out, c.config.values().at(f.name));
  }
  out << YAML::EndMap;
}

void emit_settings(YAML::Emitter& out, const Config& c) {
  out << YAML::BeginMap;
  for (const auto& [k, v] : c.values()) {
    out << YAML::Key << k << YAML::Value;
    emit_value(out, v);
  }
  out << YAML::EndMap;
}
}  // namespace

std::string Recipe::resolved_yaml(const std::vector<std::pair<std::string, std::string>>& op_providers) const {
  YAML::Emitter out;
  out << YAML::Comment(fmt::format("resolved from {} by qrun; every default filled in", file));
  out << YAML::BeginMap;
  for (const auto& [name, cfg] : sections) {
    out << YAML::Key << name << YAML::Value;
    emit_settings(out, cfg);
  }
  // Components grouped back into their sections, in layout order.
  auto emit_group = [&](const std::string& group, const std::vector<std::string>& keys) {
    bool any = false;
    for (const auto& k : keys) any |= components.count(group + "." + k) > 0;
    if (!any) return;
    out << YAML::Key << group << YAML::Value << YAML::BeginMap;
    for (const auto& k : keys) {
      auto it = components.find(group + "." + k);
      if (it == components.end()) continue;
      out << YAML::Key << k << YAML::Value;
      emit_component(out, it->second);
      if (group == "kernels" && k == "ops" && !op_providers.empty()) {
        std::string text = "operations of kernels.ops and the backend of each:";
        for (const auto& [op, provider] : op_providers) text += fmt::format(" {}={}", op, provider);
        out << YAML::Comment(text);
      }
    }
    out << YAML::EndMap;
  };
  if (auto it = components.find("model"); it != components.end()) {
    out << YAML::Key << "model" << YAML::Value;
    emit_component(out, it->second);
  }
  if (auto it = components.find("sharding"); it != components.end()) {
    out << YAML::Key << "sharding" << YAML::Value;
    emit_component(out, it->second);
  }
  emit_group("kernels", {"attention", "linear_attention", "conv1d", "ops"});
  emit_group("data", {"tokenizer", "chat_format", "dataset", "collator", "eval_dataset"});
  if (!profilers.empty()) {
    out << YAML::Key << "profiler" << YAML::Value << YAML::BeginSeq;
    for (const auto& p : profilers) emit_component(out, p);
    out << YAML::EndSeq;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace qrun

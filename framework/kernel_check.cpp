// framework/kernel_check.cpp - see kernel_check.h.
#include "kernel_check.h"

#include "components.h"
#include "text.h"

#include <qrun/sdk/data.h>

#include <torch/cuda.h>

namespace qrun {
namespace {

// The component with every setting at its default, or nullptr when it has a required setting or
// its factory refuses the defaults.
std::unique_ptr<Component> with_defaults(const RegistryEntry& e) {
  std::map<std::string, Value> v;
  for (const auto& f : e.info.schema.fields()) {
    if (f.required) return nullptr;
    v[f.name] = f.default_value;
  }
  try {
    return e.info.factory(Config("kernels." + e.info.kind, v));
  } catch (const std::exception&) {
    return nullptr;
  }
}

// The installed backends of `kind` that can run `use`, by name.
std::vector<std::string> able(const Registry& reg, const KernelUse& use, const std::string& except) {
  std::vector<std::string> out;
  for (const RegistryEntry* e : reg.entries()) {
    if (e->info.kind != use.kind || e->info.name == except || !e->conflicts.empty()) continue;
    std::unique_ptr<Component> c = with_defaults(*e);
    const KernelBackend* k = as_backend(use.kind, c.get());
    if (k != nullptr && k->unsupported(use).empty()) out.push_back(e->info.name);
  }
  return out;
}

}  // namespace

c10::DeviceType recipe_device_type(const Config& run) {
  const std::string& d = run.get_string("device");
  if (d == "cuda") return c10::DeviceType::CUDA;
  if (d == "cpu") return c10::DeviceType::CPU;
  return torch::cuda::is_available() ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
}

c10::ScalarType recipe_compute_dtype(const Recipe& r) {
  return r.section("precision").get_string("compute") == "bf16" ? c10::kBFloat16 : c10::kFloat;
}

std::vector<Layout> recipe_layouts(const Recipe& r, const Registry& reg) {
  if (r.component("data.collator") != nullptr) {
    try {
      auto c = make_component<Collator>(r, reg, "data.collator");
      if (auto l = c->layout()) return {*l};
    } catch (const UserError&) {
      // The run reports a bad collator itself; here both layouts are checked.
    }
  }
  return {Layout::Packed, Layout::Padded};
}

void check_kernel_uses(const Recipe& r, const Registry& reg, const Model& model,
                       const std::map<std::string, const KernelBackend*>& backends,
                       c10::DeviceType device, c10::ScalarType dtype,
                       const std::vector<Layout>& layouts) {
  std::vector<Diagnostic> diags;
  for (KernelUse use : model.kernel_uses()) {
    use.device = device;
    use.dtype = dtype;
    auto it = backends.find(use.kind);
    if (it == backends.end() || it->second == nullptr) continue;  // the model says so at build()
    const ComponentSpec* spec = r.component("kernels." + use.kind);
    const std::string name = spec ? spec->name : "?";
    for (Layout layout : layouts) {
      use.layout = layout;
      const std::string why = it->second->unsupported(use);
      if (why.empty()) continue;
      const std::vector<std::string> alt = able(reg, use, name);
      diags.push_back({spec ? spec->location : r.file,
                       fmt::format("kernels.{} '{}' cannot run the model's {} ({}): {}; {}", use.kind,
                                   name, use.kind, use.describe(), why,
                                   alt.empty() ? "no installed " + use.kind + " backend can"
                                               : "installed backends that can: " + join(alt))});
      break;  // one diagnostic per use
    }
  }
  if (!diags.empty()) throw RecipeError(r.file, std::move(diags));
}

OpTable compose_ops(const Recipe& r, const Registry& reg, Ops* recipe_ops, std::unique_ptr<Ops>& reference) {
  OpTable t;
  const ComponentSpec* spec = r.component("kernels.ops");
  const bool named_reference = spec != nullptr && spec->name == "reference";
  if (!named_reference && reg.find(Ops::kKind, "reference") != nullptr) {
    reference = reg.create<Ops>("reference", Config("kernels.ops", {}));
    reference->provide(t, "reference");
  }
  if (recipe_ops != nullptr) recipe_ops->provide(t, spec ? spec->name : "?");
  return t;
}

void validate_kernels(const Recipe& r, const Registry& reg) {
  if (r.component("model") == nullptr) return;
  std::vector<std::unique_ptr<Component>> keep;
  std::map<std::string, const KernelBackend*> backends;
  for (const char* kind : {Attention::kKind, LinearAttention::kKind, Conv1d::kKind, Ops::kKind}) {
    const std::string path = std::string("kernels.") + kind;
    const ComponentSpec* spec = r.component(path);
    if (spec == nullptr) continue;
    std::unique_ptr<Component> c;
    try {
      c = spec->entry->info.factory(spec->config);
    } catch (Error& e) {
      e.add_context(fmt::format("while creating {} '{}' ({})", path, spec->name, spec->location));
      throw;
    }
    backends[kind] = as_backend(kind, c.get());
    keep.push_back(std::move(c));
  }
  auto model = make_component<Model>(r, reg, "model");
  check_kernel_uses(r, reg, *model, backends, recipe_device_type(r.section("run")),
                    recipe_compute_dtype(r), recipe_layouts(r, reg));
}

}  // namespace qrun

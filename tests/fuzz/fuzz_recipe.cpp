// tests/fuzz/fuzz_recipe.cpp - recipe loading + validation must never crash, hang or leak: any
// input either validates or raises qrun::Error. The input is a recipe; after a line "#--set" each
// further line is one --set override.
#include "recipe.h"
#include "registry.h"

#include <cstdint>
#include <string>

namespace {

// Validation never calls factories; this stands in for every component.
class Nothing : public qrun::Component {};

const qrun::Registry& registry() {
  static qrun::Registry* r = [] {
    auto* reg = new qrun::Registry();
    auto origin = std::make_shared<qrun::PluginOrigin>(qrun::PluginOrigin{"<fuzz>", "fuzz", "1", "1", 0});
    using qrun::Field;
    qrun::Schema every_type{
        Field::integer("tokens_per_batch", 64).min(1).max(1 << 20),
        Field::number("ratio", 0.5).min(0).max(1),
        Field::boolean("flag", false),
        Field::choice("strategy", "greedy", {"greedy", "single"}),
        Field::path("path").optional(),
        Field::string("name").require(),
        Field::int_list("sizes", {1, 2}),
        Field::float_list("betas", {0.9, 0.95}).size(2),
        Field::string_list("tags", {}),
    };
    auto factory = [](const qrun::Config&) -> std::unique_ptr<qrun::Component> {
      return std::make_unique<Nothing>();
    };
    for (const std::string kind : {"collator", "dataset", "tokenizer", "chat_format", "model",
                                   "attention", "linear_attention", "conv1d", "ops", "profiler"})
      for (const std::string name : {"a", "packed-collator", "chatml", "sdpa", "gdn-reference",
                                     "conv-reference", "reference"})
        reg->add(qrun::ComponentInfo{kind, name, "fuzz", every_type, factory}, origin);
    return reg;
  }();
  return *r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> overrides;
  size_t cut = text.find("\n#--set\n");
  if (cut != std::string::npos) {
    std::string rest = text.substr(cut + 8);
    text.resize(cut + 1);
    size_t start = 0;
    while (start < rest.size()) {
      size_t end = rest.find('\n', start);
      if (end == std::string::npos) end = rest.size();
      overrides.push_back(rest.substr(start, end - start));
      start = end + 1;
    }
  }
  try {
    qrun::Recipe r = qrun::load_recipe_text(text, "fuzz.yaml", overrides, registry());
    (void)r.resolved_yaml();
  } catch (const qrun::Error&) {
  }
  return 0;
}

// A plugin that registers a component name another plugin (test-zoo) already provides.
#include <qrun/sdk.h>

namespace {
struct Other : qrun::Collator {
  std::optional<qrun::Batch> next(qrun::ExampleStream&) override { return std::nullopt; }
};
void register_dup(qrun::Registrar& r) {
  r.add<qrun::Collator>("zoo-collator", "a second zoo-collator", qrun::Schema{},
                        [](const qrun::Config&) { return std::make_unique<Other>(); });
}
}  // namespace

QRUN_PLUGIN("test-duplicate", "0.0.1", register_dup)

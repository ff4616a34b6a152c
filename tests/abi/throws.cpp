// A plugin whose registration throws after registering one component: nothing of it may stay.
#include <qrun/sdk.h>

#include <stdexcept>

namespace {
struct Never : qrun::Collator {
  std::optional<qrun::Batch> next(qrun::ExampleStream&) override { return std::nullopt; }
};
void register_then_throw(qrun::Registrar& r) {
  r.add<qrun::Collator>("half-registered", "must not appear", qrun::Schema{},
                        [](const qrun::Config&) { return std::make_unique<Never>(); });
  throw std::runtime_error("cannot find libfoo.so");
}
}  // namespace

QRUN_PLUGIN("test-throws", "0.0.1", register_then_throw)

// qrun/sdk/component.h - the base of every pluggable component and the registration interface.
//
// A plugin library registers components by (kind, name) through a Registrar during its explicit
// registration call (plugin.h); no static initialisers. Each kind is an abstract interface in
// sdk/ that names itself with `static constexpr const char* kKind`. Factories return
// std::unique_ptr and receive the component's validated Config (config.h).
//
// Thread-safety: factories are called from the host's main thread. Added in SDK 1.
#pragma once

#include <qrun/sdk/config.h>
#include <qrun/sdk/log.h>

#include <functional>
#include <memory>
#include <string>

namespace qrun {

// The kinds the host knows, in the order `qrun plugins list` prints them.
inline const std::vector<std::string>& component_kinds() {
  static const std::vector<std::string> kinds = {
      "model",    "attention", "linear_attention", "conv1d",   "ops",       "tokenizer",
      "chat_format", "dataset", "collator",        "sharding", "transport", "profiler"};
  return kinds;
}

class Component {
 public:
  virtual ~Component() = default;
};

using ErasedFactory = std::function<std::unique_ptr<Component>(const Config&)>;

// What a plugin tells the host about one component.
struct ComponentInfo {
  std::string kind;
  std::string name;    // lowercase-kebab, unique per kind
  std::string summary; // one line, shown by `qrun plugins list`
  Schema schema;
  ErasedFactory factory;
};

// Handed to a plugin's registration function; valid only during that call.
class Registrar {
 public:
  virtual ~Registrar() = default;

  // Registers a component of kind T::kKind. The factory must return a T.
  template <typename T, typename F>
  void add(std::string name, std::string summary, Schema schema, F factory) {
    static_assert(std::is_base_of_v<Component, T>, "T must derive from qrun::Component");
    ComponentInfo info;
    info.kind = T::kKind;
    info.name = std::move(name);
    info.summary = std::move(summary);
    info.schema = std::move(schema);
    info.factory = [f = std::move(factory)](const Config& c) -> std::unique_ptr<Component> {
      std::unique_ptr<T> p = f(c);
      return p;
    };
    add_component(std::move(info));
  }

  virtual void add_component(ComponentInfo info) = 0;
  // The host's log sink; the plugin glue installs it before registration (plugin.h).
  virtual LogSink log_sink() const = 0;
};

}  // namespace qrun

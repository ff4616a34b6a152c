// framework/registry.h - the host's registry of components, keyed by (kind, name).
//
// Every entry records where it came from (the plugin library's path, name, version and build id),
// so a duplicate names both origins and `qrun plugins list` can say which file provides what.
// A (kind, name) registered twice is a *conflict*: the first stays listed, and creating that
// component fails with a message naming both libraries; other components keep working.
// Libraries that failed to load are remembered with their reason, so "unknown component" errors
// can point at them. Not thread-safe: filled and read on the main thread.
#pragma once

#include <qrun/sdk/component.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace qrun {

struct PluginOrigin {
  std::string path;     // the shared library, or "<builtin>"
  std::string name;     // the plugin library's name from its descriptor
  std::string version;
  std::string build_id;
  int cuda_major = 0;
};

struct RegistryEntry {
  ComponentInfo info;
  std::shared_ptr<const PluginOrigin> origin;
  std::vector<std::shared_ptr<const PluginOrigin>> conflicts;  // later libraries with this name
};

struct FailedPlugin {
  std::string path;
  std::string reason;
};

class Registry {
 public:
  // Adds a component; a second (kind, name) becomes a conflict of the first (see above).
  void add(ComponentInfo info, std::shared_ptr<const PluginOrigin> origin);
  void add_failure(FailedPlugin f) { failures_.push_back(std::move(f)); }
  void add_plugin(std::shared_ptr<const PluginOrigin> origin) { plugins_.push_back(std::move(origin)); }

  // The entry, or nullptr.
  const RegistryEntry* find(const std::string& kind, const std::string& name) const;
  // The entry, or a UserError: unknown name (with "did you mean" and the installed names),
  // or a conflict (naming both libraries).
  const RegistryEntry& get(const std::string& kind, const std::string& name) const;
  // Message for an unknown (kind, name); used by get() and by the recipe validator.
  std::string unknown_message(const std::string& kind, const std::string& name) const;
  std::string conflict_message(const RegistryEntry& e) const;

  std::vector<std::string> names(const std::string& kind) const;
  std::vector<const RegistryEntry*> entries() const;
  const std::vector<FailedPlugin>& failures() const { return failures_; }
  const std::vector<std::shared_ptr<const PluginOrigin>>& plugins() const { return plugins_; }

  // Creates the component and checks it is of the requested kind.
  template <typename T>
  std::unique_ptr<T> create(const std::string& name, const Config& cfg) const {
    const RegistryEntry& e = get(T::kKind, name);
    std::unique_ptr<Component> c = e.info.factory(cfg);
    QRUN_ASSERT(c != nullptr, "factory of {} '{}' returned null", T::kKind, name);
    return std::unique_ptr<T>(static_cast<T*>(c.release()));
  }

 private:
  std::map<std::pair<std::string, std::string>, RegistryEntry> entries_;
  std::vector<FailedPlugin> failures_;
  std::vector<std::shared_ptr<const PluginOrigin>> plugins_;
};

}  // namespace qrun

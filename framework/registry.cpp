#include "registry.h"

#include "text.h"

#include <algorithm>

namespace qrun {

void Registry::add(ComponentInfo info, std::shared_ptr<const PluginOrigin> origin) {
  auto key = std::make_pair(info.kind, info.name);
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    it->second.conflicts.push_back(std::move(origin));
    log_warn("{}", conflict_message(it->second));
    return;
  }
  entries_.emplace(key, RegistryEntry{std::move(info), std::move(origin), {}});
}

const RegistryEntry* Registry::find(const std::string& kind, const std::string& name) const {
  auto it = entries_.find({kind, name});
  return it == entries_.end() ? nullptr : &it->second;
}

std::string Registry::conflict_message(const RegistryEntry& e) const {
  std::string m = fmt::format("{} '{}' is registered by more than one plugin: {} ({})", e.info.kind,
                              e.info.name, e.origin->name, e.origin->path);
  for (const auto& c : e.conflicts) m += fmt::format(" and {} ({})", c->name, c->path);
  m += "; remove one of the libraries from the plugin path";
  return m;
}

std::string Registry::unknown_message(const std::string& kind, const std::string& name) const {
  std::vector<std::string> known = names(kind);
  std::string m = fmt::format("unknown {} '{}'{}", kind, name, did_you_mean(name, known));
  m += known.empty() ? fmt::format("; no {} is installed", kind)
                     : fmt::format("; installed: {}", join(known));
  if (!failures_.empty()) {
    m += fmt::format("; note: {} plugin librar{} failed to load:", failures_.size(),
                     failures_.size() == 1 ? "y" : "ies");
    for (const auto& f : failures_) m += fmt::format(" {} ({})", f.path, f.reason);
  }
  return m;
}

const RegistryEntry& Registry::get(const std::string& kind, const std::string& name) const {
  const RegistryEntry* e = find(kind, name);
  if (e == nullptr) throw UserError(unknown_message(kind, name));
  if (!e->conflicts.empty()) throw UserError(conflict_message(*e));
  return *e;
}

std::vector<std::string> Registry::names(const std::string& kind) const {
  std::vector<std::string> out;
  for (const auto& [key, e] : entries_)
    if (key.first == kind) out.push_back(key.second);
  return out;
}

std::vector<const RegistryEntry*> Registry::entries() const {
  std::vector<const RegistryEntry*> out;
  const auto& kinds = component_kinds();
  for (const auto& kind : kinds)
    for (const auto& [key, e] : entries_)
      if (key.first == kind) out.push_back(&e);
  return out;
}

}  // namespace qrun

#include "plugin_loader.h"

#include "host_info.h"
#include "text.h"

#include <qrun/sdk/plugin.h>

#include <boost/dll/shared_library.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

namespace fs = std::filesystem;

namespace qrun {
namespace {

// Plugins are never unloaded: objects they created may outlive any scope we could pick, and
// unloading a library that registered LibTorch operators is unsafe. So the handles are leaked.
std::vector<boost::dll::shared_library>& loaded_libraries() {
  static auto* libs = new std::vector<boost::dll::shared_library>();
  return *libs;
}

bool is_kebab(const std::string& s) {
  static const std::regex re("^[a-z0-9]+(-[a-z0-9]+)*$");
  return std::regex_match(s, re);
}

class StagingRegistrar : public Registrar {
 public:
  void add_component(ComponentInfo info) override { staged.push_back(std::move(info)); }
  LogSink log_sink() const override { return detail::log_sink(); }
  std::vector<ComponentInfo> staged;
};

}  // namespace

std::vector<std::string> plugin_search_path() {
  std::vector<std::string> dirs;
  auto add = [&](const fs::path& p) {
    std::error_code ec;
    fs::path c = fs::weakly_canonical(p, ec);
    std::string s = (ec ? p : c).string();
    if (std::find(dirs.begin(), dirs.end(), s) == dirs.end()) dirs.push_back(s);
  };
  const char* only = std::getenv("QRUN_NO_DEFAULT_PLUGINS");
  if (only == nullptr || std::string(only) != "1") {
    fs::path exe = executable_path();
    if (!exe.empty()) add(exe.parent_path() / ".." / "lib" / "qrun" / "plugins");
    add(QRUN_INSTALL_PLUGIN_DIR);
  }
  if (const char* env = std::getenv("QRUN_PLUGIN_PATH")) {
    std::string s = env;
    size_t start = 0;
    while (start <= s.size()) {
      size_t end = s.find(':', start);
      if (end == std::string::npos) end = s.size();
      if (end > start) add(s.substr(start, end - start));
      start = end + 1;
    }
  }
  return dirs;
}

bool load_plugin(Registry& registry, const std::string& path) {
  auto reject = [&](std::string reason) {
    log_warn("plugin {} rejected: {}", path, reason);
    registry.add_failure({path, std::move(reason)});
    return false;
  };
  {
    std::ifstream in(path, std::ios::binary);
    char magic[4] = {0, 0, 0, 0};
    in.read(magic, 4);
    if (!in || std::memcmp(magic, "\x7f" "ELF", 4) != 0)
      return reject("not a shared library (no ELF header); a plugin is a libqrun-<name>.so built "
                    "with qrun_add_plugin()");
  }
  boost::dll::shared_library lib;
  try {
    lib.load(path, boost::dll::load_mode::rtld_lazy | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    // Keep the dynamic loader's own words (e.g. a missing dependency), without Boost's wrapping.
    std::string m = e.what();
    const std::string tag = "dlerror system message: ";
    size_t a = m.find(tag);
    if (a != std::string::npos) {
      size_t b = m.rfind("):");
      m = m.substr(a + tag.size(), b != std::string::npos && b > a ? b - a - tag.size() : std::string::npos);
    }
    return reject(fmt::format("cannot be loaded: {}", m));
  }
  if (!lib.has(QRUN_ENTRY_SYMBOL))
    return reject(fmt::format(
        "no entry point '{}': not a qrun plugin (define it with QRUN_PLUGIN(...) from "
        "<qrun/sdk/plugin.h> and build with qrun_add_plugin())",
        QRUN_ENTRY_SYMBOL));
  auto entry = lib.get<const qrun_plugin_descriptor_t*()>(QRUN_ENTRY_SYMBOL);
  const qrun_plugin_descriptor_t* d = entry();
  if (d == nullptr) return reject("its entry point returned no descriptor");
  // abi_version is the only field read before it is known to match.
  if (d->abi_version != QRUN_ABI_VERSION)
    return reject(fmt::format(
        "built for qrun plugin ABI {}, but this qrun has ABI {}; rebuild the plugin against "
        "this qrun's SDK (find_package(qrun) from {})",
        d->abi_version, QRUN_ABI_VERSION, QRUN_INSTALL_PREFIX));
  if (d->descriptor_size != sizeof(qrun_plugin_descriptor_t))
    return reject(fmt::format("descriptor size {} does not match this qrun's {}; rebuild the plugin",
                              d->descriptor_size, sizeof(qrun_plugin_descriptor_t)));
  std::string torch = d->torch_version ? d->torch_version : "(none)";
  if (torch != TORCH_VERSION)
    return reject(fmt::format(
        "built against LibTorch {}, but this qrun runs LibTorch {}; rebuild the plugin with "
        "CMAKE_PREFIX_PATH pointing at LibTorch {}",
        torch, TORCH_VERSION, TORCH_VERSION));
  if (d->cxx11_abi != _GLIBCXX_USE_CXX11_ABI)
    return reject(fmt::format(
        "built with _GLIBCXX_USE_CXX11_ABI={}, but this qrun uses {}; rebuild the plugin with "
        "LibTorch's TORCH_CXX_FLAGS",
        d->cxx11_abi, _GLIBCXX_USE_CXX11_ABI));
  if (d->cuda_major != 0 && d->cuda_major != QRUN_CUDA_MAJOR)
    return reject(fmt::format(
        "built with CUDA {}, but this qrun was built with {}; rebuild the plugin with CUDA {}",
        d->cuda_major, QRUN_CUDA_MAJOR == 0 ? std::string("no CUDA") : std::to_string(QRUN_CUDA_MAJOR),
        QRUN_CUDA_MAJOR));
  std::string name = d->name ? d->name : "";
  if (!is_kebab(name))
    return reject(fmt::format("plugin name '{}' is not lowercase-kebab", name));
  if (d->register_components == nullptr) return reject("descriptor has no registration function");
  for (const auto& o : registry.plugins())
    if (o->name == name)
      return reject(fmt::format("a plugin named '{}' is already loaded from {}", name, o->path));

  StagingRegistrar staging;
  try {
    d->register_components(&staging);
  } catch (const std::exception& e) {
    return reject(fmt::format("its registration function threw: {}", e.what()));
  } catch (...) {
    return reject("its registration function threw a non-standard exception");
  }
  const auto& kinds = component_kinds();
  for (const auto& info : staging.staged) {
    if (std::find(kinds.begin(), kinds.end(), info.kind) == kinds.end())
      return reject(fmt::format("registers a component of unknown kind '{}'{}", info.kind,
                                did_you_mean(info.kind, kinds)));
    if (!is_kebab(info.name))
      return reject(fmt::format("component name '{}' is not lowercase-kebab", info.name));
    if (!info.factory) return reject(fmt::format("component '{}' has no factory", info.name));
  }
  auto origin = std::make_shared<PluginOrigin>(
      PluginOrigin{path, name, d->version ? d->version : "", d->build_id ? d->build_id : "",
                   d->cuda_major});
  registry.add_plugin(origin);
  for (auto& info : staging.staged) registry.add(std::move(info), origin);
  loaded_libraries().push_back(std::move(lib));
  return true;
}

void load_plugins(Registry& registry) {
  for (const auto& entry : plugin_search_path()) {
    std::error_code ec;
    if (fs::is_regular_file(entry, ec)) {
      load_plugin(registry, entry);
      continue;
    }
    if (!fs::is_directory(entry, ec)) continue;
    std::vector<std::string> files;
    for (const auto& f : fs::directory_iterator(entry, ec)) {
      std::string fn = f.path().filename().string();
      if (fn.rfind("libqrun-", 0) == 0 && f.path().extension() == ".so") files.push_back(f.path().string());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) load_plugin(registry, f);
  }
}

}  // namespace qrun

// framework/plugin_loader.h - finds, checks and registers plugin libraries.
//
// Search path, in order: <dir of the qrun binary>/../lib/qrun/plugins (the build tree and the
// install prefix share this layout), the configured install dir, then each entry of
// QRUN_PLUGIN_PATH (':'-separated; a directory contributes its libqrun-*.so files, a file is
// loaded whatever its name). QRUN_NO_DEFAULT_PLUGINS=1 drops the first two (isolated setups,
// tests). A library is checked through its C descriptor (sdk plugin.h) before
// any of its C++ code runs. A library that fails any check is recorded in the registry with the
// reason and skipped; the host keeps running unless the recipe asks for one of its components.
#pragma once

#include "registry.h"

#include <string>
#include <vector>

namespace qrun {

std::vector<std::string> plugin_search_path();

// Loads every plugin on the search path into `registry`. Never throws for a bad library.
void load_plugins(Registry& registry);

// Loads one library; returns false (and records the failure) when it is rejected.
bool load_plugin(Registry& registry, const std::string& path);

}  // namespace qrun

// tests/abi - deliberately broken plugins, each rejected with its exact message, while the host
// keeps running recipes that do not ask for them.
#include "support/run_process.h"

#include <gtest/gtest.h>

#include <qrun/sdk/plugin.h>
#include <torch/version.h>

#include <string>

namespace {

using qrun::test::run_process;

std::string lib(const std::string& name) { return std::string(BROKEN_DIR) + "/libqrun-" + name + ".so"; }

// qrun with test-zoo plus the given extra plugin files, nothing from the default folders.
qrun::test::ProcessResult qrun_with(const std::string& extra, const std::string& args) {
  std::string path = std::string(ZOO) + (extra.empty() ? "" : ":" + extra);
  return run_process(std::string(QRUN_BIN) + " " + args,
                     "QRUN_NO_DEFAULT_PLUGINS=1 QRUN_PLUGIN_PATH='" + path + "'", WORK_DIR);
}

// The line `plugins list` prints for a library that failed to load.
std::string failed_line(const std::string& path, const std::string& reason) {
  return "  " + path + ": " + reason + "\n";
}

void expect_rejected(const std::string& name, const std::string& reason) {
  auto r = qrun_with(lib(name), "plugins list");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(failed_line(lib(name), reason)), std::string::npos)
      << "expected reason: " << reason << "\nstdout:\n" << r.out;
  EXPECT_NE(r.err.find("plugin " + lib(name) + " rejected: " + reason), std::string::npos) << r.err;
  // The host keeps running a recipe that does not need the broken plugin.
  auto ok = qrun_with(lib(name), std::string("validate ") + RECIPE_DIR + "/zoo.yaml");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

TEST(Abi, WrongAbiVersion) {
  expect_rejected("broken-abi",
                  "built for qrun plugin ABI 999, but this qrun has ABI " +
                      std::to_string(QRUN_ABI_VERSION) + "; rebuild the plugin "
                  "against this qrun's SDK (find_package(qrun) from " HOST_INSTALL_PREFIX ")");
}

TEST(Abi, OtherLibTorch) {
  expect_rejected("broken-torch",
                  "built against LibTorch 2.10.0, but this qrun runs LibTorch " TORCH_VERSION
                  "; rebuild the plugin with CMAKE_PREFIX_PATH pointing at LibTorch " TORCH_VERSION);
}

TEST(Abi, OtherCxx11Abi) {
  expect_rejected("broken-cxx11",
                  "built with _GLIBCXX_USE_CXX11_ABI=0, but this qrun uses 1; rebuild the plugin "
                  "with LibTorch's TORCH_CXX_FLAGS");
}

TEST(Abi, OtherCudaMajor) {
  std::string host = HOST_CUDA_MAJOR == 0 ? "no CUDA" : std::to_string(HOST_CUDA_MAJOR);
  expect_rejected("broken-cuda", "built with CUDA 99, but this qrun was built with " + host +
                                     "; rebuild the plugin with CUDA " +
                                     std::to_string(HOST_CUDA_MAJOR));
}

TEST(Abi, BadPluginName) {
  expect_rejected("broken-name", "plugin name 'Bad_Name' is not lowercase-kebab");
}

TEST(Abi, MissingEntrySymbol) {
  expect_rejected("no-entry",
                  "no entry point 'qrun_plugin_descriptor': not a qrun plugin (define it with "
                  "QRUN_PLUGIN(...) from <qrun/sdk/plugin.h> and build with qrun_add_plugin())");
}

TEST(Abi, NotASharedLibrary) {
  expect_rejected("garbage",
                  "not a shared library (no ELF header); a plugin is a libqrun-<name>.so built "
                  "with qrun_add_plugin()");
}

TEST(Abi, RegistrationThrowsLeavesNothingBehind) {
  expect_rejected("test-throws", "its registration function threw: cannot find libfoo.so");
  auto list = qrun_with(lib("test-throws"), "plugins list");
  EXPECT_EQ(list.out.find("half-registered"), std::string::npos) << list.out;
  // A recipe that asks for the missing component names the failed library.
  auto r = qrun_with(lib("test-throws"), std::string("validate ") + RECIPE_DIR + "/half.yaml");
  EXPECT_EQ(r.exit_code, 2);
  std::string want = std::string(RECIPE_DIR) +
                     "/half.yaml:6:13: error: data.collator: unknown collator 'half-registered'; "
                     "installed: zoo-collator; note: 1 plugin library failed to load: " +
                     lib("test-throws") +
                     " (its registration function threw: cannot find libfoo.so)\n";
  EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
}

TEST(Abi, DuplicateNameNamesBothOrigins) {
  std::string conflict = "collator 'zoo-collator' is registered by more than one plugin: test-zoo (" +
                         std::string(ZOO) + ") and test-duplicate (" + lib("test-duplicate") +
                         "); remove one of the libraries from the plugin path";
  auto list = qrun_with(lib("test-duplicate"), "plugins list");
  EXPECT_EQ(list.exit_code, 0);
  EXPECT_NE(list.out.find("CONFLICT: " + conflict), std::string::npos) << list.out;
  // Using the conflicting name is an error; the other components still work.
  auto r = qrun_with(lib("test-duplicate"), std::string("validate ") + RECIPE_DIR + "/zoo.yaml");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("data.collator: " + conflict), std::string::npos) << r.err;
  auto ok = qrun_with(lib("test-duplicate"), "plugins explain dataset/zoo-dataset");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

TEST(Abi, AllBrokenPluginsAtOnceStillRun) {
  std::string all;
  for (const char* n : {"broken-abi", "broken-torch", "broken-cxx11", "broken-cuda", "broken-name",
                        "no-entry", "garbage", "test-throws"})
    all += (all.empty() ? "" : ":") + lib(n);
  auto r = qrun_with(all, std::string(RECIPE_DIR) + "/zoo.yaml --set run.dir=runs/abi-all");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("data: 10 samples -> "), std::string::npos) << r.err;
}

}  // namespace

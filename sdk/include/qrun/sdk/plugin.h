// qrun/sdk/plugin.h - the plugin ABI: one exported C entry point returning a plain descriptor.
//
// Why a C descriptor in front of C++ objects: the host must be able to reject a plugin built for
// another qrun ABI, another LibTorch, another C++ ABI or another CUDA major *before running any
// of its C++ code* (a mismatched LibTorch crashes in static constructors or, worse, corrupts
// tensors silently). The descriptor holds only C types; `abi_version` is its first field and the
// host reads nothing else when it differs.
//
// A plugin library writes, once, in one .cpp:
//
//     static void register_all(qrun::Registrar& r) { r.add<qrun::Collator>("hello", ...); }
//     QRUN_PLUGIN("hello-collator", "0.1.0", register_all)
//
// The build passes QRUN_PLUGIN_CUDA_MAJOR and generates the build id (qrun_add_plugin() in
// QrunPlugin.cmake does both). Plugins are never unloaded. Added in SDK 1.
#pragma once

#include <qrun/sdk/component.h>

#include <torch/version.h>  // TORCH_VERSION, a light header

#include <cstdint>

// Bumped whenever an sdk/ interface changes in a way that breaks plugins built against the old one.
// 2: Profiler::step_metrics() (run.h).
// 3: ops as named operations in an OpTable (ops.h); KernelBackend::unsupported() and
//    Model::kernel_uses() (kernels.h, model.h); Collator::layout() (data.h).
// 4: the transport kind and the Sharding interface (run.h).
#define QRUN_ABI_VERSION 4
#define QRUN_ENTRY_SYMBOL "qrun_plugin_descriptor"

// The build id lives in one generated source per plugin (qrun_add_plugin() writes it), so a new
// commit recompiles one tiny file instead of every source of the plugin. Without it: "unknown".
extern "C" __attribute__((weak, visibility("hidden"))) const char qrun_plugin_build_id_string[] =
    "unknown";
#ifndef QRUN_PLUGIN_CUDA_MAJOR
#define QRUN_PLUGIN_CUDA_MAJOR 0
#endif

extern "C" {
struct qrun_plugin_descriptor_t {
  uint32_t abi_version;      // QRUN_ABI_VERSION the plugin was built with; always first
  uint32_t descriptor_size;  // sizeof(qrun_plugin_descriptor_t) as the plugin saw it
  const char* torch_version; // TORCH_VERSION, e.g. "2.11.0"
  int32_t cxx11_abi;         // _GLIBCXX_USE_CXX11_ABI (1 for every current LibTorch)
  int32_t cuda_major;        // CUDA major of the build, 0 for a CPU-only plugin
  const char* name;          // plugin library name, lowercase-kebab
  const char* version;       // the plugin's own version
  const char* build_id;      // e.g. git hash of the plugin's sources
  void (*register_components)(void* registrar);  // qrun::Registrar*
};
typedef const qrun_plugin_descriptor_t* (*qrun_plugin_entry_fn)(void);
}

#define QRUN_PLUGIN(NAME, VERSION, REGISTER_FN)                                            \
  static void qrun_plugin_register_trampoline(void* registrar) {                          \
    auto& r = *static_cast<::qrun::Registrar*>(registrar);                                 \
    ::qrun::detail::log_sink() = r.log_sink();                                             \
    REGISTER_FN(r);                                                                        \
  }                                                                                        \
  extern "C" __attribute__((visibility("default"))) const qrun_plugin_descriptor_t*       \
  qrun_plugin_descriptor(void) {                                                           \
    static const qrun_plugin_descriptor_t d = {QRUN_ABI_VERSION,                           \
                                               sizeof(qrun_plugin_descriptor_t),           \
                                               TORCH_VERSION,                              \
                                               _GLIBCXX_USE_CXX11_ABI,                     \
                                               QRUN_PLUGIN_CUDA_MAJOR,                     \
                                               NAME,                                       \
                                               VERSION,                                    \
                                               qrun_plugin_build_id_string,                \
                                               &qrun_plugin_register_trampoline};          \
    return &d;                                                                             \
  }

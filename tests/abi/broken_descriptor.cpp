// A plugin whose descriptor is wrong in exactly one way, chosen at compile time (BROKEN_*).
// The descriptor is written by hand: these libraries exist to be rejected by the host's checks.
#include <qrun/sdk/plugin.h>

namespace {
void register_nothing(void*) {}
}

extern "C" __attribute__((visibility("default"))) const qrun_plugin_descriptor_t*
qrun_plugin_descriptor(void) {
  static const qrun_plugin_descriptor_t d = {
#ifdef BROKEN_ABI
      999,
#else
      QRUN_ABI_VERSION,
#endif
      sizeof(qrun_plugin_descriptor_t),
#ifdef BROKEN_TORCH
      "2.10.0",
#else
      TORCH_VERSION,
#endif
#ifdef BROKEN_CXX11
      0,
#else
      _GLIBCXX_USE_CXX11_ABI,
#endif
#ifdef BROKEN_CUDA
      BROKEN_CUDA,
#else
      0,
#endif
#ifdef BROKEN_NAME
      "Bad_Name",
#else
      "broken",
#endif
      "0.0.1",
      "test",
      &register_nothing};
  return &d;
}

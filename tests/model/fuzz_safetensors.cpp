// tests/model/fuzz_safetensors.cpp - libFuzzer target over the safetensors header parser
// (plugins/qwen/safetensors.cpp). Any input must either parse or throw qrun::UserError; a crash,
// a sanitizer report or another exception type is a bug. Built only with -DQRUN_FUZZ=ON (clang).
//   ./fuzz_safetensors -max_total_time=60 corpus/
#include "safetensors.h"

#include <qrun/sdk/error.h>

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto h = qrun::safetensors::parse_header(data, size, "fuzz");
    // Touch every byte range the parser accepted: it must lie inside the input.
    uint8_t acc = 0;
    for (const auto& t : h.tensors)
      if (t.end > t.begin) acc ^= data[h.data_start + t.end - 1] ^ data[h.data_start + t.begin];
    volatile uint8_t sink = acc;
    (void)sink;
  } catch (const qrun::UserError&) {
  }
  return 0;
}

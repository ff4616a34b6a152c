// fuzz_jsonl_row.cpp - libFuzzer target over the JSONL chat row parser (chat_rows.h).
// Any input must either parse into messages or yield a reason; never crash, hang or leak.
// Registered with qrun_fuzz_target (tests/CMakeLists.txt): ordinary builds replay tests/data/fuzz_corpus
// under ctest; -DQRUN_FUZZ=ON (clang) builds the libFuzzer binary that scripts/test runs.
#include "chat_rows.h"

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view line(reinterpret_cast<const char*>(data), size);
  std::vector<qrun::chatdata::RowMessage> msgs;
  auto err = qrun::chatdata::parse_jsonl_row(line, msgs);
  if (!err) {
    auto v = qrun::chatdata::validate_conversation(msgs, true);
    // A structurally valid row from valid UTF-8 input holds valid UTF-8 strings.
    for (const auto& m : msgs)
      if (qrun::chatdata::invalid_utf8_offset(m.content) != std::string_view::npos && !v)
        __builtin_trap();
    (void)qrun::chatdata::validate_conversation(msgs, false);
  } else if (err->empty()) {
    __builtin_trap();
  }
  return 0;
}

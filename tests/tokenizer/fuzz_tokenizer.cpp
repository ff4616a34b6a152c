// libFuzzer target: tokenizer encode/decode round trip and tokenizer.json parsing.
//
// In the qrun tree this is a qrun_fuzz_target: ordinary builds replay the seed corpus
// (tests/tokenizer/fuzz_corpus) as the ctest fuzz_tokenizer_replay; with -DQRUN_FUZZ=ON and
// clang++-14 it is a libFuzzer binary, run e.g. as
//   fuzz_tokenizer -max_total_time=60 -max_len=4096 NEW_DIR tests/tokenizer/fuzz_corpus
// First input byte picks the mode:
//   even: the rest is text. Valid UTF-8: decode(encode(x)) must equal NFC(x) (checked with
//         utf8proc) and parse_special=false must also round-trip; invalid UTF-8 must be a
//         qrun::UserError, never a crash.
//   odd:  the rest is tokenizer.json text; loading must succeed or throw qrun::UserError.
//         If it loads, encoding a fixed sample must not crash.
// The tokenizer for text mode is the Qwen3 one (QRUN_TEST_TOKENIZER_DIR or $QRUN_FUZZ_TOKENIZER)
// when present, else a small built-in byte-level tokenizer.
#include <qrun/sdk/error.h>
#include <utf8proc.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "bpe_tokenizer.h"

namespace {

std::string tiny_json() {
  // 256 byte symbols (GPT-2 map), one merge, one special token.
  std::string vocab;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    uint32_t cp = keep ? b : 256 + n++;
    std::string s;
    if (cp < 0x80) {
      if (cp == '"' || cp == '\\') s += '\\';
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    vocab += (b ? "," : "") + std::string("\"") + s + "\":" + std::to_string(b);
  }
  vocab += ",\"ab\":256";
  return R"({"added_tokens":[{"id":300,"content":"<x>","special":true}],"normalizer":{"type":"NFC"},)"
         R"("pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true},)"
         R"("decoder":{"type":"ByteLevel"},"model":{"type":"BPE","vocab":{)" +
         vocab + R"(},"merges":["a b"]}})";
}

const qrun::tok::BpeTokenizer& tokenizer() {
  static const qrun::tok::BpeTokenizer tok = [] {
    const char* env = std::getenv("QRUN_FUZZ_TOKENIZER");
    std::string dir = env ? env : QRUN_TEST_TOKENIZER_DIR;
    if (std::filesystem::exists(dir + "/tokenizer.json")) {
      return qrun::tok::BpeTokenizer::from_dir(dir);
    }
    return qrun::tok::BpeTokenizer::from_json_string(tiny_json(), "tiny");
  }();
  return tok;
}

std::string nfc(const std::string& s) {
  utf8proc_uint8_t* out = nullptr;
  auto len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                          static_cast<utf8proc_ssize_t>(s.size()), &out,
                          static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (len < 0) std::abort();
  std::string r(reinterpret_cast<char*>(out), static_cast<size_t>(len));
  std::free(out);
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string input(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((data[0] & 1) == 0) {
    const auto& tok = tokenizer();
    if (qrun::tok::first_invalid_utf8(input) != std::string::npos) {
      try {
        tok.encode(input);
        std::abort();  // invalid UTF-8 must be rejected
      } catch (const qrun::UserError&) {
      }
      return 0;
    }
    const std::string want = nfc(input);
    if (tok.decode(tok.encode(input)) != want) std::abort();
    if (tok.decode(tok.encode(input, false)) != want) std::abort();
    std::vector<int32_t> ids;
    std::vector<qrun::tok::TokenSpan> spans;
    tok.encode_into(input, ids, &spans);
    if (spans.size() != ids.size()) std::abort();
    for (size_t i = 0; i < spans.size(); ++i) {
      if (spans[i].begin > spans[i].end || spans[i].end > input.size()) std::abort();
    }
  } else {
    try {
      auto t = qrun::tok::BpeTokenizer::from_json_string(input, "fuzz");
      auto ids = t.encode("Hello, world! 123 <x> héllo\n\n");
      (void)t.decode(ids);
    } catch (const qrun::UserError&) {
    }
  }
  return 0;
}

// Tokenizer parity with Hugging Face `tokenizers` on the Qwen3 tokenizer, plus API checks.
#include <gtest/gtest.h>
#include <qrun/sdk/error.h>

#include <thread>

#include "bpe_tokenizer.h"
#include "test_util.h"

namespace qrun::tok::test {
namespace {

using nlohmann::json;

// Compares every fixture line; returns the number of lines checked.
size_t check_parity(const std::string& fixture, bool check_plain, size_t* n_roundtrip) {
  const auto& tok = qwen3();
  auto rows = read_jsonl(fixture);
  size_t bad_ids = 0, bad_plain = 0, bad_decode = 0, bad_roundtrip = 0;
  *n_roundtrip = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const std::string text = r["text"].get<std::string>();
    const auto want = r["ids"].get<std::vector<int32_t>>();
    const auto got = tok.encode(text);
    if (got != want && ++bad_ids <= 10) {
      ADD_FAILURE() << fixture << " line " << i + 1 << ": ids differ for text "
                    << json(text).dump() << "\n  want " << show(want) << "\n  got  " << show(got);
    }
    if (check_plain && r.contains("ids_plain")) {
      const auto want_p = r["ids_plain"].get<std::vector<int32_t>>();
      const auto got_p = tok.encode(text, /*parse_special=*/false);
      if (got_p != want_p && ++bad_plain <= 10) {
        ADD_FAILURE() << fixture << " line " << i + 1
                      << ": ids (parse_special=false) differ for text " << json(text).dump()
                      << "\n  want " << show(want_p) << "\n  got  " << show(got_p);
      }
    }
    const std::string want_dec = r.contains("decoded") ? r["decoded"].get<std::string>() : text;
    const std::string dec = tok.decode(want);
    if (dec != want_dec && ++bad_decode <= 10) {
      ADD_FAILURE() << fixture << " line " << i + 1 << ": decode differs from HF: want "
                    << json(want_dec).dump() << " got " << json(dec).dump();
    }
    // decode(encode(x)) == x for every text that NFC leaves unchanged (for the others it is
    // NFC(x), as in HF, checked through the HF decode above).
    if (r["nfc"].get<bool>()) {
      ++*n_roundtrip;
      const std::string rt = tok.decode(got);
      if (rt != text && ++bad_roundtrip <= 10) {
        ADD_FAILURE() << fixture << " line " << i + 1 << ": decode(encode(x)) != x for "
                      << json(text).dump() << ", got " << json(rt).dump();
      }
    }
  }
  EXPECT_EQ(bad_ids, 0u) << "lines with different ids in " << fixture;
  EXPECT_EQ(bad_plain, 0u) << "lines with different parse_special=false ids in " << fixture;
  EXPECT_EQ(bad_decode, 0u) << "lines with different decode in " << fixture;
  EXPECT_EQ(bad_roundtrip, 0u) << "lines where decode(encode(x)) != x in " << fixture;
  return rows.size();
}

TEST(TokenizerParity, VariedStrings) {
  QRUN_REQUIRE_QWEN3_TOKENIZER();
  size_t rt = 0;
  size_t n = check_parity("strings.jsonl", true, &rt);
  EXPECT_GE(n, 10000u);
  EXPECT_GE(rt, 9000u);
  std::cout << "[ info ] compared " << n << " strings with HF tokenizers; round trip on " << rt
            << " NFC strings\n";
}

TEST(TokenizerParity, CodePointSweep) {
  QRUN_REQUIRE_QWEN3_TOKENIZER();
  size_t rt = 0;
  size_t n = check_parity("sweep.jsonl", false, &rt);
  EXPECT_GE(n, 17000u);
  std::cout << "[ info ] compared " << n << " code point sweep strings; round trip on " << rt
            << "\n";
}

TEST(TokenizerParity, DecodeRandomIds) {
  QRUN_REQUIRE_QWEN3_TOKENIZER();
  const auto& tok = qwen3();
  auto rows = read_jsonl("decode.jsonl");
  EXPECT_GE(rows.size(), 3000u);
  size_t bad = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto ids = rows[i]["ids"].get<std::vector<int32_t>>();
    for (bool skip : {false, true}) {
      const std::string want = rows[i][skip ? "decoded_skip" : "decoded"].get<std::string>();
      const std::string got = tok.decode(ids, skip);
      if (got != want && ++bad <= 10) {
        ADD_FAILURE() << "decode.jsonl line " << i + 1 << " skip_special=" << skip
                      << ": want " << json(want).dump() << " got " << json(got).dump();
      }
    }
  }
  EXPECT_EQ(bad, 0u);
}

TEST(Tokenizer, Vocabulary) {
  QRUN_REQUIRE_QWEN3_TOKENIZER();
  const auto& tok = qwen3();
  EXPECT_EQ(tok.vocab_size(), 151669);
  EXPECT_EQ(tok.id_end(), 151669);
  EXPECT_EQ(tok.token_to_id("<|endoftext|>"), 151643);
  EXPECT_EQ(tok.token_to_id("<|im_start|>"), 151644);
  EXPECT_EQ(tok.token_to_id("<|im_end|>"), 151645);
  EXPECT_EQ(tok.token_to_id("<think>"), 151667);
  EXPECT_EQ(tok.token_to_id("Ġthe"), 279);
  EXPECT_EQ(tok.token_to_id("no such token"), std::nullopt);
  EXPECT_EQ(tok.id_to_token(279), "Ġthe");
  EXPECT_EQ(tok.id_to_token(151645), "<|im_end|>");
  EXPECT_EQ(tok.id_to_token(-1), std::nullopt);
  EXPECT_EQ(tok.id_to_token(151669), std::nullopt);
  EXPECT_TRUE(tok.is_special(151645));
  EXPECT_FALSE(tok.is_special(151667));  // <think> is an added, non-special token
  EXPECT_FALSE(tok.is_special(279));
  EXPECT_EQ(tok.token_bytes(279), " the");
}

TEST(Tokenizer, SpecialTokens) {
  QRUN_REQUIRE_QWEN3_TOKENIZER();
  const auto& tok = qwen3();
  EXPECT_EQ(tok.encode("hello <|im_start|> world"),
            (std::vector<int32_t>{14990, 220, 151644, 1879}));
  EXPECT_EQ(tok.encode("hello <|im_start|> world <think>", false),
            (std::vector<int32_t>{14990, 82639, 318, 4906, 91, 29, 1879, 220, 151667}));
  EXPECT_EQ(tok.decode({14990, 220, 151644, 1879}, true), "hello  world");
}

TEST(Tokenizer, InvalidUtf8IsAnError) {
  QRUN_REQUIRE_QWEN3_TOKENIZER();
  const auto& tok = qwen3();
  for (auto [text, msg] : std::vector<std::pair<std::string, std::string>>{
           {"\xff", "text is not valid UTF-8 at byte 0 (of 1)"},
           {"abc\xc3", "text is not valid UTF-8 at byte 3 (of 4)"},
           {"ab\xed\xa0\x80z", "text is not valid UTF-8 at byte 2 (of 6)"},  // surrogate
           {"\xc0\xaf", "text is not valid UTF-8 at byte 0 (of 2)"}}) {       // overlong
    try {
      tok.encode(text);
      ADD_FAILURE() << "no error for a text of " << text.size() << " bytes";
    } catch (const qrun::UserError& e) {
      EXPECT_EQ(std::string(e.what()), msg);
    }
  }
  EXPECT_THROW(tok.decode({151669}), qrun::UserError);
  EXPECT_THROW(tok.decode({-5}), qrun::UserError);
}

TEST(Tokenizer, Utf8Lossy) {
  EXPECT_EQ(utf8_lossy("ok"), "ok");
  EXPECT_EQ(utf8_lossy("a\xffz"), "a\xEF\xBF\xBDz");
  // maximal subparts: E1 80 (truncated 3-byte) is one U+FFFD; lone continuation bytes one each
  EXPECT_EQ(utf8_lossy("\xE1\x80" "A\x80\x80"), "\xEF\xBF\xBD" "A\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"), "\xEF\xBF\xBD");
  EXPECT_EQ(first_invalid_utf8("héllo"), std::string_view::npos);
  EXPECT_EQ(first_invalid_utf8("h\xe9llo"), 1u);
}

TEST(Tokenizer, ThreadsAgreeWithSerial) {
  QRUN_REQUIRE_QWEN3_TOKENIZER();
  const auto& tok = qwen3();
  auto rows = read_jsonl("strings.jsonl");
  std::vector<std::string> texts;
  for (size_t i = 0; i < rows.size() && i < 4000; ++i) texts.push_back(rows[i]["text"]);
  auto serial = tok.encode_batch(texts, 1);
  auto par = tok.encode_batch(texts, 4);
  ASSERT_EQ(serial.size(), par.size());
  for (size_t i = 0; i < serial.size(); ++i) ASSERT_EQ(serial[i], par[i]) << "text " << i;
}

TEST(Tokenizer, SpansCoverText) {
  QRUN_REQUIRE_QWEN3_TOKENIZER();
  const auto& tok = qwen3();
  const std::string text = "Hello <|im_start|>user\n世界 e\xCC\x81x café  \r\n\tend";
  std::vector<int32_t> ids;
  std::vector<TokenSpan> spans;
  tok.encode_into(text, ids, &spans);
  ASSERT_EQ(ids.size(), spans.size());
  EXPECT_EQ(ids, tok.encode(text));
  EXPECT_EQ(spans.front().begin, 0u);
  EXPECT_EQ(spans.back().end, text.size());
  for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].end, spans[i].end);
  // Exact spans before the NFC-changed part.
  EXPECT_EQ(text.substr(spans[0].begin, spans[0].end - spans[0].begin), "Hello");
  EXPECT_EQ(ids[2], 151644);
  EXPECT_EQ(text.substr(spans[2].begin, spans[2].end - spans[2].begin), "<|im_start|>");
}

}  // namespace
}  // namespace qrun::tok::test

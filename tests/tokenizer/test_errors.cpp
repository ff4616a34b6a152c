// Loading errors (exact messages) and features checked on small synthetic tokenizer.json files.
#include <gtest/gtest.h>
#include <qrun/sdk/error.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bpe_tokenizer.h"

namespace qrun::tok::test {
namespace {

using nlohmann::json;

std::string byte_symbol(int b) {
  auto keep = [](int x) { return (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174; };
  int n = 0;
  for (int x = 0; x < 256; ++x) {
    uint32_t cp = keep(x) ? x : 256 + n++;
    if (x == b) {
      std::string s;
      if (cp < 0x80) {
        s += static_cast<char>(cp);
      } else {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      }
      return s;
    }
  }
  return {};
}

// A tiny byte-level BPE: 256 byte symbols (id = byte), "ab" = 256, "abc" = 257, "Ġa" = 258,
// added tokens "<x>" (special, 300) and "ZZ" (normalized, non-special, 301).
json tiny(bool array_merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_symbol(b)] = b;
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  vocab["Ġa"] = 258;
  json merges = array_merges ? json::array({json::array({"a", "b"}), json::array({"ab", "c"}),
                                            json::array({"Ġ", "a"})})
                             : json::array({"a b", "ab c", "Ġ a"});
  return json{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens",
       json::array({json{{"id", 300}, {"content", "<x>"}, {"special", true},
                         {"normalized", false}, {"lstrip", false}, {"rstrip", false},
                         {"single_word", false}},
                    json{{"id", 301}, {"content", "ZZ"}, {"special", false},
                         {"normalized", true}}})},
      {"normalizer", json{{"type", "NFC"}}},
      {"pre_tokenizer", json{{"type", "ByteLevel"}, {"add_prefix_space", false},
                             {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", json{{"type", "ByteLevel"}}},
      {"model", json{{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                     {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                     {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                     {"vocab", vocab}, {"merges", merges}}}};
}

std::string load_error(const json& j) {
  try {
    BpeTokenizer::from_json_string(j.dump(), "t.json");
  } catch (const qrun::UserError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string temp_file(const std::string& name, const std::string& content) {
  auto p = std::filesystem::temp_directory_path() / name;
  std::ofstream(p, std::ios::binary) << content;
  return p.string();
}

TEST(TokenizerLoad, MissingFile) {
  try {
    BpeTokenizer::from_file("/nonexistent/qrun/tokenizer.json");
    FAIL() << "no error";
  } catch (const qrun::UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              "cannot open tokenizer file '/nonexistent/qrun/tokenizer.json': No such file or "
              "directory");
  }
  try {
    BpeTokenizer::from_dir("/nonexistent/qrun");
    FAIL() << "no error";
  } catch (const qrun::UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              "cannot open tokenizer file '/nonexistent/qrun/tokenizer.json': No such file or "
              "directory");
  }
}

TEST(TokenizerLoad, TruncatedJson) {
  std::string full = tiny(false).dump();
  std::string path = temp_file("qrun_tok_truncated.json", full.substr(0, 100));
  try {
    BpeTokenizer::from_file(path);
    FAIL() << "no error";
  } catch (const qrun::UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              "tokenizer file '" + path +
                  "' is not valid JSON (truncated or corrupt?): syntax error at byte 101");
  }
  std::filesystem::remove(path);
}

TEST(TokenizerLoad, UnsupportedModelType) {
  json j = tiny(false);
  j["model"]["type"] = "WordPiece";
  EXPECT_EQ(load_error(j),
            "tokenizer file 't.json': unsupported model.type = \"WordPiece\"; qrun supports "
            "\"BPE\"");
}

// A largest id far beyond the token count would size the dense id tables by it (found by the
// fuzzer: one id of 234,444,440 in a 300-token file asked for gigabytes).
TEST(TokenizerLoad, SparseIds) {
  json j = tiny(false);
  const int64_t n = static_cast<int64_t>(j["model"]["vocab"].size() + j["added_tokens"].size());
  j["model"]["vocab"]["ab"] = 234444440;
  EXPECT_EQ(load_error(j), fmt::format("tokenizer file 't.json': token ids reach 234444440 for {} "
                                       "tokens; ids must be dense (qrun allows at most 65536 unused "
                                       "ids below the largest)", n));
  j = tiny(false);
  j["model"]["vocab"]["ab"] = n - 1 + 65535;  // the most unused ids allowed: loads
  EXPECT_EQ(load_error(j), "(no error)");
}

TEST(TokenizerLoad, OtherUnsupportedFeatures) {
  json j = tiny(false);
  j["normalizer"] = json{{"type", "NFKC"}};
  EXPECT_EQ(load_error(j),
            "tokenizer file 't.json': unsupported normalizer.type = \"NFKC\"; qrun supports null, "
            "\"NFC\" or a Sequence of those");
  j = tiny(false);
  j["pre_tokenizer"] = json{{"type", "Metaspace"}};
  EXPECT_EQ(load_error(j),
            "tokenizer file 't.json': unsupported pre_tokenizer.type = \"Metaspace\"; qrun "
            "supports Split, ByteLevel or a Sequence of those");
  j = tiny(false);
  j["added_tokens"][0]["lstrip"] = true;
  EXPECT_EQ(load_error(j),
            "tokenizer file 't.json': unsupported added_tokens[0].lstrip = true; qrun supports "
            "false");
  j = tiny(false);
  j["padding"] = json{{"strategy", "BatchLongest"}};
  EXPECT_EQ(load_error(j),
            "tokenizer file 't.json': unsupported padding = {\"strategy\":\"BatchLongest\"}; "
            "qrun supports null (qrun truncates and pads in its collators)");
  j = tiny(false);
  j["decoder"] = nullptr;
  EXPECT_EQ(load_error(j),
            "tokenizer file 't.json': unsupported decoder.type = null; qrun supports "
            "\"ByteLevel\"");
  j = tiny(false);
  j["model"]["byte_fallback"] = true;
  EXPECT_EQ(load_error(j),
            "tokenizer file 't.json': unsupported model.byte_fallback = true; qrun supports "
            "false");
  j = tiny(false);
  j["post_processor"] = json{{"type", "TemplateProcessing"}};
  EXPECT_EQ(load_error(j),
            "tokenizer file 't.json': unsupported post_processor.type = \"TemplateProcessing\"; "
            "qrun supports null or \"ByteLevel\"");
  j = tiny(false);
  j["model"]["merges"].push_back("q zz");
  EXPECT_EQ(load_error(j),
            "tokenizer file 't.json': model.merges[3] = \"q zz\" uses a token that is not in "
            "model.vocab");
  j = tiny(false);
  j["model"]["vocab"].erase("a");
  EXPECT_EQ(load_error(j),
            "tokenizer file 't.json': model.vocab lacks the byte-level symbol \"a\" for byte "
            "0x61; qrun supports byte-level BPE vocabularies that cover all 256 bytes");
  j = tiny(false);
  j["pre_tokenizer"] = json{
      {"type", "Sequence"},
      {"pretokenizers", json::array({json{{"type", "Split"},
                                          {"pattern", json{{"Regex", "(unclosed"}}},
                                          {"behavior", "Isolated"},
                                          {"invert", false}},
                                     json{{"type", "ByteLevel"}, {"use_regex", false}}})}};
  EXPECT_EQ(load_error(j),
            "tokenizer file 't.json': pre_tokenizer Split pattern \"(unclosed\" does not compile "
            "with PCRE2 at offset 9: missing closing parenthesis");
  EXPECT_EQ(load_error(json::array()), "tokenizer file 't.json': top level is not a JSON object");
}

TEST(TokenizerSynthetic, MergeFormatsAgree) {
  auto a = BpeTokenizer::from_json_string(tiny(false).dump(), "a");
  auto b = BpeTokenizer::from_json_string(tiny(true).dump(), "b");
  for (std::string s : {"abc abc", "ab<x>c", "xabcab a", "", "ZZ aZZb", "é e\xCC\x81"}) {
    EXPECT_EQ(a.encode(s), b.encode(s)) << s;
    EXPECT_EQ(a.decode(a.encode(s)), s == "é e\xCC\x81" ? "é é" : s);
  }
  // " abc": (a,b) has the lowest rank, then (ab,c); (Ġ,a) never gets a chance.
  EXPECT_EQ(a.encode("abc abc"), (std::vector<int32_t>{257, ' ', 257}));
  EXPECT_EQ(a.encode(" ax"), (std::vector<int32_t>{258, 'x'}));
  EXPECT_EQ(a.encode("ab<x>c"), (std::vector<int32_t>{256, 300, 'c'}));
  EXPECT_EQ(a.encode("ab<x>c", false), (std::vector<int32_t>{256, '<', 'x', '>', 'c'}));
  EXPECT_EQ(a.encode("aZZb"), (std::vector<int32_t>{'a', 301, 'b'}));
  EXPECT_EQ(a.vocab_size(), 261);
}

TEST(TokenizerSynthetic, IgnoreMerges) {
  json j = tiny(false);
  j["model"]["vocab"]["Ġabc"] = 259;  // reachable only as a whole word with ignore_merges
  auto plain = BpeTokenizer::from_json_string(j.dump(), "p");
  EXPECT_EQ(plain.encode(" abc"), (std::vector<int32_t>{' ', 257}));
  j["model"]["ignore_merges"] = true;
  auto im = BpeTokenizer::from_json_string(j.dump(), "i");
  EXPECT_EQ(im.encode(" abc"), (std::vector<int32_t>{259}));
}

}  // namespace
}  // namespace qrun::tok::test

// Shared helpers for the tokenizer tests.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bpe_tokenizer.h"

namespace qrun::tok::test {

// Folder with the Qwen3 tokenizer.json / tokenizer_config.json (the repo's data/tokenizers/qwen3).
inline std::string tokenizer_dir() { return QRUN_TEST_TOKENIZER_DIR; }
// Folder where the ctest fixture-setup tests write the HF reference files.
inline std::string fixture_dir() { return QRUN_TEST_FIXTURE_DIR; }

inline bool tokenizer_present() {
  return std::filesystem::exists(std::filesystem::path(tokenizer_dir()) / "tokenizer.json");
}

// The Qwen3 tokenizer, loaded once. Only call after checking tokenizer_present().
inline const BpeTokenizer& qwen3() {
  static const BpeTokenizer tok = BpeTokenizer::from_dir(tokenizer_dir());
  return tok;
}

// The repo ships the tokenizer, so a missing file is a broken checkout: the test fails.
#define QRUN_REQUIRE_QWEN3_TOKENIZER()                                                      \
  ASSERT_TRUE(::qrun::tok::test::tokenizer_present())                                       \
      << "the Qwen3 tokenizer folder " << ::qrun::tok::test::tokenizer_dir()                \
      << " has no tokenizer.json (the repo ships it in data/tokenizers/qwen3)"

// Reads a JSONL fixture; fails the test if it is missing.
inline std::vector<nlohmann::json> read_jsonl(const std::string& name) {
  std::vector<nlohmann::json> out;
  std::string path = fixture_dir() + "/" + name;
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << "fixture " << path
                        << " is missing: run the ctest fixture setup (tokenizer_fixtures)";
  std::string line;
  while (std::getline(f, line)) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

inline std::string show(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace qrun::tok::test

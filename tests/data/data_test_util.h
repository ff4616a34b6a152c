// data_test_util.h - helpers shared by the data tests and the collator benchmark.
#pragma once

#include <qrun/sdk/data.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace qrun::testing {

// Byte-level tokenizer with the two ChatML specials (256, 257): no files needed.
class ByteTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view t, bool parse_special = true) const override {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < t.size();) {
      if (parse_special && t.substr(i, 12) == "<|im_start|>") {
        ids.push_back(256);
        i += 12;
      } else if (parse_special && t.substr(i, 10) == "<|im_end|>") {
        ids.push_back(257);
        i += 10;
      } else {
        ids.push_back(static_cast<unsigned char>(t[i++]));
      }
    }
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const override {
    std::string s;
    for (int32_t i : ids) {
      if (i == 256) s += skip_special ? "" : "<|im_start|>";
      else if (i == 257) s += skip_special ? "" : "<|im_end|>";
      else s += static_cast<char>(i);
    }
    return s;
  }
  std::optional<int32_t> token_to_id(std::string_view t) const override {
    if (t == "<|im_start|>") return 256;
    if (t == "<|im_end|>") return 257;
    if (t.size() == 1) return static_cast<unsigned char>(t[0]);
    return std::nullopt;
  }
  int64_t vocab_size() const override { return 258; }
};

// An ExampleStream over a vector; the cursor is the index.
class VectorStream : public ExampleStream {
 public:
  explicit VectorStream(const std::vector<Example>& xs, size_t start = 0) : xs_(xs), i_(start) {}
  std::optional<Example> next() override {
    if (i_ >= xs_.size()) return std::nullopt;
    return xs_[i_++];
  }
  std::string cursor() const override { return std::to_string(i_); }

 private:
  const std::vector<Example>& xs_;
  size_t i_;
};

// An example of `len` tokens; labels: the first `prompt` tokens -100, the rest = ids.
inline Example make_example(int64_t id, int64_t len, int64_t prompt = 0) {
  Example e;
  e.id = id;
  for (int64_t t = 0; t < len; t++) {
    e.input_ids.push_back(static_cast<int32_t>(1000 * (id + 1) + t));
    e.labels.push_back(t < prompt ? -100 : static_cast<int32_t>(1000 * (id + 1) + t));
  }
  return e;
}

// Chat-like token lengths (UltraChat-200k-like: median ~1.1k tokens, long tail to 8k+).
inline std::vector<int64_t> chat_like_lengths(size_t n, uint64_t seed = 0) {
  std::mt19937_64 g(seed);
  std::lognormal_distribution<double> d(6.95, 0.65);
  std::vector<int64_t> out;
  for (size_t i = 0; i < n; i++) {
    double x = d(g);
    out.push_back(std::max<int64_t>(24, std::min<int64_t>(12000, static_cast<int64_t>(x))));
  }
  return out;
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

}  // namespace qrun::testing

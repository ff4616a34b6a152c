// test_hf.cpp - hf-tokenizer and chatml on the real Qwen3 tokenizer files the repository ships
// under data/tokenizers/qwen3 (a missing file fails the test).
#include "data_test_util.h"
#include "hf_format.h"

#include <gtest/gtest.h>

#include <filesystem>

using namespace qrun;
using namespace qrun::chatdata;

namespace {
const std::string kRepoCopy = QRUN_REPO_TOKENIZER_DIR;
}  // namespace

TEST(HfTokenizer, MatchesTheBpeLibraryAndRendersChatMl) {
  const std::string dir = kRepoCopy;
  ASSERT_TRUE(std::filesystem::exists(dir + "/tokenizer.json")) << "no Qwen3 tokenizer at " << dir;
  HfTokenizer tok(dir);
  HfTokenizer tok_file(dir + "/tokenizer.json");
  auto bpe = tok::BpeTokenizer::from_dir(dir);
  for (std::string s : {"Hello world", "  leading spaces\n\n", "数字 12345 and émoji 😀", "<|im_end|>"}) {
    EXPECT_EQ(tok.encode(s), bpe.encode(s));
    EXPECT_EQ(tok_file.encode(s), bpe.encode(s));
    EXPECT_EQ(tok.decode(tok.encode(s)), s);
  }
  EXPECT_EQ(tok.token_to_id("<|im_end|>"), 151645);
  EXPECT_EQ(tok.vocab_size(), bpe.vocab_size());

  ChatMlFormat chat;
  std::vector<Message> conv = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}};
  Example e = chat.render(conv, tok, LossOn::Assistant);
  tok::Qwen3ChatFormat q;
  auto ref = q.tokenize(bpe, {{"system", "Be brief.", {}}, {"user", "Hi", {}}, {"assistant", "Hello!", {}}});
  EXPECT_EQ(e.input_ids, ref.ids);
  EXPECT_EQ(e.labels, ref.labels);
  EXPECT_EQ(tok.decode(e.input_ids),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n");
  std::vector<int32_t> trained;
  for (size_t i = 0; i < e.labels.size(); i++)
    if (e.labels[i] != -100) trained.push_back(e.input_ids[i]);
  EXPECT_EQ(tok.decode(trained), "<think>\n\n</think>\n\nHello!<|im_end|>");
  Example all = chat.render(conv, tok, LossOn::All);
  EXPECT_EQ(all.labels, all.input_ids);
  EXPECT_THROW(chat.render({{"user", "x"}}, tok, LossOn::Assistant), UserError);
}

TEST(HfTokenizer, GenericTokenizerPathSplitsAtMaskBoundaries) {
  qrun::testing::ByteTokenizer tok;
  ChatMlFormat chat;
  Example e = chat.render({{"user", "Hi"}, {"assistant", "Yo"}}, tok, LossOn::Assistant);
  EXPECT_EQ(tok.decode(e.input_ids),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nYo<|im_end|>\n");
  std::vector<int32_t> trained;
  for (size_t i = 0; i < e.labels.size(); i++)
    if (e.labels[i] != -100) trained.push_back(e.input_ids[i]);
  EXPECT_EQ(tok.decode(trained), "<think>\n\n</think>\n\nYo<|im_end|>");
}

TEST(HfTokenizer, MissingFilesAreUserErrors) {
  EXPECT_THROW(HfTokenizer("/nonexistent/tokenizer"), UserError);
  EXPECT_THROW(HfTokenizer(std::filesystem::temp_directory_path().string()), UserError);
}

// hf_format.h - `hf-tokenizer` (tokenizer) and `chatml` (chat_format): the SDK faces of the
// byte-level BPE tokenizer and the Qwen3 ChatML renderer of plugins/tokenizer (qrun::tok).
#pragma once

#include <qrun/sdk/config.h>
#include <qrun/sdk/data.h>

#include "bpe_tokenizer.h"
#include "chat_template.h"

namespace qrun::chatdata {

class HfTokenizer : public Tokenizer {
 public:
  // `path`: a folder holding tokenizer.json, or the file itself.
  explicit HfTokenizer(const std::string& path);
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const override {
    return tok_.encode(text, parse_special);
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const override {
    return tok_.decode(ids, skip_special);
  }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    return tok_.token_to_id(token);
  }
  int64_t vocab_size() const override { return tok_.vocab_size(); }
  const tok::BpeTokenizer& bpe() const { return tok_; }

 private:
  static tok::BpeTokenizer load(const std::string& path);
  tok::BpeTokenizer tok_;
};

// Qwen3 ChatML. With an hf-tokenizer the rendered text is tokenized in one piece (exactly as
// transformers' apply_chat_template); with another Tokenizer the text is tokenized piece by piece
// at the loss-mask boundaries (the ids can then differ where a token would straddle a boundary).
class ChatMlFormat : public ChatFormat {
 public:
  Example render(const std::vector<Message>& conversation, const Tokenizer& tokenizer,
                 LossOn loss_on) const override;

 private:
  tok::Qwen3ChatFormat fmt_;
};

Schema hf_tokenizer_schema();
Schema chatml_schema();

}  // namespace qrun::chatdata

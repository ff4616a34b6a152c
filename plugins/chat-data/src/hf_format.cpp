// hf_format.cpp - see hf_format.h.
#include "hf_format.h"

#include <filesystem>

namespace fs = std::filesystem;

namespace qrun::chatdata {

Schema hf_tokenizer_schema() {
  return Schema{Field::path("path").require().doc(
      "folder with a Hugging Face tokenizer.json (or the file itself)")};
}
Schema chatml_schema() { return Schema{}; }

tok::BpeTokenizer HfTokenizer::load(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    QRUN_CHECK(fs::is_regular_file(fs::path(path) / "tokenizer.json", ec),
               "tokenizer folder {} has no tokenizer.json (a Hugging Face model folder has one; "
               "data/tokenizers/qwen3 in the qrun repository is a ready one)",
               path);
    return tok::BpeTokenizer::from_dir(path);
  }
  QRUN_CHECK(fs::exists(path, ec),
             "tokenizer path {} does not exist (give a folder with tokenizer.json, e.g. "
             "data/tokenizers/qwen3)",
             path);
  return tok::BpeTokenizer::from_file(path);
}

HfTokenizer::HfTokenizer(const std::string& path) : tok_(load(path)) {}

Example ChatMlFormat::render(const std::vector<Message>& conversation, const Tokenizer& tokenizer,
                             LossOn loss_on) const {
  std::vector<tok::ChatMessage> msgs;
  msgs.reserve(conversation.size());
  for (const auto& m : conversation) msgs.push_back(tok::ChatMessage{m.role, m.content, std::nullopt});
  tok::ChatOptions o;
  o.loss_mask = loss_on == LossOn::All ? tok::LossMask::AllTokens : tok::LossMask::AssistantOnly;
  Example ex;
  if (auto* hf = dynamic_cast<const HfTokenizer*>(&tokenizer)) {
    tok::ChatTokens t = fmt_.tokenize(hf->bpe(), msgs, o);
    ex.input_ids = std::move(t.ids);
    ex.labels = std::move(t.labels);
    return ex;
  }
  tok::RenderedChat r = fmt_.render(msgs, o);
  std::vector<std::pair<size_t, size_t>> trained = r.trained;
  if (loss_on == LossOn::All) trained = {{0, r.text.size()}};
  size_t at = 0;
  auto emit = [&](size_t b, size_t e, bool train) {
    if (e <= b) return;
    auto ids = tokenizer.encode(std::string_view(r.text).substr(b, e - b), true);
    for (int32_t id : ids) {
      ex.input_ids.push_back(id);
      ex.labels.push_back(train ? id : static_cast<int32_t>(kIgnoreIndex));
    }
  };
  for (auto [b, e] : trained) {
    emit(at, b, false);
    emit(b, e, true);
    at = e;
  }
  emit(at, r.text.size(), false);
  return ex;
}

}  // namespace qrun::chatdata

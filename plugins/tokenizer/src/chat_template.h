// chat_template.h - chat conversations -> token ids + loss labels.
//
// ChatFormat is the interface; Qwen3ChatFormat renders the Qwen3 ChatML template (the
// `chat_template` of Qwen3's tokenizer_config.json) by hand, without Jinja, and produces exactly
// the ids of transformers' `tokenizer.apply_chat_template(messages, tokenize=True)` for
// conversations without tools (checked by tests/tokenizer on >= 1,000 generated conversations).
//
// Rendering (Qwen3 template, no tools):
//   * a leading system message:  <|im_start|>system\n{content}<|im_end|>\n
//   * user (and non-leading system) messages: <|im_start|>{role}\n{content}<|im_end|>\n
//   * assistant:  <|im_start|>assistant\n{body}<|im_end|>\n  where, as in the template:
//       - if reasoning_content is set it is the reasoning; otherwise, if content contains
//         "</think>", reasoning = the text between the last "<think>" and the first "</think>"
//         (newlines trimmed) and content = the text after the last "</think>" (leading newlines
//         trimmed);
//       - for assistant messages after the last real user query (a user message that is not a
//         wrapped tool response), body = "<think>\n{reasoning}\n</think>\n\n{content}" when the
//         message is the last one or its reasoning is non-empty; otherwise body = content (the
//         reasoning of earlier turns is dropped).
//   * tool messages: consecutive ones are grouped in one user turn:
//       <|im_start|>user\n<tool_response>\n{content}\n</tool_response>...<|im_end|>\n
//   * add_generation_prompt: <|im_start|>assistant\n (+ "<think>\n\n</think>\n\n" when
//     enable_thinking == false).
//   The rendered text is tokenized as one string with special tokens parsed (as transformers
//   does): text such as "<|im_end|>" inside a message becomes that special token.
//
// Labels (same length as ids, aligned with them, NOT shifted: the loss shifts them):
//   labels[i] = ids[i] for trained tokens, -100 otherwise.
//   * LossMask::AssistantOnly (default): trained are, for every assistant message, the tokens
//     from right after "<|im_start|>assistant\n" up to and including its "<|im_end|>" token: the
//     rendered body (including a template-inserted "<think>\n...\n</think>\n\n" block, even an
//     empty one) and the end-of-turn token. Not trained: "<|im_start|>", the role name, the "\n"
//     after the role, the "\n" after "<|im_end|>", all system/user/tool turns, and the
//     generation prompt. A token that straddles the start of the trained span (the header's "\n"
//     merged with newlines starting the body, e.g. "\n\n" -> one token) is trained.
//   * LossMask::AllTokens: every token is trained.
//
// Invalid conversations throw qrun::UserError (the caller adds file/row context): empty
// conversation, unknown role (allowed: system, user, assistant, tool), invalid UTF-8 content, and
// in AssistantOnly mode a conversation without an assistant message.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bpe_tokenizer.h"

namespace qrun::tok {

inline constexpr int32_t kIgnoreIndex = -100;

struct ChatMessage {
  std::string role;     // "system", "user", "assistant" or "tool"
  std::string content;
  std::optional<std::string> reasoning_content;  // assistant only; as the template's field
};

enum class LossMask { AssistantOnly, AllTokens };

struct ChatOptions {
  LossMask loss_mask = LossMask::AssistantOnly;
  bool add_generation_prompt = false;
  std::optional<bool> enable_thinking;  // only used with add_generation_prompt
};

struct ChatTokens {
  std::vector<int32_t> ids;
  std::vector<int32_t> labels;  // kIgnoreIndex where not trained
  int64_t num_trained = 0;      // count of labels != kIgnoreIndex
};

// Rendered text plus the byte ranges [begin, end) of the text to train on.
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> trained;
};

// A chat format (template family). Implementations are immutable and thread-safe.
class ChatFormat {
 public:
  virtual ~ChatFormat() = default;
  virtual std::string name() const = 0;
  // Renders the conversation; throws qrun::UserError for invalid conversations.
  virtual RenderedChat render(const std::vector<ChatMessage>& messages,
                              const ChatOptions& options) const = 0;
  // Renders and tokenizes with `tok`; labels per the options' loss mask.
  ChatTokens tokenize(const BpeTokenizer& tok, const std::vector<ChatMessage>& messages,
                      const ChatOptions& options = {}) const;
};

// The Qwen3 ChatML template (see the top of this file).
class Qwen3ChatFormat : public ChatFormat {
 public:
  std::string name() const override { return "qwen3"; }
  RenderedChat render(const std::vector<ChatMessage>& messages,
                      const ChatOptions& options) const override;
};

}  // namespace qrun::tok

// chat_template.cpp - see chat_template.h.
#include "chat_template.h"

#include <qrun/sdk/error.h>

#include <string_view>

namespace qrun::tok {

namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}
std::string_view lstrip_nl(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
std::string_view rstrip_nl(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}
// Python s.split(sep)[0] and s.split(sep)[-1].
std::string_view split_first(std::string_view s, std::string_view sep) {
  size_t p = s.find(sep);
  return p == std::string_view::npos ? s : s.substr(0, p);
}
std::string_view split_last(std::string_view s, std::string_view sep) {
  size_t p = s.rfind(sep);
  return p == std::string_view::npos ? s : s.substr(p + sep.size());
}

void validate(const std::vector<ChatMessage>& messages, const ChatOptions& options) {
  if (messages.empty()) throw UserError("conversation is empty");
  bool has_assistant = false;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
      throw UserError(fmt::format(
          "message {} has unknown role \"{}\"; allowed roles: system, user, assistant, tool", i,
          m.role));
    }
    size_t bad = first_invalid_utf8(m.content);
    if (bad != std::string::npos) {
      throw UserError(fmt::format("message {} ({}) content is not valid UTF-8 at byte {}", i,
                                  m.role, bad));
    }
    if (m.reasoning_content) {
      bad = first_invalid_utf8(*m.reasoning_content);
      if (bad != std::string::npos) {
        throw UserError(fmt::format(
            "message {} ({}) reasoning_content is not valid UTF-8 at byte {}", i, m.role, bad));
      }
    }
    has_assistant = has_assistant || m.role == "assistant";
  }
  if (options.loss_mask == LossMask::AssistantOnly && !has_assistant) {
    throw UserError(
        "conversation has no assistant message, so nothing would be trained (loss mask: "
        "assistant turns only)");
  }
}

}  // namespace

RenderedChat Qwen3ChatFormat::render(const std::vector<ChatMessage>& messages,
                                     const ChatOptions& options) const {
  validate(messages, options);
  RenderedChat r;
  std::string& out = r.text;
  size_t total = 0;
  for (const auto& m : messages) total += m.content.size() + 64;
  out.reserve(total);

  const size_t n = messages.size();
  if (messages[0].role == "system") {
    out += "<|im_start|>system\n";
    out += messages[0].content;
    out += "<|im_end|>\n";
  }
  // Index of the last real user query (not a wrapped tool response).
  size_t last_query = n - 1;
  for (size_t k = n; k-- > 0;) {
    const auto& m = messages[k];
    if (m.role == "user" &&
        !(starts_with(m.content, "<tool_response>") && ends_with(m.content, "</tool_response>"))) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const auto& m = messages[i];
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      out += "<|im_start|>";
      out += m.role;
      out += '\n';
      out += m.content;
      out += "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string_view content = m.content;
      std::string_view reasoning;
      if (m.reasoning_content) {
        reasoning = *m.reasoning_content;
      } else if (content.find("</think>") != std::string_view::npos) {
        std::string_view full = m.content;
        content = lstrip_nl(split_last(full, "</think>"));
        reasoning = lstrip_nl(split_last(rstrip_nl(split_first(full, "</think>")), "<think>"));
      }
      out += "<|im_start|>assistant\n";
      const size_t body_start = out.size();
      if (i > last_query && (i == n - 1 || !reasoning.empty())) {
        out += "<think>\n";
        out += rstrip_nl(lstrip_nl(reasoning));
        out += "\n</think>\n\n";
        out += lstrip_nl(content);
      } else {
        out += content;
      }
      out += "<|im_end|>";
      r.trained.emplace_back(body_start, out.size());
      out += '\n';
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n";
      out += m.content;
      out += "\n</tool_response>";
      if (i == n - 1 || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    }
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (options.enable_thinking.has_value() && !*options.enable_thinking) {
      out += "<think>\n\n</think>\n\n";
    }
  }
  if (options.loss_mask == LossMask::AllTokens) {
    r.trained.assign(1, {0, out.size()});
  }
  return r;
}

ChatTokens ChatFormat::tokenize(const BpeTokenizer& tok, const std::vector<ChatMessage>& messages,
                                const ChatOptions& options) const {
  RenderedChat r = render(messages, options);
  ChatTokens t;
  std::vector<TokenSpan> spans;
  t.ids.reserve(r.text.size() / 3 + 8);
  spans.reserve(r.text.size() / 3 + 8);
  tok.encode_into(r.text, t.ids, &spans, /*parse_special=*/true);
  t.labels.assign(t.ids.size(), kIgnoreIndex);
  size_t k = 0;  // trained ranges are sorted and disjoint; spans are non-decreasing
  for (size_t i = 0; i < t.ids.size(); ++i) {
    const size_t b = spans[i].begin, e = spans[i].end;
    while (k < r.trained.size() && r.trained[k].second <= b) ++k;
    if (k == r.trained.size()) break;
    const auto [s, x] = r.trained[k];
    bool hit = (b < e) ? (b < x && e > s) : (s <= b && b < x);
    if (hit) {
      t.labels[i] = t.ids[i];
      ++t.num_trained;
    }
  }
  return t;
}

}  // namespace qrun::tok

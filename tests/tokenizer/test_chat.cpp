// Chat template parity with transformers' apply_chat_template, and loss masks token by token.
#include <gtest/gtest.h>
#include <qrun/sdk/error.h>

#include "chat_template.h"
#include "test_util.h"

namespace qrun::tok::test {
namespace {

using nlohmann::json;

std::vector<ChatMessage> to_messages(const json& msgs) {
  std::vector<ChatMessage> out;
  for (const auto& m : msgs) {
    ChatMessage cm{m["role"].get<std::string>(), m["content"].get<std::string>(), std::nullopt};
    if (m.contains("reasoning_content")) cm.reasoning_content = m["reasoning_content"];
    out.push_back(std::move(cm));
  }
  return out;
}

TEST(ChatParity, GeneratedConversations) {
  QRUN_REQUIRE_QWEN3_TOKENIZER();
  const auto& tok = qwen3();
  Qwen3ChatFormat fmt;
  auto rows = read_jsonl("chat.jsonl");
  EXPECT_GE(rows.size(), 1000u);
  size_t bad = 0, with_assistant = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    auto msgs = to_messages(r["messages"]);
    ChatOptions opt;
    opt.add_generation_prompt = r["add_generation_prompt"].get<bool>();
    if (!r["enable_thinking"].is_null()) opt.enable_thinking = r["enable_thinking"].get<bool>();
    bool has_assistant = false;
    for (const auto& m : msgs) has_assistant = has_assistant || m.role == "assistant";
    with_assistant += has_assistant;
    opt.loss_mask = has_assistant ? LossMask::AssistantOnly : LossMask::AllTokens;
    const auto want = r["ids"].get<std::vector<int32_t>>();
    ChatTokens got = fmt.tokenize(tok, msgs, opt);
    if (got.ids != want && ++bad <= 5) {
      ADD_FAILURE() << "chat.jsonl line " << i + 1 << ": ids differ\n  rendered "
                    << json(fmt.render(msgs, opt).text).dump() << "\n  want " << show(want)
                    << "\n  got  " << show(got.ids);
    }
    ASSERT_EQ(got.labels.size(), got.ids.size());
    // Structural mask checks: every <|im_end|> closing an assistant turn is trained, every
    // <|im_start|> is not, and the count matches.
    // (Messages may contain "<|im_start|>" text, which is parsed as the special token, as in
    // transformers; the <|im_start|> check only applies when none does.)
    bool literal_specials = false;
    for (const auto& m : msgs) {
      literal_specials = literal_specials || m.content.find("<|im_start|>") != std::string::npos ||
                         m.content.find("<|im_end|>") != std::string::npos ||
                         (m.reasoning_content &&
                          (m.reasoning_content->find("<|im_start|>") != std::string::npos ||
                           m.reasoning_content->find("<|im_end|>") != std::string::npos));
    }
    int64_t trained = 0;
    for (size_t k = 0; k < got.ids.size(); ++k) {
      if (got.labels[k] != kIgnoreIndex) {
        ++trained;
        EXPECT_EQ(got.labels[k], got.ids[k]);
      }
      if (got.ids[k] == 151644 && has_assistant && !literal_specials) {
        EXPECT_EQ(got.labels[k], kIgnoreIndex) << "line " << i + 1;
      }
    }
    EXPECT_EQ(trained, got.num_trained);
    if (has_assistant) EXPECT_GT(trained, 0) << "line " << i + 1;
    // In assistant-only mode, a trained span starts right after "<|im_start|>assistant\n"
    // (<|im_start|> assistant \n), or right after "<|im_start|>assistant" when the header's
    // "\n" merged with the body's leading newlines into one (trained) token.
    if (has_assistant && !literal_specials) {
      for (size_t k = 1; k < got.ids.size(); ++k) {
        if (got.labels[k] != kIgnoreIndex && got.labels[k - 1] == kIgnoreIndex) {
          ASSERT_GE(k, 2u);
          bool after_header = k >= 3 && got.ids[k - 3] == 151644 && got.ids[k - 2] == 77091 &&
                              got.ids[k - 1] == 198;
          bool straddle = got.ids[k - 2] == 151644 && got.ids[k - 1] == 77091;
          EXPECT_TRUE(after_header || straddle) << "line " << i + 1 << " token " << k;
        }
        if (got.labels[k] == kIgnoreIndex && got.labels[k - 1] != kIgnoreIndex) {
          EXPECT_EQ(got.ids[k - 1], 151645) << "line " << i + 1 << " token " << k;  // im_end
        }
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "conversations with different ids";
  std::cout << "[ info ] compared " << rows.size() << " conversations with transformers ("
            << with_assistant << " with assistant turns)\n";
}

// Builds expected ids/labels from pieces: (text, trained). Pieces must be cut at added-token or
// segment boundaries where separate tokenization equals joint tokenization.
struct Expect {
  std::vector<int32_t> ids, labels;
  void add(const std::string& text, bool trained) {
    for (int32_t id : qwen3().encode(text)) {
      ids.push_back(id);
      labels.push_back(trained ? id : kIgnoreIndex);
    }
  }
};

TEST(ChatMask, SingleTurnLastAssistantGetsEmptyThinkBlock) {
  QRUN_REQUIRE_QWEN3_TOKENIZER();
  Qwen3ChatFormat fmt;
  auto t = fmt.tokenize(qwen3(), {{"user", "hi", {}}, {"assistant", "yo", {}}});
  EXPECT_EQ(t.ids, (std::vector<int32_t>{151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198,
                                         151667, 271, 151668, 271, 16032, 151645, 198}));
  const int32_t I = kIgnoreIndex;
  EXPECT_EQ(t.labels, (std::vector<int32_t>{I, I, I, I, I, I, I, I, I, 151667, 271, 151668, 271,
                                            16032, 151645, I}));
  EXPECT_EQ(t.num_trained, 6);
}

TEST(ChatMask, MultiTurnWithSystem) {
  QRUN_REQUIRE_QWEN3_TOKENIZER();
  Qwen3ChatFormat fmt;
  std::vector<ChatMessage> msgs = {{"system", "Be brief.", {}},
                                   {"user", "2+2?", {}},
                                   {"assistant", "<think>\nadd\n</think>\n\n4", {}},
                                   {"user", "и 3+3?", {}},
                                   {"assistant", "6 🎉", {}}};
  Expect e;
  e.add("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n", false);
  // earlier assistant turn: reasoning dropped (before the last user query), content trained
  e.add("<|im_start|>assistant\n", false);
  e.add("4<|im_end|>", true);
  e.add("\n<|im_start|>user\nи 3+3?<|im_end|>\n<|im_start|>assistant\n", false);
  e.add("<think>\n\n</think>\n\n6 🎉<|im_end|>", true);
  e.add("\n", false);
  auto t = fmt.tokenize(qwen3(), msgs);
  EXPECT_EQ(t.ids, e.ids);
  EXPECT_EQ(t.labels, e.labels);
  // All-tokens mode trains everything.
  ChatOptions all;
  all.loss_mask = LossMask::AllTokens;
  auto a = fmt.tokenize(qwen3(), msgs, all);
  EXPECT_EQ(a.ids, e.ids);
  EXPECT_EQ(a.labels, a.ids);
  EXPECT_EQ(a.num_trained, static_cast<int64_t>(a.ids.size()));
}

TEST(ChatMask, ReasoningAfterLastQueryIsKeptAndTrained) {
  QRUN_REQUIRE_QWEN3_TOKENIZER();
  Qwen3ChatFormat fmt;
  std::vector<ChatMessage> msgs = {{"user", "q", {}},
                                   {"assistant", "call", std::string("need a tool")},
                                   {"tool", "42", {}},
                                   {"assistant", "answer is 42", {}}};
  Expect e;
  e.add("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n", false);
  e.add("<think>\nneed a tool\n</think>\n\ncall<|im_end|>", true);
  e.add("\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n", false);
  e.add("<think>\n\n</think>\n\nanswer is 42<|im_end|>", true);
  e.add("\n", false);
  auto t = fmt.tokenize(qwen3(), msgs);
  EXPECT_EQ(t.ids, e.ids);
  EXPECT_EQ(t.labels, e.labels);
}

TEST(ChatMask, StraddlingNewlineTokenIsTrained) {
  QRUN_REQUIRE_QWEN3_TOKENIZER();
  Qwen3ChatFormat fmt;
  // Not the last turn after the query -> no think block; content starts with "\n", so the
  // header's "\n" and the content's "\n" form one token "\n\n" (271), which is trained.
  std::vector<ChatMessage> msgs = {{"user", "a", {}}, {"assistant", "\nb", {}}, {"user", "c", {}}};
  auto t = fmt.tokenize(qwen3(), msgs);
  Expect e;
  e.add("<|im_start|>user\na<|im_end|>\n<|im_start|>assistant", false);
  e.add("\n\nb<|im_end|>", true);
  e.add("\n<|im_start|>user\nc<|im_end|>\n", false);
  EXPECT_EQ(t.ids, e.ids);
  EXPECT_EQ(t.labels, e.labels);
  EXPECT_EQ(e.ids[8], 271);
}

TEST(ChatMask, GenerationPromptIsNotTrained) {
  QRUN_REQUIRE_QWEN3_TOKENIZER();
  Qwen3ChatFormat fmt;
  ChatOptions opt;
  opt.add_generation_prompt = true;
  opt.enable_thinking = false;
  std::vector<ChatMessage> msgs = {{"user", "a", {}}, {"assistant", "b", {}}, {"user", "c", {}}};
  auto t = fmt.tokenize(qwen3(), msgs, opt);
  Expect e;
  e.add("<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n", false);
  e.add("b<|im_end|>", true);
  e.add("\n<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", false);
  EXPECT_EQ(t.ids, e.ids);
  EXPECT_EQ(t.labels, e.labels);
}

TEST(ChatErrors, InvalidConversations) {
  Qwen3ChatFormat fmt;
  auto msg = [&](const std::vector<ChatMessage>& m, ChatOptions o = {}) -> std::string {
    try {
      fmt.render(m, o);
    } catch (const qrun::UserError& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_EQ(msg({}), "conversation is empty");
  EXPECT_EQ(msg({{"user", "a", {}}, {"bot", "b", {}}}),
            "message 1 has unknown role \"bot\"; allowed roles: system, user, assistant, tool");
  EXPECT_EQ(msg({{"system", "s", {}}, {"user", "a", {}}}),
            "conversation has no assistant message, so nothing would be trained (loss mask: "
            "assistant turns only)");
  ChatOptions all;
  all.loss_mask = LossMask::AllTokens;
  EXPECT_EQ(msg({{"user", "a", {}}}, all), "(no error)");
  EXPECT_EQ(msg({{"user", "a\xff", {}}, {"assistant", "b", {}}}),
            "message 0 (user) content is not valid UTF-8 at byte 1");
}

}  // namespace
}  // namespace qrun::tok::test

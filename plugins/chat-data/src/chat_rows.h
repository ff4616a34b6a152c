// chat_rows.h - one chat row -> a conversation, with the exact reason when the row is malformed.
//
// Shared by the JSONL and parquet readers so both report the same problems in the same words.
// A row is `{"messages": [{"role": ..., "content": ...}, ...], ...}`; other keys are ignored.
// Reasons (the dataset prefixes "file:row N: "):
//   invalid UTF-8 at byte N | invalid JSON: ... | row is not a JSON object | missing 'messages' |
//   'messages' is not a list (got T) | message I is not an object (got T) |
//   message I: missing 'role' | message I: 'role' is not a string (got T) |
//   message I: unknown role 'R' (allowed: system, user, assistant, tool) |
//   message I: missing 'content' | message I: 'content' is not a string (got T) |
//   message I: content is not valid UTF-8 at byte N | empty conversation | no assistant turn
// (I counts from 0, like the list index in the file.) "no assistant turn" applies only when the
// loss is on assistant turns: such a row has nothing to train on.
//
// No exceptions, no LibTorch, no Arrow: this is also the libFuzzer target's surface.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qrun::chatdata {

// Same fields as qrun::Message (sdk/data.h), kept here so this file needs no LibTorch header.
struct RowMessage {
  std::string role;
  std::string content;
};

// Parses one JSONL line into `out` (cleared first). Returns the reason when the row is malformed.
// Checks the structure only; call validate_conversation() next.
std::optional<std::string> parse_jsonl_row(std::string_view line, std::vector<RowMessage>& out);

// Content checks common to every source: roles, UTF-8, empty, assistant turn.
std::optional<std::string> validate_conversation(const std::vector<RowMessage>& conv,
                                                 bool assistant_only);

// Byte offset of the first invalid UTF-8 sequence, or npos.
size_t invalid_utf8_offset(std::string_view s);

bool is_known_role(std::string_view role);

}  // namespace qrun::chatdata

// chat_rows.cpp - see chat_rows.h.
#include "chat_rows.h"

#include <nlohmann/json.hpp>

#include <sstream>
#include <string>

namespace qrun::chatdata {
namespace {

// A minimal "{}" formatter: this file stays free of fmt so the fuzz target needs no LibTorch.
void fmt_rest(std::ostringstream& o, std::string_view f) { o << f; }
template <typename A, typename... R>
void fmt_rest(std::ostringstream& o, std::string_view f, const A& a, const R&... r) {
  size_t p = f.find("{}");
  if (p == std::string_view::npos) {
    o << f;
    return;
  }
  o << f.substr(0, p) << a;
  fmt_rest(o, f.substr(p + 2), r...);
}
template <typename... A>
std::string fmtx(std::string_view f, const A&... a) {
  std::ostringstream o;
  fmt_rest(o, f, a...);
  return o.str();
}

const char* json_type(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::object: return "object";
    case nlohmann::json::value_t::array: return "list";
    case nlohmann::json::value_t::string: return "string";
    case nlohmann::json::value_t::boolean: return "bool";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
    case nlohmann::json::value_t::number_float: return "number";
    default: return "other";
  }
}

// nlohmann's what() starts with "[json.exception.parse_error.101] "; keep the readable part.
std::string clean_json_error(const std::string& what) {
  auto p = what.find("] ");
  return p == std::string::npos ? what : what.substr(p + 2);
}

}  // namespace

size_t invalid_utf8_offset(std::string_view s) {
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    unsigned char c = b[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t len;
    uint32_t min;
    if ((c & 0xE0) == 0xC0) {
      len = 2, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, min = 0x10000;
    } else {
      return i;
    }
    if (i + len > n) return i;
    uint32_t cp = c & (0x7F >> len);
    for (size_t k = 1; k < len; k++) {
      if ((b[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (b[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

bool is_known_role(std::string_view r) {
  return r == "system" || r == "user" || r == "assistant" || r == "tool";
}

std::optional<std::string> parse_jsonl_row(std::string_view line, std::vector<RowMessage>& out) {
  out.clear();
  if (size_t bad = invalid_utf8_offset(line); bad != std::string_view::npos)
    return fmtx("invalid UTF-8 at byte {}", bad);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line.begin(), line.end());
  } catch (const nlohmann::json::exception& e) {
    return "invalid JSON: " + clean_json_error(e.what());
  }
  if (!j.is_object()) return std::string("row is not a JSON object");
  auto it = j.find("messages");
  if (it == j.end()) return std::string("missing 'messages'");
  if (!it->is_array()) return fmtx("'messages' is not a list (got {})", json_type(*it));
  out.reserve(it->size());
  size_t i = 0;
  for (const auto& m : *it) {
    if (!m.is_object()) return fmtx("message {} is not an object (got {})", i, json_type(m));
    auto r = m.find("role");
    if (r == m.end()) return fmtx("message {}: missing 'role'", i);
    if (!r->is_string())
      return fmtx("message {}: 'role' is not a string (got {})", i, json_type(*r));
    auto c = m.find("content");
    if (c == m.end()) return fmtx("message {}: missing 'content'", i);
    if (!c->is_string())
      return fmtx("message {}: 'content' is not a string (got {})", i, json_type(*c));
    out.push_back(RowMessage{r->get<std::string>(), c->get<std::string>()});
    i++;
  }
  return std::nullopt;
}

std::optional<std::string> validate_conversation(const std::vector<RowMessage>& conv,
                                                 bool assistant_only) {
  if (conv.empty()) return std::string("empty conversation");
  bool has_assistant = false;
  for (size_t i = 0; i < conv.size(); i++) {
    const RowMessage& m = conv[i];
    if (size_t bad = invalid_utf8_offset(m.role); bad != std::string_view::npos)
      return fmtx("message {}: role is not valid UTF-8 at byte {}", i, bad);
    if (!is_known_role(m.role))
      return fmtx("message {}: unknown role '{}' (allowed: system, user, assistant, tool)",
                         i, m.role);
    if (size_t bad = invalid_utf8_offset(m.content); bad != std::string_view::npos)
      return fmtx("message {}: content is not valid UTF-8 at byte {}", i, bad);
    has_assistant |= m.role == "assistant";
  }
  if (assistant_only && !has_assistant) return std::string("no assistant turn");
  return std::nullopt;
}

}  // namespace qrun::chatdata

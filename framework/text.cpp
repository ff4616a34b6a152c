#include "text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace qrun {

// Optimal-string-alignment distance: Levenshtein plus adjacent transpositions ("sdap" -> "sdpa"
// is one edit), the commonest typo in names.
size_t edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::string::npos;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  // Plausible typo: at most a third of the longer word, and at least one edit allowed.
  size_t limit = std::max<size_t>(1, std::max(word.size(), best.size()) / 3);
  return (best_d != std::string::npos && best_d <= limit) ? best : std::string();
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  std::string n = nearest(word, candidates);
  return n.empty() ? std::string() : " (did you mean '" + n + "'?)";
}

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

bool parse_int(const std::string& s, int64_t& out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  out = v;
  return true;
}

bool parse_float(const std::string& s, double& out) {
  if (s.empty()) return false;
  if (s == ".inf" || s == "inf" || s == ".nan" || s == "nan") return false;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size() || !std::isfinite(v)) return false;
  out = v;
  return true;
}

bool parse_bool(const std::string& s, bool& out) {
  if (s == "true" || s == "True" || s == "TRUE") return out = true, true;
  if (s == "false" || s == "False" || s == "FALSE") return out = false, true;
  return false;
}

namespace {
std::string range_text(const Field& f) {
  if (f.min_value && f.max_value) return fmt::format("[{}, {}]", *f.min_value, *f.max_value);
  if (f.min_value) return fmt::format(">= {}", *f.min_value);
  if (f.max_value) return fmt::format("<= {}", *f.max_value);
  return "";
}
}  // namespace

Value parse_scalar(const Field& f, FieldType t, const std::string& s, const std::string& label,
                   std::string& error) {
  error.clear();
  auto in_range = [&](double x) {
    if ((f.min_value && x < *f.min_value) || (f.max_value && x > *f.max_value)) {
      error = fmt::format("{}: {} is out of range; allowed: {}", label, s, range_text(f));
      return false;
    }
    return true;
  };
  switch (t) {
    case FieldType::Bool: {
      bool b;
      if (parse_bool(s, b)) return b;
      break;
    }
    case FieldType::Int: {
      int64_t i;
      if (parse_int(s, i)) return in_range(static_cast<double>(i)) ? Value(i) : Value();
      break;
    }
    case FieldType::Float: {
      double d;
      if (parse_float(s, d)) return in_range(d) ? Value(d) : Value();
      break;
    }
    case FieldType::Enum:
      if (std::find(f.choices.begin(), f.choices.end(), s) != f.choices.end()) return s;
      error = fmt::format("{}: '{}' is not allowed{}; allowed: {}", label, s, did_you_mean(s, f.choices),
                          join(f.choices, ", "));
      return {};
    case FieldType::String:
    case FieldType::Path:
      if (s.empty() && t == FieldType::Path) {
        error = fmt::format("{}: expected a path, got an empty string", label);
        return {};
      }
      return s;
    default:
      break;
  }
  error = fmt::format("{}: expected {}, got '{}'", label, field_type_name(t), s);
  return {};
}

}  // namespace qrun

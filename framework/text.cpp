#include "text.h"

#include <algorithm>

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

}  // namespace qrun

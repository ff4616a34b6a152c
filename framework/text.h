// framework/text.h - small string helpers for messages: edit distance and "did you mean".
// Written by hand: a 20-line edit distance is simpler than a dependency.
#pragma once

#include <string>
#include <vector>

namespace qrun {

size_t edit_distance(const std::string& a, const std::string& b);

// The candidate closest to `word`, if it is close enough to be a plausible typo; else "".
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);

// " (did you mean 'x'?)" or "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

std::string join(const std::vector<std::string>& items, const std::string& sep = ", ");

}  // namespace qrun

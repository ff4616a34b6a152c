// framework/text.h - small string helpers for messages: edit distance and "did you mean".
// Written by hand: a 20-line edit distance is simpler than a dependency.
#pragma once

#include <qrun/sdk/config.h>

#include <string>
#include <vector>

namespace qrun {

size_t edit_distance(const std::string& a, const std::string& b);

// The candidate closest to `word`, if it is close enough to be a plausible typo; else "".
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);

// " (did you mean 'x'?)" or "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

std::string join(const std::vector<std::string>& items, const std::string& sep = ", ");

// Setting values from their text, as a recipe spells them (the recipe loader and
// `qrun check --set`). parse_float takes finite numbers only.
bool parse_int(const std::string& s, int64_t& out);
bool parse_float(const std::string& s, double& out);
bool parse_bool(const std::string& s, bool& out);

// The value of field f's scalar type t (bool, int, float, string, enum or path: a list field's
// element type) spelled `s`, range- and choice-checked. On a bad value returns monostate and sets
// `error` to the reason, starting with `label` (e.g. "model.hidden: 0 is out of range; allowed:
// >= 1").
Value parse_scalar(const Field& f, FieldType t, const std::string& s, const std::string& label,
                   std::string& error);

}  // namespace qrun

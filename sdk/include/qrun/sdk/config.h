// qrun/sdk/config.h - component schemas and the validated settings a component receives.
//
// Every component declares a Schema: its fields with type, default, allowed values, range and a
// one-line doc. The host validates the recipe against the schemas of every component it names
// *before any work starts* and reports every problem at once (see framework/recipe.cpp). A
// component therefore receives a Config whose values are present and of the declared type; asking
// for a field the schema does not declare is an internal error (a bug in the plugin).
//
// Ownership: a Config is a plain value. Plugins copy what they need out of it; they never keep
// pointers into host memory (the ONNX Runtime EP habit). Added in SDK 1.
#pragma once

#include <qrun/sdk/error.h>

#include <fmt/ranges.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace qrun {

enum class FieldType { Bool, Int, Float, String, Enum, Path, IntList, FloatList, StringList };

inline const char* field_type_name(FieldType t) {
  switch (t) {
    case FieldType::Bool: return "bool";
    case FieldType::Int: return "int";
    case FieldType::Float: return "float";
    case FieldType::String: return "string";
    case FieldType::Enum: return "one of";
    case FieldType::Path: return "path";
    case FieldType::IntList: return "list of int";
    case FieldType::FloatList: return "list of float";
    case FieldType::StringList: return "list of string";
  }
  return "?";
}

// A field's value. monostate = unset (only for optional fields without a default).
using Value = std::variant<std::monostate, bool, int64_t, double, std::string, std::vector<int64_t>,
                           std::vector<double>, std::vector<std::string>>;

// One field of a schema. Built fluently:
//   Field::integer("tokens_per_batch", 8192).min(1).doc("token budget of one micro-batch")
struct Field {
  std::string name;
  FieldType type = FieldType::String;
  Value default_value;              // monostate: no default
  bool required = false;            // must appear in the recipe
  std::vector<std::string> choices; // Enum: the allowed values
  std::optional<double> min_value;  // Int/Float (and list elements): inclusive bounds
  std::optional<double> max_value;
  std::optional<size_t> list_size;  // lists: exact length, if fixed
  std::string help;

  static Field boolean(std::string n, bool def) { return make(std::move(n), FieldType::Bool, def); }
  static Field integer(std::string n, std::optional<int64_t> def = std::nullopt) {
    return def ? make(std::move(n), FieldType::Int, *def) : make(std::move(n), FieldType::Int, {});
  }
  static Field number(std::string n, std::optional<double> def = std::nullopt) {
    return def ? make(std::move(n), FieldType::Float, *def) : make(std::move(n), FieldType::Float, {});
  }
  static Field string(std::string n, std::optional<std::string> def = std::nullopt) {
    return def ? make(std::move(n), FieldType::String, *def)
               : make(std::move(n), FieldType::String, {});
  }
  static Field path(std::string n) { return make(std::move(n), FieldType::Path, {}); }
  static Field choice(std::string n, std::string def, std::vector<std::string> allowed) {
    Field f = make(std::move(n), FieldType::Enum, std::move(def));
    f.choices = std::move(allowed);
    return f;
  }
  static Field int_list(std::string n, std::vector<int64_t> def) {
    return make(std::move(n), FieldType::IntList, std::move(def));
  }
  static Field float_list(std::string n, std::vector<double> def) {
    return make(std::move(n), FieldType::FloatList, std::move(def));
  }
  static Field string_list(std::string n, std::vector<std::string> def = {}) {
    return make(std::move(n), FieldType::StringList, std::move(def));
  }

  Field& min(double v) { min_value = v; return *this; }
  Field& max(double v) { max_value = v; return *this; }
  Field& size(size_t n) { list_size = n; return *this; }
  Field& require() { required = true; default_value = {}; return *this; }
  Field& optional() { default_value = {}; return *this; }
  Field& doc(std::string d) { help = std::move(d); return *this; }

 private:
  static Field make(std::string n, FieldType t, Value def) {
    Field f;
    f.name = std::move(n);
    f.type = t;
    f.default_value = std::move(def);
    return f;
  }
};

// The schema of one component: an ordered list of fields.
class Schema {
 public:
  Schema() = default;
  Schema(std::initializer_list<Field> fields) : fields_(fields) {}
  Schema& add(Field f) {
    QRUN_ASSERT(find(f.name) == nullptr, "schema field '{}' declared twice", f.name);
    fields_.push_back(std::move(f));
    return *this;
  }
  const std::vector<Field>& fields() const { return fields_; }
  const Field* find(const std::string& name) const {
    for (const auto& f : fields_)
      if (f.name == name) return &f;
    return nullptr;
  }

 private:
  std::vector<Field> fields_;
};

// Renders a value the way a recipe would spell it (used in messages and in the resolved recipe).
std::string format_value(const Value& v);

// The validated settings of one component instance.
class Config {
 public:
  Config() = default;
  Config(std::string path, std::map<std::string, Value> values,
         std::map<std::string, std::string> locations = {})
      : path_(std::move(path)), values_(std::move(values)), locations_(std::move(locations)) {}

  // Where this component sits in the recipe, e.g. "data.collator".
  const std::string& path() const { return path_; }
  // True when the field has a value (given in the recipe or by its default).
  bool has(const std::string& name) const {
    auto it = values_.find(name);
    return it != values_.end() && !std::holds_alternative<std::monostate>(it->second);
  }
  // "recipe.yaml:14:5" for a field the recipe spelled out, else "<path>.<name> (default)".
  std::string location(const std::string& name) const {
    auto it = locations_.find(name);
    return it != locations_.end() ? it->second : path_ + "." + name + " (default)";
  }

  bool get_bool(const std::string& n) const { return get<bool>(n); }
  int64_t get_int(const std::string& n) const { return get<int64_t>(n); }
  double get_float(const std::string& n) const {
    const Value& v = at(n);
    if (auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
    return get<double>(n);
  }
  const std::string& get_string(const std::string& n) const { return get<std::string>(n); }
  const std::vector<int64_t>& get_int_list(const std::string& n) const {
    return get<std::vector<int64_t>>(n);
  }
  const std::vector<double>& get_float_list(const std::string& n) const {
    return get<std::vector<double>>(n);
  }
  const std::vector<std::string>& get_string_list(const std::string& n) const {
    return get<std::vector<std::string>>(n);
  }
  std::optional<std::string> get_optional_string(const std::string& n) const {
    return has(n) ? std::optional<std::string>(get_string(n)) : std::nullopt;
  }
  const std::map<std::string, Value>& values() const { return values_; }

 private:
  const Value& at(const std::string& n) const {
    auto it = values_.find(n);
    QRUN_ASSERT(it != values_.end(), "component '{}' asked for field '{}' that its schema lacks",
                path_, n);
    return it->second;
  }
  template <typename T>
  const T& get(const std::string& n) const {
    const Value& v = at(n);
    const T* p = std::get_if<T>(&v);
    QRUN_ASSERT(p != nullptr, "field '{}.{}' read with the wrong type or unset", path_, n);
    return *p;
  }

  std::string path_;
  std::map<std::string, Value> values_;
  std::map<std::string, std::string> locations_;
};

inline std::string format_value(const Value& v) {
  struct V {
    std::string operator()(std::monostate) const { return "null"; }
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return fmt::format("{}", d); }
    std::string operator()(const std::string& s) const { return s; }
    std::string operator()(const std::vector<int64_t>& l) const {
      return fmt::format("[{}]", fmt::join(l, ", "));
    }
    std::string operator()(const std::vector<double>& l) const {
      return fmt::format("[{}]", fmt::join(l, ", "));
    }
    std::string operator()(const std::vector<std::string>& l) const {
      return fmt::format("[{}]", fmt::join(l, ", "));
    }
  };
  return std::visit(V{}, v);
}

}  // namespace qrun

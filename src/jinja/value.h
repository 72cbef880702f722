// Value: what a Jinja expression evaluates to, with Python's semantics as jinja2 sees them.
//
// Scalars (undefined, none, bool, int, float) are held by value; strings, lists, dicts and
// callables are shared (a string is immutable, as in Python) (copying a Value copies a pointer), as
// Python objects are: a namespace set through one name is seen through every other. Dicts keep
// insertion order (Python 3.7+) and index their keys for constant-time lookup.
//
// Data flows in from JSON (from_json) and out as text: to_str() is Python's str(), to_repr()
// Python's repr(), and to_json() is json.dumps as transformers' tojson filter calls it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kvp::jinja {

class Value;
class Evaluator;

// The longest text to_str, to_repr and to_json write (Limits::max_output_bytes' default).
inline constexpr size_t kMaxTextBytes = size_t{16} << 20;

// Arguments of one call: positional then keyword, as written.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// A builtin function, bound method or macro. The evaluator passes itself so a callable can
// render (macros, caller()) and apply filters and tests (map, select).
using NativeFunction = std::function<Result<Value>(Evaluator&, CallArgs&)>;

struct ListData;
struct DictData;
struct CallableData;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

  Value() = default;  // undefined
  static Value undefined(std::string hint = {});
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double f);
  static Value string(std::string s);
  static Value list(std::vector<Value> items = {}, bool is_tuple = false);
  static Value dict();
  // A jinja2 namespace(): a dict whose entries are read and set as attributes.
  static Value namespace_dict();
  static Value callable(std::string name, NativeFunction fn);
  // Converts JSON (objects keep their order). Errors past max_depth levels of nesting.
  static Result<Value> from_json(const nlohmann::ordered_json& json, size_t max_depth = 256);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // Python: bool is int
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_callable() const { return kind_ == Kind::kCallable; }
  bool is_tuple() const;
  bool is_namespace() const;

  // requires: the matching kind.
  bool as_bool() const { return bool_; }
  int64_t as_int() const { return is_bool() ? int64_t{bool_} : int_; }  // kInt or kBool
  double as_double() const;                                             // any number
  const std::string& as_string() const { return string_ ? *string_ : empty_string(); }
  std::vector<Value>& items() const;  // kList
  DictData& dict_data() const;        // kDict
  const CallableData& callable_data() const;

  // The reason an undefined value is undefined ("'x' is undefined"), for errors on use.
  const std::string& undefined_hint() const { return as_string(); }

  // Python truthiness (undefined is false).
  bool truthy() const;
  // Python str() (undefined prints as ""). Fails past max_depth nesting (a namespace that
  // holds itself) and, for lists and dicts, when the text would pass max_bytes (a list that
  // holds one long string many times).
  Result<std::string> to_str(size_t max_depth = 256, size_t max_bytes = kMaxTextBytes) const;
  Result<std::string> to_repr(size_t max_depth = 256, size_t max_bytes = kMaxTextBytes) const;
  // jinja2's name for the type in messages: "dict object", "list object", "str object".
  std::string type_name() const;

  // Shared identity (Python `is`): same container, or equal scalars.
  bool same_as(const Value& other) const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool bool_ = false;
  int64_t int_ = 0;
  double float_ = 0.0;
  static const std::string& empty_string();

  // kString: the text; kUndefined: the hint (null: empty). Shared and never modified, so a copy
  // of a string value (a variable read, an item of a list) costs no bytes however long it is.
  std::shared_ptr<const std::string> string_;
  std::shared_ptr<ListData> list_;
  std::shared_ptr<DictData> dict_;
  std::shared_ptr<CallableData> callable_;
};

struct ListData {
  std::vector<Value> items;
  bool is_tuple = false;
};

// An ordered dict. Keys are strings, numbers, booleans or none (Python's hashable scalars).
struct DictData {
  std::vector<std::pair<Value, Value>> entries;   // insertion order
  std::unordered_map<std::string, size_t> index;  // hash_key(key) -> position in entries
  bool is_namespace = false;

  // nullptr when absent.
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  // Inserts or replaces (an existing key keeps its position). Fails for an unhashable key.
  Status set(const Value& key, Value value);
  size_t size() const { return entries.size(); }
  // Equal keys map to one string: 1, 1.0 and true are one key, as in Python.
  static Result<std::string> hash_key(const Value& key);
};

struct CallableData {
  std::string name;
  NativeFunction fn;
};

// Python equality (1 == 1.0 == true; lists element-wise; dicts regardless of order).
bool values_equal(const Value& a, const Value& b, size_t depth = 0);
// Python `<` for numbers, strings and lists; a type error otherwise. *less is a < b.
Status values_less(const Value& a, const Value& b, bool* less, size_t depth = 0);

// json.dumps(value, ensure_ascii, indent, separators, sort_keys) as Python writes it.
struct JsonOptions {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;  // used when has_indent ("" for indent=0: newlines, no spaces)
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  size_t max_bytes = kMaxTextBytes;  // longer text fails (resource exhausted)
};
Result<std::string> to_json(const Value& value, const JsonOptions& options, size_t max_depth = 256);

// Python's repr() of a float: shortest round-trip digits, "1.0", "1e+16", "1.5e-05", "inf".
std::string format_float(double f);
// Python's repr() of a str: quoted, with escapes.
std::string repr_string(std::string_view s);

}  // namespace kvp::jinja

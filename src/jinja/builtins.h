// The builtin library the evaluator calls: operators (operators.cc), filters and tests
// (filters.cc), attribute and item access with Python's str / dict / list methods, and the
// globals (methods.cc). Everything follows jinja2 3.1 under transformers' sandboxed environment.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "jinja/ast.h"
#include "jinja/value.h"

namespace kvp::jinja {

class Evaluator;
struct Scope;
struct Limits;

// ---- operators.cc ----
// a op b for everything but and/or (which the evaluator short-circuits). Strings built are held
// to the output size limit; list items built count against the loop iteration limit.
Result<Value> binary_op(Evaluator& ev, BinaryOp op, const Value& a, const Value& b);
// The items a for loop or a filter sees: list items, dict keys, string characters; nothing for
// undefined. An error for values that are not iterable. Each item counts against the loop
// iteration limit (a long string or list walked in a loop is work).
Result<std::vector<Value>> iterate(Evaluator& ev, const Value& value);
// value[start:stop:step] of a list, tuple or string (absent parts are null).
Result<Value> slice(const Value& value, const Value* start, const Value* stop, const Value* step);
// Python `needle in haystack`; the items of a list compared count against the loop iteration
// limit.
Result<bool> contains(Evaluator& ev, const Value& haystack, const Value& needle);

// ---- filters.cc ----
bool is_filter(std::string_view name);
bool is_test(std::string_view name);
Result<Value> builtin_filter(Evaluator& ev, const std::string& name, const Value& input,
                             CallArgs& args);
Result<bool> builtin_test(Evaluator& ev, const std::string& name, const Value& input,
                          CallArgs& args);

// ---- methods.cc ----
// obj.name: a method (bound to obj) first, then a dict key; undefined (with jinja2's hint) when
// neither exists. Sandbox rules: mutating methods and _names give an "unsafe" undefined.
Value get_attribute(const Value& object, const std::string& name);
// obj[key]: the item first, then for a string key the attribute.
Value get_item(const Value& object, const Value& key);
// range, dict, namespace, raise_exception, strftime_now, cycler-free jinja2 globals.
void add_globals(Scope* scope);

// Binds a call's arguments to a builtin's parameter names, as Python would.
class ArgBinder {
 public:
  ArgBinder(std::string_view function, const CallArgs& args,
            std::initializer_list<std::string_view> params);
  // Too many positional arguments, an unknown keyword or one given twice.
  const Status& status() const { return status_; }
  // nullptr when the argument was not given.
  const Value* get(size_t index) const { return index < slots_.size() ? slots_[index] : nullptr; }
  Value get_or(size_t index, Value fallback) const {
    const Value* v = get(index);
    return v ? *v : std::move(fallback);
  }

 private:
  std::vector<const Value*> slots_;
  Status status_;
};

}  // namespace kvp::jinja

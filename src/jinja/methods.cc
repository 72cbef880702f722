// Attribute and item access, Python's str / dict / list methods, and the template globals.
#include <algorithm>
#include <cctype>
#include <ctime>
#include <memory>

#include "jinja/builtins.h"
#include "jinja/evaluator.h"
#include "jinja/text.h"

namespace kvp::jinja {

namespace {

constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

bool is_one_of(std::string_view name, std::initializer_list<std::string_view> names) {
  for (std::string_view n : names) {
    if (n == name) return true;
  }
  return false;
}

Value unsafe(const Value& object, const std::string& name) {
  return Value::undefined(
      fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, object.type_name()));
}

Value no_attribute(const Value& object, const std::string& name) {
  if (object.is_none()) return Value::undefined(fmt::format("'None' has no attribute '{}'", name));
  return Value::undefined(
      fmt::format("'{} object' has no attribute '{}'", object.type_name(), name));
}

Result<std::optional<std::string>> optional_string(const Value* v, const char* what) {
  if (v == nullptr || v->is_none()) return std::optional<std::string>();
  if (!v->is_string()) {
    return Status::invalid_argument("{} must be str or None, not {}", what, v->type_name());
  }
  return std::optional<std::string>(v->as_string());
}

Result<int64_t> int_arg(const Value* v, int64_t fallback, const char* what) {
  if (v == nullptr) return fallback;
  if (!v->is_int() && !v->is_bool()) {
    return Status::invalid_argument("{} must be an integer, not {}", what, v->type_name());
  }
  return v->as_int();
}

Value string_list(std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (auto& p : parts) items.push_back(Value::string(std::move(p)));
  return Value::list(std::move(items));
}

// "{} {0} {name}".format(...): fields without format specs.
Result<Value> format_string(Evaluator& ev, const std::string& format, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    const char c = format[i];
    if (c == '}') {
      if (i + 1 < format.size() && format[i + 1] == '}') ++i;
      out.push_back('}');
      continue;
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = format.find('}', i);
    if (close == std::string::npos) return Status::invalid_argument("unmatched '{{' in format");
    const std::string field = format.substr(i + 1, close - i - 1);
    i = close;
    if (field.find_first_of(":!.[") != std::string::npos) {
      return Status::unsupported("format field '{{{}}}' is not supported", field);
    }
    const Value* v = nullptr;
    if (field.empty() || std::isdigit(static_cast<unsigned char>(field[0]))) {
      // Python reads the whole field as an index ("{1x}" names a keyword it will not find)
      size_t index = field.empty() ? auto_index++ : 0;
      for (char d : field) {
        if (!std::isdigit(static_cast<unsigned char>(d))) {
          return Status::invalid_argument("format key '{}' not given", field);
        }
        index = std::min<size_t>(index * 10 + static_cast<size_t>(d - '0'), size_t{1} << 32);
      }
      if (index >= args.positional.size()) {
        return Status::invalid_argument("format index {} out of range",
                                        field.empty() ? std::to_string(index) : field);
      }
      v = &args.positional[index];
    } else {
      for (const auto& [key, value] : args.keyword) {
        if (key == field) v = &value;
      }
      if (v == nullptr) return Status::invalid_argument("format key '{}' not given", field);
    }
    KVP_ASSIGN_OR_RETURN(std::string text, v->to_str());
    out += text;
    KVP_RETURN_IF_ERROR(ev.check_size(out.size()));
  }
  return Value::string(std::move(out));
}

template <typename Pred>
Value all_chars(const std::string& s, Pred pred) {
  if (s.empty()) return Value::boolean(false);
  for (char c : s) {
    if (!pred(static_cast<unsigned char>(c))) return Value::boolean(false);
  }
  return Value::boolean(true);
}

Result<Value> call_str_method(Evaluator& ev, const std::string& s, const std::string& name,
                              CallArgs& args) {
  if (name == "format") return format_string(ev, s, args);
  ArgBinder a(name, args, {"arg0", "arg1", "arg2"});
  KVP_RETURN_IF_ERROR(a.status());
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    KVP_ASSIGN_OR_RETURN(auto chars, optional_string(a.get(0), "strip arg"));
    return Value::string(strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    KVP_ASSIGN_OR_RETURN(auto sep, optional_string(a.get(0), "sep"));
    if (sep && sep->empty()) return Status::invalid_argument("empty separator");
    KVP_ASSIGN_OR_RETURN(int64_t max_splits, int_arg(a.get(1), -1, "maxsplit"));
    return string_list(name == "split" ? split(s, sep, max_splits) : rsplit(s, sep, max_splits));
  }
  if (name == "splitlines") return string_list(split_lines(s));
  if (name == "startswith" || name == "endswith") {
    const Value* prefix = a.get(0);
    if (prefix == nullptr) return Status::invalid_argument("{}() takes at least 1 argument", name);
    std::vector<Value> options = prefix->is_tuple() ? prefix->items() : std::vector<Value>{*prefix};
    for (const Value& option : options) {
      if (!option.is_string()) {
        return Status::invalid_argument("{} first arg must be str or a tuple of str", name);
      }
      if (name == "startswith" ? s.starts_with(option.as_string())
                               : s.ends_with(option.as_string())) {
        return Value::boolean(true);
      }
    }
    return Value::boolean(false);
  }
  if (name == "upper") return Value::string(to_upper(s));
  if (name == "lower") return Value::string(to_lower(s));
  if (name == "title") return Value::string(python_title(s));
  if (name == "capitalize") return Value::string(capitalize(s));
  if (name == "replace") {
    if (a.get(0) == nullptr || a.get(1) == nullptr || !a.get(0)->is_string() ||
        !a.get(1)->is_string()) {
      return Status::invalid_argument("replace() takes two str arguments");
    }
    KVP_ASSIGN_OR_RETURN(int64_t count, int_arg(a.get(2), -1, "count"));
    std::optional<std::string> out = replace(s, a.get(0)->as_string(), a.get(1)->as_string(), count,
                                             ev.limits().max_output_bytes);
    if (!out) return ev.check_size(ev.limits().max_output_bytes + 1);
    return Value::string(std::move(*out));
  }
  if (name == "find" || name == "rfind" || name == "count" || name == "removeprefix" ||
      name == "removesuffix") {
    if (a.get(0) == nullptr || !a.get(0)->is_string()) {
      return Status::invalid_argument("{}() takes a str argument", name);
    }
    if (a.get(1) != nullptr) return Status::unsupported("{}() start/end are not supported", name);
    const std::string& needle = a.get(0)->as_string();
    if (name == "count") return Value::integer(count_occurrences(s, needle));
    if (name == "removeprefix") {
      return Value::string(s.starts_with(needle) ? s.substr(needle.size()) : s);
    }
    if (name == "removesuffix") {
      return Value::string(
          s.ends_with(needle) && !needle.empty() ? s.substr(0, s.size() - needle.size()) : s);
    }
    return Value::integer(find_code_point(s, needle, name == "rfind"));
  }
  if (name == "join") {
    if (a.get(0) == nullptr) return Status::invalid_argument("join() takes one argument");
    KVP_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(ev, *a.get(0)));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) {
        return Status::invalid_argument("sequence item {}: expected str instance, {} found", i,
                                        items[i].type_name());
      }
      if (i > 0) out += s;
      out += items[i].as_string();
      KVP_RETURN_IF_ERROR(ev.check_size(out.size()));
    }
    return Value::string(std::move(out));
  }
  if (name == "isdigit") return all_chars(s, [](unsigned char c) { return std::isdigit(c); });
  if (name == "isalpha") return all_chars(s, [](unsigned char c) { return std::isalpha(c); });
  if (name == "isalnum") return all_chars(s, [](unsigned char c) { return std::isalnum(c); });
  if (name == "isspace") return all_chars(s, [](unsigned char c) { return std::isspace(c); });
  if (name == "islower") {
    return Value::boolean(to_lower(s) == s && to_upper(s) != s);
  }
  if (name == "isupper") {
    return Value::boolean(to_upper(s) == s && to_lower(s) != s);
  }
  return Status::internal("str method '{}' is not wired", name);
}

bool is_str_method(std::string_view name) {
  return is_one_of(
      name,
      {"strip",    "lstrip",  "rstrip",  "split",        "rsplit",      "splitlines", "startswith",
       "endswith", "upper",   "lower",   "title",        "capitalize",  "replace",    "find",
       "rfind",    "count",   "format",  "join",         "isdigit",     "isalpha",    "isalnum",
       "isspace",  "islower", "isupper", "removeprefix", "removesuffix"});
}

Result<Value> call_dict_method(Evaluator&, const Value& d, const std::string& name,
                               CallArgs& args) {
  ArgBinder a(name, args, {"arg0", "arg1"});
  KVP_RETURN_IF_ERROR(a.status());
  const DictData& data = d.dict_data();
  if (name == "get") {
    if (a.get(0) == nullptr) return Status::invalid_argument("get expected at least 1 argument");
    const Value* found = data.find(*a.get(0));
    return found ? *found : a.get_or(1, Value::none());
  }
  if (name == "copy") {
    Value copy = Value::dict();
    copy.dict_data().entries = data.entries;
    copy.dict_data().index = data.index;
    return copy;
  }
  std::vector<Value> items;
  for (const auto& [key, value] : data.entries) {
    if (name == "keys") {
      items.push_back(key);
    } else if (name == "values") {
      items.push_back(value);
    } else {
      items.push_back(Value::list({key, value}, /*is_tuple=*/true));
    }
  }
  return Value::list(std::move(items));
}

Result<Value> call_list_method(Evaluator&, const Value& list, const std::string& name,
                               CallArgs& args) {
  ArgBinder a(name, args, {"arg0"});
  KVP_RETURN_IF_ERROR(a.status());
  if (name == "copy") return Value::list(list.items(), list.is_tuple());
  if (a.get(0) == nullptr) return Status::invalid_argument("{}() takes exactly one argument", name);
  int64_t count = 0;
  for (size_t i = 0; i < list.items().size(); ++i) {
    if (!values_equal(list.items()[i], *a.get(0))) continue;
    if (name == "index") return Value::integer(static_cast<int64_t>(i));
    ++count;
  }
  if (name == "count") return Value::integer(count);
  KVP_ASSIGN_OR_RETURN(std::string repr, a.get(0)->to_repr());
  return Status::invalid_argument("{} is not in list", repr);
}

Value bound(const Value& object, const std::string& name,
            Result<Value> (*method)(Evaluator&, const Value&, const std::string&, CallArgs&)) {
  return Value::callable(name, [object, name, method](Evaluator& ev, CallArgs& args) {
    return method(ev, object, name, args);
  });
}

Result<Value> str_method_on(Evaluator& ev, const Value& s, const std::string& name,
                            CallArgs& args) {
  return call_str_method(ev, s.as_string(), name, args);
}

}  // namespace

ArgBinder::ArgBinder(std::string_view function, const CallArgs& args,
                     std::initializer_list<std::string_view> params)
    : slots_(params.size(), nullptr) {
  if (args.positional.size() > params.size()) {
    status_ = Status::invalid_argument("{}() takes at most {} argument(s) ({} given)", function,
                                       params.size(), args.positional.size());
    return;
  }
  for (size_t i = 0; i < args.positional.size(); ++i) slots_[i] = &args.positional[i];
  for (const auto& [key, value] : args.keyword) {
    size_t i = 0;
    for (std::string_view p : params) {
      if (p == key) break;
      ++i;
    }
    if (i == params.size()) {
      status_ =
          Status::invalid_argument("{}() got an unexpected keyword argument '{}'", function, key);
      return;
    }
    if (slots_[i] != nullptr) {
      status_ =
          Status::invalid_argument("{}() got multiple values for argument '{}'", function, key);
      return;
    }
    slots_[i] = &value;
  }
}

Value get_attribute(const Value& object, const std::string& name) {
  switch (object.kind()) {
    case Value::Kind::kString:
      if (is_str_method(name)) return bound(object, name, str_method_on);
      break;
    case Value::Kind::kDict:
      if (object.is_namespace()) {
        const Value* found = object.dict_data().find(name);
        return found ? *found : no_attribute(object, name);
      }
      if (is_one_of(name, {"items", "keys", "values", "get", "copy"})) {
        return bound(object, name, call_dict_method);
      }
      if (is_one_of(name, {"pop", "popitem", "setdefault", "update", "clear"})) {
        return unsafe(object, name);
      }
      if (const Value* found = object.dict_data().find(name)) return *found;
      break;
    case Value::Kind::kList:
      if (is_one_of(name, {"index", "count", "copy"})) return bound(object, name, call_list_method);
      if (!object.is_tuple() && is_one_of(name, {"append", "clear", "pop", "reverse", "insert",
                                                 "sort", "extend", "remove"})) {
        return unsafe(object, name);
      }
      break;
    default:
      break;
  }
  if (name.starts_with("__")) return unsafe(object, name);
  return no_attribute(object, name);
}

Value get_item(const Value& object, const Value& key) {
  switch (object.kind()) {
    case Value::Kind::kDict:
      if (!object.is_namespace()) {
        if (const Value* found = object.dict_data().find(key)) return *found;
      }
      break;
    case Value::Kind::kList:
    case Value::Kind::kString:
      if (key.is_int() || key.is_bool()) {
        const bool is_string = object.is_string();
        std::vector<uint32_t> cps;
        if (is_string) cps = decode_utf8(object.as_string());
        const auto length = static_cast<int64_t>(is_string ? cps.size() : object.items().size());
        int64_t index = key.as_int();
        if (index < 0) index += length;
        if (index < 0 || index >= length) {
          return Value::undefined(
              fmt::format("'{} object' has no element {}", object.type_name(), key.as_int()));
        }
        if (!is_string) return object.items()[static_cast<size_t>(index)];
        std::string c;
        append_utf8(cps[static_cast<size_t>(index)], &c);
        return Value::string(std::move(c));
      }
      break;
    default:
      break;
  }
  if (key.is_string()) return get_attribute(object, key.as_string());
  auto repr = key.to_repr();
  return Value::undefined(fmt::format("'{} object' has no element {}", object.type_name(),
                                      repr.is_ok() ? *repr : std::string("?")));
}

void add_globals(Scope* scope) {
  scope->vars["range"] =
      Value::callable("range", [](Evaluator& ev, CallArgs& args) -> Result<Value> {
        if (!args.keyword.empty())
          return Status::invalid_argument("range() takes no keyword arguments");
        int64_t bounds[3] = {0, 0, 1};
        const size_t n = args.positional.size();
        if (n < 1 || n > 3)
          return Status::invalid_argument("range expected 1 to 3 arguments, got {}", n);
        for (size_t i = 0; i < n; ++i) {
          const Value& v = args.positional[i];
          if (!v.is_int() && !v.is_bool()) {
            return Status::invalid_argument("'{}' object cannot be interpreted as an integer",
                                            v.type_name());
          }
          bounds[n == 1 ? 1 : i] = v.as_int();
        }
        const int64_t start = bounds[0], stop = bounds[1], step = bounds[2];
        if (step == 0) return Status::invalid_argument("range() arg 3 must not be zero");
        const double count =
            step > 0 ? std::max(0.0, std::ceil((double(stop) - double(start)) / double(step)))
                     : std::max(0.0, std::ceil((double(start) - double(stop)) / double(-step)));
        if (count > kMaxRange) {
          return Status::resource_exhausted(
              "Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).", kMaxRange);
        }
        // its items count against the loop iteration limit: a range in a loop body is work too
        KVP_RETURN_IF_ERROR(ev.count_iterations(static_cast<uint64_t>(count)));
        std::vector<Value> items;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
          items.push_back(Value::integer(i));
        }
        return Value::list(std::move(items));
      });
  auto fill_dict = [](Evaluator& ev, const char* what, CallArgs& args, Value* out) -> Status {
    if (args.positional.size() > 1) {
      return Status::invalid_argument("{} expected at most 1 positional argument", what);
    }
    if (args.positional.size() == 1) {
      const Value& source = args.positional[0];
      if (source.is_dict() && !source.is_namespace()) {
        for (const auto& [key, value] : source.dict_data().entries) {
          KVP_RETURN_IF_ERROR(out->dict_data().set(key, value));
        }
      } else {
        KVP_ASSIGN_OR_RETURN(std::vector<Value> pairs, iterate(ev, source));
        for (const Value& pair : pairs) {
          if (!pair.is_list() || pair.items().size() != 2) {
            return Status::invalid_argument("{} sequence elements must be pairs", what);
          }
          KVP_RETURN_IF_ERROR(out->dict_data().set(pair.items()[0], pair.items()[1]));
        }
      }
    }
    for (const auto& [key, value] : args.keyword) {
      KVP_RETURN_IF_ERROR(out->dict_data().set(Value::string(key), value));
    }
    return Status::ok();
  };
  scope->vars["dict"] =
      Value::callable("dict", [fill_dict](Evaluator& ev, CallArgs& args) -> Result<Value> {
        Value d = Value::dict();
        KVP_RETURN_IF_ERROR(fill_dict(ev, "dict", args, &d));
        return d;
      });
  scope->vars["namespace"] =
      Value::callable("namespace", [fill_dict](Evaluator& ev, CallArgs& args) -> Result<Value> {
        Value ns = Value::namespace_dict();
        ev.track_namespace(ns);
        KVP_RETURN_IF_ERROR(fill_dict(ev, "namespace", args, &ns));
        for (const auto& [key, value] : ns.dict_data().entries) {
          if (key.is_string() && key.as_string().starts_with("_")) {
            return Status::invalid_argument(
                "chat templates cannot store underscore-prefixed attributes on a namespace ('{}')",
                key.as_string());
          }
        }
        return ns;
      });
  scope->vars["raise_exception"] =
      Value::callable("raise_exception", [](Evaluator&, CallArgs& args) -> Result<Value> {
        ArgBinder a("raise_exception", args, {"message"});
        KVP_RETURN_IF_ERROR(a.status());
        std::string message = "raise_exception() called without a message";
        if (a.get(0) != nullptr) {
          KVP_ASSIGN_OR_RETURN(message, a.get(0)->to_str());
        }
        return Status::invalid_argument("{}", message);
      });
  scope->vars["strftime_now"] =
      Value::callable("strftime_now", [](Evaluator&, CallArgs& args) -> Result<Value> {
        ArgBinder a("strftime_now", args, {"format"});
        KVP_RETURN_IF_ERROR(a.status());
        if (a.get(0) == nullptr || !a.get(0)->is_string()) {
          return Status::invalid_argument("strftime_now() takes a format string");
        }
        const std::time_t now = std::time(nullptr);
        std::tm local{};
        localtime_r(&now, &local);
        char buf[512];
        const size_t size = std::strftime(buf, sizeof(buf), a.get(0)->as_string().c_str(), &local);
        return Value::string(std::string(buf, size));
      });
  scope->vars["joiner"] =
      Value::callable("joiner", [](Evaluator&, CallArgs& args) -> Result<Value> {
        ArgBinder a("joiner", args, {"sep"});
        KVP_RETURN_IF_ERROR(a.status());
        KVP_ASSIGN_OR_RETURN(std::string sep, a.get_or(0, Value::string(", ")).to_str());
        auto used = std::make_shared<bool>(false);
        return Value::callable("joiner", [sep, used](Evaluator&, CallArgs&) -> Result<Value> {
          if (!*used) {
            *used = true;
            return Value::string("");
          }
          return Value::string(sep);
        });
      });
}

}  // namespace kvp::jinja

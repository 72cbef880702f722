// jinja2's builtin filters and tests (those chat templates use), plus transformers' tojson.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "jinja/builtins.h"
#include "jinja/evaluator.h"
#include "jinja/text.h"

namespace kvp::jinja {

namespace {

constexpr std::string_view kFilters[] = {
    "abs",      "attr",  "batch",  "capitalize", "count",      "d",           "default",
    "dictsort", "e",     "escape", "first",      "float",      "forceescape", "format",
    "indent",   "int",   "items",  "join",       "last",       "length",      "list",
    "lower",    "map",   "max",    "min",        "reject",     "rejectattr",  "replace",
    "reverse",  "round", "safe",   "select",     "selectattr", "sort",        "string",
    "sum",      "title", "tojson", "trim",       "unique",     "upper",       "wordcount",
};

constexpr std::string_view kTests[] = {
    "boolean", "callable", "defined",  "divisibleby", "eq",    "equalto",  "escaped",
    "even",    "false",    "filter",   "float",       "ge",    "gt",       "greaterthan",
    "in",      "integer",  "iterable", "le",          "lower", "lessthan", "lt",
    "mapping", "ne",       "none",     "number",      "odd",   "sameas",   "sequence",
    "string",  "test",     "true",     "undefined",   "upper", "==",       "!=",
    "<",       "<=",       ">",        ">=",
};

// item.a.b / item.0 as jinja2's make_attrgetter reads it (item access, then attribute).
Value get_path(const Value& item, const std::string& path) {
  Value v = item;
  for (const std::string& part : split(path, std::string("."), -1)) {
    if (v.is_undefined()) return v;
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    v = get_item(v, numeric ? Value::integer(std::atoll(part.c_str())) : Value::string(part));
  }
  return v;
}

// Lowercases strings for case-insensitive comparisons.
Value fold_case(const Value& v, bool case_sensitive) {
  if (case_sensitive || !v.is_string()) return v;
  return Value::string(to_lower(v.as_string()));
}

Status sort_values(std::vector<Value>* items, const std::function<Value(const Value&)>& key,
                   bool reverse) {
  std::vector<std::pair<Value, size_t>> keyed;
  for (size_t i = 0; i < items->size(); ++i) keyed.emplace_back(key((*items)[i]), i);
  Status error;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    bool less = false;
    Status s =
        reverse ? values_less(y.first, x.first, &less) : values_less(x.first, y.first, &less);
    if (!s.is_ok() && error.is_ok()) error = s;
    return less;
  });
  KVP_RETURN_IF_ERROR(error);
  std::vector<Value> sorted;
  for (const auto& [k, i] : keyed) sorted.push_back((*items)[i]);
  *items = std::move(sorted);
  return Status::ok();
}

std::string python_strip_number(const std::string& s) {
  std::string t = strip(s, std::nullopt, true, true);
  t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
  return t;
}

std::optional<int64_t> parse_int(const std::string& text, int base) {
  const std::string t = python_strip_number(text);
  if (t.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(t.c_str(), &end, base);
  if (errno != 0 || *end != '\0') return std::nullopt;
  return v;
}

std::optional<double> parse_float(const std::string& text) {
  const std::string t = python_strip_number(text);
  if (t.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (*end != '\0') return std::nullopt;
  return v;
}

// Python's round(x, ndigits): correctly rounded from x's exact binary value, ties to even, as
// glibc's printf rounds (round(2.675, 2) is 2.67 because 2.675 is stored as 2.67499...).
double round_half_even(double x, int64_t digits) {
  if (!std::isfinite(x)) return x;
  if (digits < 0) {
    const double scale = std::pow(10.0, static_cast<double>(-digits));
    return std::nearbyint(x / scale) * scale;
  }
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(std::min<int64_t>(digits, 300)), x);
  return std::strtod(buf, nullptr);
}

Result<Value> aggregate(Evaluator& ev, const Value& input, CallArgs& args, bool want_max) {
  ArgBinder a(want_max ? "max" : "min", args, {"case_sensitive", "attribute"});
  KVP_RETURN_IF_ERROR(a.status());
  const bool case_sensitive = a.get_or(0, Value::boolean(false)).truthy();
  const Value attribute = a.get_or(1, Value::none());
  KVP_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(ev, input));
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& v) {
    const Value k = attribute.is_string() ? get_path(v, attribute.as_string()) : v;
    return fold_case(k, case_sensitive);
  };
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    bool less = false;
    KVP_RETURN_IF_ERROR(want_max ? values_less(key(items[best]), key(items[i]), &less)
                                 : values_less(key(items[i]), key(items[best]), &less));
    if (less) best = i;
  }
  (void)ev;
  return items[best];
}

// select / reject / selectattr / rejectattr.
Result<Value> select_items(Evaluator& ev, const Value& input, CallArgs& args, bool with_attribute,
                           bool keep_passing) {
  KVP_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(ev, input));
  std::vector<Value>& positional = args.positional;
  std::string attribute;
  size_t next = 0;
  if (with_attribute) {
    if (positional.empty() || !positional[0].is_string()) {
      return Status::invalid_argument("selectattr/rejectattr need an attribute name");
    }
    attribute = positional[0].as_string();
    next = 1;
  }
  std::string test_name;
  if (next < positional.size()) {
    if (!positional[next].is_string()) return Status::invalid_argument("test name must be a str");
    test_name = positional[next].as_string();
    if (!is_test(test_name)) return Status::invalid_argument("no test named '{}'", test_name);
    ++next;
  }
  CallArgs test_args;
  test_args.positional.assign(positional.begin() + static_cast<ptrdiff_t>(next), positional.end());
  test_args.keyword = args.keyword;
  std::vector<Value> kept;
  for (const Value& item : items) {
    KVP_RETURN_IF_ERROR(ev.count_iterations(1));
    const Value subject = with_attribute ? get_path(item, attribute) : item;
    bool passed = subject.truthy();
    if (!test_name.empty()) {
      CallArgs copy = test_args;
      KVP_ASSIGN_OR_RETURN(passed, ev.apply_test(test_name, subject, copy));
    }
    if (passed == keep_passing) kept.push_back(item);
  }
  return Value::list(std::move(kept));
}

Result<Value> map_items(Evaluator& ev, const Value& input, CallArgs& args) {
  KVP_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(ev, input));
  std::vector<Value> out;
  const Value* attribute = nullptr;
  const Value* fallback = nullptr;
  for (const auto& [key, value] : args.keyword) {
    if (key == "attribute") attribute = &value;
    if (key == "default") fallback = &value;
  }
  if (attribute != nullptr) {
    KVP_ASSIGN_OR_RETURN(std::string path, attribute->to_str());
    for (const Value& item : items) {
      Value v = get_path(item, path);
      out.push_back(v.is_undefined() && fallback ? *fallback : v);
    }
    return Value::list(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is_string()) {
    return Status::invalid_argument("map() needs a filter name or attribute=");
  }
  const std::string name = args.positional[0].as_string();
  if (!is_filter(name)) return Status::invalid_argument("no filter named '{}'", name);
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : items) {
    KVP_RETURN_IF_ERROR(ev.count_iterations(1));
    CallArgs copy = rest;
    KVP_ASSIGN_OR_RETURN(Value v, ev.apply_filter(name, item, copy));
    out.push_back(std::move(v));
  }
  return Value::list(std::move(out));
}

Result<Value> tojson(Evaluator& ev, const Value& input, CallArgs& args) {
  ArgBinder a("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  KVP_RETURN_IF_ERROR(a.status());
  JsonOptions options;
  options.max_bytes = ev.limits().max_output_bytes;
  options.ensure_ascii = a.get_or(0, Value::boolean(false)).truthy();
  const Value indent = a.get_or(1, Value::none());
  if (indent.is_int()) {
    KVP_RETURN_IF_ERROR(ev.check_size(static_cast<size_t>(std::max<int64_t>(0, indent.as_int()))));
    options.has_indent = true;
    options.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, indent.as_int())), ' ');
  } else if (indent.is_string()) {
    options.has_indent = true;
    options.indent = indent.as_string();
  } else if (!indent.is_none()) {
    return Status::invalid_argument("tojson indent must be an int, a str or None");
  }
  if (options.has_indent) options.item_separator.assign(1, ',');
  const Value separators = a.get_or(2, Value::none());
  if (separators.is_list() && separators.items().size() == 2 && separators.items()[0].is_string() &&
      separators.items()[1].is_string()) {
    options.item_separator = separators.items()[0].as_string();
    options.key_separator = separators.items()[1].as_string();
  } else if (!separators.is_none()) {
    return Status::invalid_argument("tojson separators must be a pair of strings");
  }
  options.sort_keys = a.get_or(3, Value::boolean(false)).truthy();
  KVP_ASSIGN_OR_RETURN(std::string text, to_json(input, options));
  return Value::string(std::move(text));
}

Result<Value> indent(Evaluator& ev, const Value& input, CallArgs& args) {
  ArgBinder a("indent", args, {"width", "first", "blank"});
  KVP_RETURN_IF_ERROR(a.status());
  KVP_ASSIGN_OR_RETURN(std::string text, input.to_str());
  const Value width = a.get_or(0, Value::integer(4));
  if (!width.is_string()) {
    KVP_RETURN_IF_ERROR(ev.check_size(static_cast<size_t>(std::max<int64_t>(0, width.as_int()))));
  }
  const std::string pad =
      width.is_string()
          ? width.as_string()
          : std::string(static_cast<size_t>(std::max<int64_t>(0, width.as_int())), ' ');
  const bool first = a.get_or(1, Value::boolean(false)).truthy();
  const bool blank = a.get_or(2, Value::boolean(false)).truthy();
  const std::vector<std::string> lines = split_lines(text + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out += "\n";
      if (blank || !lines[i].empty()) out += pad;
    }
    out += lines[i];
    KVP_RETURN_IF_ERROR(ev.check_size(out.size()));
  }
  if (first) out = pad + out;
  KVP_RETURN_IF_ERROR(ev.check_size(out.size()));
  return Value::string(std::move(out));
}

Result<Value> round_filter(const Value& input, CallArgs& args) {
  ArgBinder a("round", args, {"precision", "method"});
  KVP_RETURN_IF_ERROR(a.status());
  if (!input.is_number()) {
    return Status::invalid_argument("type {} doesn't define __round__ method", input.type_name());
  }
  const int64_t precision = a.get_or(0, Value::integer(0)).as_int();
  KVP_ASSIGN_OR_RETURN(std::string method, a.get_or(1, Value::string("common")).to_str());
  if (method != "common" && method != "ceil" && method != "floor") {
    return Status::invalid_argument("method must be common, ceil or floor");
  }
  if (method == "common") {
    if (!input.is_float()) return Value::integer(input.as_int());
    return Value::number(round_half_even(input.as_double(), precision));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = input.as_double() * scale;
  return Value::number((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

}  // namespace

bool is_filter(std::string_view name) {
  return std::find(std::begin(kFilters), std::end(kFilters), name) != std::end(kFilters);
}

bool is_test(std::string_view name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

Result<Value> builtin_filter(Evaluator& ev, const std::string& name, const Value& input,
                             CallArgs& args) {
  if (name == "default" || name == "d") {
    ArgBinder a(name, args, {"default_value", "boolean"});
    KVP_RETURN_IF_ERROR(a.status());
    const bool boolean = a.get_or(1, Value::boolean(false)).truthy();
    if (input.is_undefined() || (boolean && !input.truthy())) {
      return a.get_or(0, Value::string(""));
    }
    return input;
  }
  if (name == "tojson") return tojson(ev, input, args);
  if (name == "map") return map_items(ev, input, args);
  if (name == "select" || name == "reject") {
    return select_items(ev, input, args, false, name == "select");
  }
  if (name == "selectattr" || name == "rejectattr") {
    return select_items(ev, input, args, true, name == "selectattr");
  }
  if (name == "indent") return indent(ev, input, args);
  if (name == "round") return round_filter(input, args);
  if (name == "max" || name == "min") return aggregate(ev, input, args, name == "max");
  if (name == "format") {
    CallArgs rest = args;
    if (!rest.keyword.empty()) return Status::unsupported("format() keyword arguments");
    KVP_ASSIGN_OR_RETURN(std::string text, input.to_str());
    return binary_op(ev, BinaryOp::kMod, Value::string(text), Value::list(rest.positional, true));
  }
  if (name == "join") {
    ArgBinder a("join", args, {"d", "attribute"});
    KVP_RETURN_IF_ERROR(a.status());
    KVP_ASSIGN_OR_RETURN(std::string sep, a.get_or(0, Value::string("")).to_str());
    const Value attribute = a.get_or(1, Value::none());
    KVP_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(ev, input));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += sep;
      const Value item = attribute.is_none() ? items[i] : get_path(items[i], attribute.as_string());
      KVP_ASSIGN_OR_RETURN(std::string text, item.to_str());
      out += text;
      KVP_RETURN_IF_ERROR(ev.check_size(out.size()));
    }
    return Value::string(std::move(out));
  }
  if (name == "sort" || name == "unique" || name == "dictsort") {
    const bool dictsort = name == "dictsort";
    ArgBinder a(
        name, args,
        dictsort ? std::initializer_list<std::string_view>{"case_sensitive", "by", "reverse"}
        : name == "sort"
            ? std::initializer_list<std::string_view>{"reverse", "case_sensitive", "attribute"}
            : std::initializer_list<std::string_view>{"case_sensitive", "attribute"});
    KVP_RETURN_IF_ERROR(a.status());
    const bool reverse =
        a.get_or(dictsort ? 2 : 0, Value::boolean(false)).truthy() && name != "unique";
    const bool case_sensitive = a.get_or(dictsort         ? 0
                                         : name == "sort" ? 1
                                                          : 0,
                                         Value::boolean(false))
                                    .truthy();
    std::vector<Value> items;
    std::function<Value(const Value&)> key;
    if (dictsort) {
      if (!input.is_dict()) return Status::invalid_argument("You can only sort by either a dict");
      const std::string by = a.get_or(1, Value::string("key")).to_str().value();
      if (by != "key" && by != "value") {
        return Status::invalid_argument("You can only sort by either 'key' or 'value'");
      }
      for (const auto& [k, v] : input.dict_data().entries)
        items.push_back(Value::list({k, v}, true));
      const size_t pos = by == "key" ? 0 : 1;
      key = [pos, case_sensitive](const Value& v) {
        return fold_case(v.items()[pos], case_sensitive);
      };
    } else {
      KVP_ASSIGN_OR_RETURN(items, iterate(ev, input));
      const Value attribute = a.get_or(name == "sort" ? 2 : 1, Value::none());
      key = [attribute, case_sensitive](const Value& v) {
        return fold_case(attribute.is_string() ? get_path(v, attribute.as_string()) : v,
                         case_sensitive);
      };
    }
    if (name == "unique") {
      std::vector<Value> seen_keys;
      std::vector<Value> out;
      for (const Value& item : items) {
        const Value k = key(item);
        if (std::none_of(seen_keys.begin(), seen_keys.end(),
                         [&](const Value& s) { return values_equal(s, k); })) {
          seen_keys.push_back(k);
          out.push_back(item);
        }
      }
      return Value::list(std::move(out));
    }
    KVP_RETURN_IF_ERROR(sort_values(&items, key, reverse));
    return Value::list(std::move(items));
  }
  if (name == "batch") {
    ArgBinder a("batch", args, {"linecount", "fill_with"});
    KVP_RETURN_IF_ERROR(a.status());
    if (a.get(0) == nullptr || !a.get(0)->is_int() || a.get(0)->as_int() <= 0) {
      return Status::invalid_argument("batch() needs a positive linecount");
    }
    const auto size = static_cast<size_t>(a.get(0)->as_int());
    KVP_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(ev, input));
    std::vector<Value> batches;
    for (size_t i = 0; i < items.size(); i += size) {
      std::vector<Value> batch(
          items.begin() + static_cast<ptrdiff_t>(i),
          items.begin() + static_cast<ptrdiff_t>(std::min(i + size, items.size())));
      if (batch.size() < size && a.get(1) != nullptr) batch.resize(size, *a.get(1));
      batches.push_back(Value::list(std::move(batch)));
    }
    return Value::list(std::move(batches));
  }
  if (name == "attr") {
    ArgBinder a("attr", args, {"name"});
    KVP_RETURN_IF_ERROR(a.status());
    if (a.get(0) == nullptr || !a.get(0)->is_string()) return Value::undefined("attr needs a name");
    if (input.is_dict() && !input.is_namespace()) {
      const Value v = get_attribute(input, a.get(0)->as_string());
      return v.is_callable() ? v : Value::undefined("no attribute");
    }
    return get_attribute(input, a.get(0)->as_string());
  }
  if (name == "replace") {
    ArgBinder a("replace", args, {"old", "new", "count"});
    KVP_RETURN_IF_ERROR(a.status());
    KVP_ASSIGN_OR_RETURN(std::string text, input.to_str());
    if (a.get(0) == nullptr || a.get(1) == nullptr) {
      return Status::invalid_argument("replace() needs old and new");
    }
    KVP_ASSIGN_OR_RETURN(std::string from, a.get(0)->to_str());
    KVP_ASSIGN_OR_RETURN(std::string to, a.get(1)->to_str());
    const Value count = a.get_or(2, Value::none());
    std::optional<std::string> out = replace(text, from, to, count.is_none() ? -1 : count.as_int(),
                                             ev.limits().max_output_bytes);
    if (!out) return ev.check_size(ev.limits().max_output_bytes + 1);
    return Value::string(std::move(*out));
  }
  if (name == "trim") {
    ArgBinder a("trim", args, {"chars"});
    KVP_RETURN_IF_ERROR(a.status());
    KVP_ASSIGN_OR_RETURN(std::string text, input.to_str());
    std::optional<std::string> chars;
    if (a.get(0) != nullptr && !a.get(0)->is_none()) chars = a.get(0)->to_str().value();
    return Value::string(strip(text, chars, true, true));
  }
  if (name == "int" || name == "float") {
    ArgBinder a(name, args, {"default", "base"});
    KVP_RETURN_IF_ERROR(a.status());
    const bool to_int = name == "int";
    const Value fallback = a.get_or(0, to_int ? Value::integer(0) : Value::number(0.0));
    if (input.is_number()) {
      if (!to_int) return Value::number(input.as_double());
      if (!input.is_float()) return Value::integer(input.as_int());
      const double f = input.as_double();
      if (!std::isfinite(f) || std::fabs(f) >= 9.2e18) return fallback;
      return Value::integer(static_cast<int64_t>(f));
    }
    if (!input.is_string()) return fallback;
    if (to_int) {
      const int base = static_cast<int>(a.get_or(1, Value::integer(10)).as_int());
      if (auto v = parse_int(input.as_string(), base)) return Value::integer(*v);
      if (auto f = parse_float(input.as_string()); f && std::isfinite(*f)) {
        return Value::integer(static_cast<int64_t>(*f));
      }
      return fallback;
    }
    if (auto f = parse_float(input.as_string())) return Value::number(*f);
    return fallback;
  }
  if (name == "sum") {
    ArgBinder a("sum", args, {"attribute", "start"});
    KVP_RETURN_IF_ERROR(a.status());
    const Value attribute = a.get_or(0, Value::none());
    KVP_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(ev, input));
    Value total = a.get_or(1, Value::integer(0));
    for (const Value& item : items) {
      const Value term = attribute.is_string() ? get_path(item, attribute.as_string()) : item;
      KVP_ASSIGN_OR_RETURN(total, binary_op(ev, BinaryOp::kAdd, total, term));
    }
    return total;
  }
  if (!args.positional.empty() || !args.keyword.empty()) {
    return Status::invalid_argument("filter '{}' takes no arguments", name);
  }
  if (name == "length" || name == "count") {
    switch (input.kind()) {
      case Value::Kind::kUndefined:
        return Value::integer(0);
      case Value::Kind::kString:
        return Value::integer(static_cast<int64_t>(count_code_points(input.as_string())));
      case Value::Kind::kList:
        return Value::integer(static_cast<int64_t>(input.items().size()));
      case Value::Kind::kDict:
        if (!input.is_namespace()) {
          return Value::integer(static_cast<int64_t>(input.dict_data().size()));
        }
        break;
      default:
        break;
    }
    return Status::invalid_argument("object of type '{}' has no len()", input.type_name());
  }
  if (name == "first" || name == "last") {
    KVP_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(ev, input));
    if (items.empty()) return Value::undefined("No " + name + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    KVP_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(ev, input));
    return Value::list(std::move(items));
  }
  if (name == "reverse") {
    if (input.is_string()) {
      std::vector<uint32_t> cps = decode_utf8(input.as_string());
      std::reverse(cps.begin(), cps.end());
      return Value::string(encode_utf8(cps));
    }
    KVP_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(ev, input));
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (name == "items") {
    if (input.is_undefined()) return Value::list();
    if (!input.is_dict() || input.is_namespace()) {
      return Status::invalid_argument("Can only get item pairs from a mapping.");
    }
    std::vector<Value> pairs;
    for (const auto& [k, v] : input.dict_data().entries) pairs.push_back(Value::list({k, v}, true));
    return Value::list(std::move(pairs));
  }
  if (name == "abs") {
    if (!input.is_number()) {
      return Status::invalid_argument("bad operand type for abs(): '{}'", input.type_name());
    }
    if (input.is_float()) return Value::number(std::fabs(input.as_double()));
    if (input.as_int() == INT64_MIN) return Status::invalid_argument("integer overflow");
    return Value::integer(std::llabs(input.as_int()));
  }
  KVP_ASSIGN_OR_RETURN(std::string text, input.to_str());
  if (name == "string" || name == "safe") return Value::string(std::move(text));
  if (name == "upper") return Value::string(to_upper(text));
  if (name == "lower") return Value::string(to_lower(text));
  if (name == "title") return Value::string(jinja_title(text));
  if (name == "capitalize") return Value::string(capitalize(text));
  if (name == "escape" || name == "e" || name == "forceescape") {
    return Value::string(html_escape(text));
  }
  if (name == "wordcount") {
    int64_t words = 0;
    bool in_word = false;
    for (uint32_t c : decode_utf8(text)) {
      const bool word_char = c >= 0x80 || std::isalnum(static_cast<int>(c)) || c == '_';
      if (word_char && !in_word) ++words;
      in_word = word_char;
    }
    return Value::integer(words);
  }
  return Status::internal("filter '{}' is not wired", name);
}

Result<bool> builtin_test(Evaluator& ev, const std::string& name, const Value& input,
                          CallArgs& args) {
  ArgBinder a(name, args, {"arg"});
  KVP_RETURN_IF_ERROR(a.status());
  const Value arg = a.get_or(0, Value());
  if (name == "defined") return !input.is_undefined();
  if (name == "undefined") return input.is_undefined();
  if (name == "none") return input.is_none();
  if (name == "boolean") return input.is_bool();
  if (name == "true") return input.is_bool() && input.as_bool();
  if (name == "false") return input.is_bool() && !input.as_bool();
  if (name == "string") return input.is_string();
  if (name == "number") return input.is_number();
  if (name == "integer") return input.is_int();
  if (name == "float") return input.is_float();
  if (name == "mapping") return input.is_dict() && !input.is_namespace();
  if (name == "callable") return input.is_callable();
  if (name == "iterable" || name == "sequence") {
    return input.is_undefined() || input.is_string() || input.is_list() ||
           (input.is_dict() && !input.is_namespace());
  }
  if (name == "escaped") return false;
  if (name == "filter") return input.is_string() && is_filter(input.as_string());
  if (name == "test") return input.is_string() && is_test(input.as_string());
  if (name == "sameas") return input.same_as(arg);
  if (name == "lower" || name == "upper") {
    KVP_ASSIGN_OR_RETURN(std::string text, input.to_str());
    return name == "lower" ? to_lower(text) == text && to_upper(text) != text
                           : to_upper(text) == text && to_lower(text) != text;
  }
  if (name == "in") {
    return contains(ev, arg, input);
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    const Value divisor = name == "divisibleby" ? arg : Value::integer(2);
    KVP_ASSIGN_OR_RETURN(Value rest, binary_op(ev, BinaryOp::kMod, input, divisor));
    const bool zero = values_equal(rest, Value::integer(0));
    return name == "odd" ? !zero : zero;
  }
  BinaryOp op = BinaryOp::kEq;
  if (name == "eq" || name == "equalto" || name == "==") {
    op = BinaryOp::kEq;
  } else if (name == "ne" || name == "!=") {
    op = BinaryOp::kNe;
  } else if (name == "lt" || name == "lessthan" || name == "<") {
    op = BinaryOp::kLt;
  } else if (name == "le" || name == "<=") {
    op = BinaryOp::kLe;
  } else if (name == "gt" || name == "greaterthan" || name == ">") {
    op = BinaryOp::kGt;
  } else if (name == "ge" || name == ">=") {
    op = BinaryOp::kGe;
  } else {
    return Status::internal("test '{}' is not wired", name);
  }
  KVP_ASSIGN_OR_RETURN(Value result, binary_op(ev, op, input, arg));
  return result.truthy();
}

}  // namespace kvp::jinja

#include "jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "jinja/text.h"

namespace kvp::jinja {

namespace {

Status depth_error(size_t max_depth) {
  return Status::resource_exhausted("value nesting depth limit ({}) exceeded", max_depth);
}

Status size_error(size_t max_bytes) {
  return Status::resource_exhausted("output size limit ({} bytes) exceeded", max_bytes);
}

}  // namespace

const std::string& Value::empty_string() {
  static const std::string empty;
  return empty;
}

Value Value::undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.string_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.bool_ = b;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.int_ = i;
  return v;
}

Value Value::number(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.float_ = f;
  return v;
}

Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.string_ = std::make_shared<const std::string>(std::move(s));
  return v;
}

Value Value::list(std::vector<Value> items, bool is_tuple) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<ListData>();
  v.list_->items = std::move(items);
  v.list_->is_tuple = is_tuple;
  return v;
}

Value Value::dict() {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<DictData>();
  return v;
}

Value Value::namespace_dict() {
  Value v = dict();
  v.dict_->is_namespace = true;
  return v;
}

Value Value::callable(std::string name, NativeFunction fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.callable_ = std::make_shared<CallableData>(CallableData{std::move(name), std::move(fn)});
  return v;
}

Result<Value> Value::from_json(const nlohmann::ordered_json& json, size_t max_depth) {
  if (max_depth == 0) return depth_error(256);
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return boolean(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return integer(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = json.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return number(static_cast<double>(u));
      return integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return number(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return string(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& element : json) {
        KVP_ASSIGN_OR_RETURN(Value item, from_json(element, max_depth - 1));
        items.push_back(std::move(item));
      }
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = dict();
      for (const auto& [key, element] : json.items()) {
        KVP_ASSIGN_OR_RETURN(Value item, from_json(element, max_depth - 1));
        KVP_RETURN_IF_ERROR(d.dict_->set(string(key), std::move(item)));
      }
      return d;
    }
    default:
      return Status::invalid_argument("JSON value of type {} cannot be a template value",
                                      json.type_name());
  }
}

bool Value::is_tuple() const { return is_list() && list_->is_tuple; }
bool Value::is_namespace() const { return is_dict() && dict_->is_namespace; }

double Value::as_double() const {
  if (is_float()) return float_;
  return static_cast<double>(as_int());
}

std::vector<Value>& Value::items() const {
  KVP_CHECK(is_list(), "items() of a {}", type_name());
  return list_->items;
}

DictData& Value::dict_data() const {
  KVP_CHECK(is_dict(), "dict_data() of a {}", type_name());
  return *dict_;
}

const CallableData& Value::callable_data() const {
  KVP_CHECK(is_callable(), "callable_data() of a {}", type_name());
  return *callable_;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return bool_;
    case Kind::kInt:
      return int_ != 0;
    case Kind::kFloat:
      return float_ != 0.0;
    case Kind::kString:
      return !as_string().empty();
    case Kind::kList:
      return !list_->items.empty();
    case Kind::kDict:
      return dict_->is_namespace || !dict_->entries.empty();
    case Kind::kCallable:
      return true;
  }
  return false;
}

Result<std::string> Value::to_str(size_t max_depth, size_t max_bytes) const {
  switch (kind_) {
    case Kind::kUndefined:
      return std::string();
    case Kind::kString:
      return as_string();
    default:
      return to_repr(max_depth, max_bytes);
  }
}

Result<std::string> Value::to_repr(size_t max_depth, size_t max_bytes) const {
  if (max_depth == 0) return depth_error(256);
  switch (kind_) {
    case Kind::kUndefined:
      return std::string("Undefined");
    case Kind::kNone:
      return std::string("None");
    case Kind::kBool:
      return std::string(bool_ ? "True" : "False");
    case Kind::kInt:
      return std::to_string(int_);
    case Kind::kFloat:
      return format_float(float_);
    case Kind::kString:
      return repr_string(as_string());
    case Kind::kList: {
      std::string out = list_->is_tuple ? "(" : "[";
      for (size_t i = 0; i < list_->items.size(); ++i) {
        if (i > 0) out += ", ";
        KVP_ASSIGN_OR_RETURN(std::string item, list_->items[i].to_repr(max_depth - 1, max_bytes));
        out += item;
        if (out.size() > max_bytes) return size_error(max_bytes);
      }
      if (list_->is_tuple && list_->items.size() == 1) out += ",";
      out += list_->is_tuple ? ")" : "]";
      return out;
    }
    case Kind::kDict: {
      std::string out = dict_->is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [key, value] : dict_->entries) {
        if (!first) out += ", ";
        first = false;
        KVP_ASSIGN_OR_RETURN(std::string key_text, key.to_repr(max_depth - 1, max_bytes));
        KVP_ASSIGN_OR_RETURN(std::string value_text, value.to_repr(max_depth - 1, max_bytes));
        out += key_text + ": " + value_text;
        if (out.size() > max_bytes) return size_error(max_bytes);
      }
      out += dict_->is_namespace ? "}>" : "}";
      return out;
    }
    case Kind::kCallable:
      return "<built-in function " + callable_->name + ">";
  }
  return std::string();
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return list_->is_tuple ? "tuple" : "list";
    case Kind::kDict:
      return dict_->is_namespace ? "Namespace" : "dict";
    case Kind::kCallable:
      return "function";
  }
  return "object";
}

bool Value::same_as(const Value& other) const {
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kList:
      return list_ == other.list_;
    case Kind::kDict:
      return dict_ == other.dict_;
    case Kind::kCallable:
      return callable_ == other.callable_;
    default:
      return values_equal(*this, other);
  }
}

const Value* DictData::find(const Value& key) const {
  auto hashed = hash_key(key);
  if (!hashed.is_ok()) return nullptr;
  const auto it = index.find(*hashed);
  return it == index.end() ? nullptr : &entries[it->second].second;
}

const Value* DictData::find(std::string_view key) const {
  std::string hashed = "s";
  hashed += key;
  const auto it = index.find(hashed);
  return it == index.end() ? nullptr : &entries[it->second].second;
}

Status DictData::set(const Value& key, Value value) {
  KVP_ASSIGN_OR_RETURN(std::string hashed, hash_key(key));
  const auto [it, inserted] = index.emplace(std::move(hashed), entries.size());
  if (inserted) {
    entries.emplace_back(key, std::move(value));
  } else {
    entries[it->second].second = std::move(value);
  }
  return Status::ok();
}

Result<std::string> DictData::hash_key(const Value& key) {
  switch (key.kind()) {
    case Value::Kind::kString:
      return "s" + key.as_string();
    case Value::Kind::kBool:
    case Value::Kind::kInt:
      return "i" + std::to_string(key.as_int());
    case Value::Kind::kFloat: {
      const double f = key.as_double();
      if (std::nearbyint(f) == f && std::fabs(f) < 9.2e18) {
        return "i" + std::to_string(static_cast<int64_t>(f));
      }
      return "f" + format_float(f);
    }
    case Value::Kind::kNone:
      return std::string("n");
    case Value::Kind::kList:
      if (key.is_tuple()) {
        std::string out = "t(";
        for (const Value& item : key.items()) {
          KVP_ASSIGN_OR_RETURN(std::string part, hash_key(item));
          out += std::to_string(part.size()) + ":" + part;
        }
        return out + ")";
      }
      break;
    default:
      break;
  }
  return Status::invalid_argument("unhashable type: '{}'", key.type_name());
}

bool values_equal(const Value& a, const Value& b, size_t depth) {
  if (depth > 256) return false;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      if (a.is_tuple() != b.is_tuple() || a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i) {
        if (!values_equal(a.items()[i], b.items()[i], depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.is_namespace() || b.is_namespace()) return a.same_as(b);
      if (a.dict_data().size() != b.dict_data().size()) return false;
      for (const auto& [key, value] : a.dict_data().entries) {
        const Value* other = b.dict_data().find(key);
        if (other == nullptr || !values_equal(value, *other, depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::kCallable:
      return a.same_as(b);
    default:
      return false;
  }
}

Status values_less(const Value& a, const Value& b, bool* less, size_t depth) {
  if (depth > 256) return depth_error(256);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      *less = a.as_double() < b.as_double();
    } else {
      *less = a.as_int() < b.as_int();
    }
    return Status::ok();
  }
  if (a.is_string() && b.is_string()) {
    *less = a.as_string() < b.as_string();  // UTF-8 byte order is code point order
    return Status::ok();
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (values_equal(x[i], y[i], depth + 1)) continue;
      return values_less(x[i], y[i], less, depth + 1);
    }
    *less = x.size() < y.size();
    return Status::ok();
  }
  return Status::invalid_argument("'<' not supported between instances of '{}' and '{}'",
                                  a.type_name(), b.type_name());
}

std::string format_float(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == 0.0) return std::signbit(f) ? "-0.0" : "0.0";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  const std::string sci(buf, result.ptr);
  // sci is "[-]d[.ddd]e[+-]xx": split into sign, digits and exponent.
  size_t pos = 0;
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    pos = 1;
  }
  const size_t e_at = sci.find('e');
  std::string digits;
  for (size_t i = pos; i < e_at; ++i) {
    if (sci[i] != '.') digits.push_back(sci[i]);
  }
  const int exponent = std::stoi(sci.substr(e_at + 1));
  const int decimal_point = exponent + 1;  // digits before the point
  const int num_digits = static_cast<int>(digits.size());
  std::string out = sign;
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (num_digits > 1) out += "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+',
                  exponent < 0 ? -exponent : exponent);
    return out + exp_buf;
  }
  if (decimal_point <= 0) {
    return out + "0." + std::string(static_cast<size_t>(-decimal_point), '0') + digits;
  }
  if (decimal_point >= num_digits) {
    return out + digits + std::string(static_cast<size_t>(decimal_point - num_digits), '0') + ".0";
  }
  return out + digits.substr(0, decimal_point) + "." + digits.substr(decimal_point);
}

std::string repr_string(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (uint32_t c : decode_utf8(s)) {
    char buf[16];
    if (c == '\\' || c == static_cast<uint32_t>(quote)) {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0xa0) || c == 0xad ||
               (c >= 0xDC80 && c <= 0xDCFF)) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", c >= 0xDC80 && c <= 0xDCFF ? c - 0xDC00 : c);
      out += buf;
    } else if (c == 0x1680 || (c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) ||
               (c >= 0x205f && c <= 0x2064) || c == 0x3000 || c == 0xfeff) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      append_utf8(c, &out);
    }
  }
  out.push_back(quote);
  return out;
}

namespace {

void append_json_string(std::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (uint32_t c : decode_utf8(s)) {
    char buf[16];
    switch (c) {
      case '"':
        *out += "\\\"";
        continue;
      case '\\':
        *out += "\\\\";
        continue;
      case '\n':
        *out += "\\n";
        continue;
      case '\r':
        *out += "\\r";
        continue;
      case '\t':
        *out += "\\t";
        continue;
      case '\b':
        *out += "\\b";
        continue;
      case '\f':
        *out += "\\f";
        continue;
      default:
        break;
    }
    if (c < 0x20 || (ensure_ascii && c > 0x7e && c < 0x10000)) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      *out += buf;
    } else if (ensure_ascii && c >= 0x10000) {
      const uint32_t v = c - 0x10000;
      std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      *out += buf;
    } else {
      append_utf8(c, out);
    }
  }
  out->push_back('"');
}

std::string json_float(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f > 0 ? "Infinity" : "-Infinity";
  return format_float(f);
}

Status write_json(const Value& value, const JsonOptions& options, size_t level, size_t max_depth,
                  std::string* out) {
  if (level > max_depth) return depth_error(max_depth);
  if (out->size() > options.max_bytes) return size_error(options.max_bytes);
  auto newline = [&](size_t at_level) {
    if (!options.has_indent) return;
    out->push_back('\n');
    for (size_t i = 0; i < at_level && out->size() <= options.max_bytes; ++i) {
      *out += options.indent;
    }
  };
  switch (value.kind()) {
    case Value::Kind::kNone:
      *out += "null";
      return Status::ok();
    case Value::Kind::kBool:
      *out += value.as_bool() ? "true" : "false";
      return Status::ok();
    case Value::Kind::kInt:
      *out += std::to_string(value.as_int());
      return Status::ok();
    case Value::Kind::kFloat:
      *out += json_float(value.as_double());
      return Status::ok();
    case Value::Kind::kString:
      append_json_string(value.as_string(), options.ensure_ascii, out);
      return Status::ok();
    case Value::Kind::kList: {
      if (value.items().empty()) {
        *out += "[]";
        return Status::ok();
      }
      out->push_back('[');
      for (size_t i = 0; i < value.items().size(); ++i) {
        if (i > 0) *out += options.item_separator;
        newline(level + 1);
        KVP_RETURN_IF_ERROR(write_json(value.items()[i], options, level + 1, max_depth, out));
      }
      newline(level);
      out->push_back(']');
      return Status::ok();
    }
    case Value::Kind::kDict: {
      if (value.is_namespace()) break;
      const auto& entries = value.dict_data().entries;
      if (entries.empty()) {
        *out += "{}";
        return Status::ok();
      }
      std::vector<std::pair<std::string, const Value*>> items;
      for (const auto& [key, item] : entries) {
        std::string key_text;
        if (key.is_string()) {
          key_text = key.as_string();
        } else if (key.is_bool()) {
          key_text = key.as_bool() ? "true" : "false";
        } else if (key.is_int()) {
          key_text = std::to_string(key.as_int());
        } else if (key.is_float()) {
          key_text = json_float(key.as_double());
        } else if (key.is_none()) {
          key_text = "null";
        } else {
          return Status::invalid_argument("keys must be str, int, float, bool or None, not {}",
                                          key.type_name());
        }
        items.emplace_back(std::move(key_text), &item);
      }
      if (options.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto& x, const auto& y) { return x.first < y.first; });
      }
      out->push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) *out += options.item_separator;
        newline(level + 1);
        append_json_string(items[i].first, options.ensure_ascii, out);
        *out += options.key_separator;
        KVP_RETURN_IF_ERROR(write_json(*items[i].second, options, level + 1, max_depth, out));
      }
      newline(level);
      out->push_back('}');
      return Status::ok();
    }
    default:
      break;
  }
  return Status::invalid_argument("Object of type {} is not JSON serializable", value.type_name());
}

}  // namespace

Result<std::string> to_json(const Value& value, const JsonOptions& options, size_t max_depth) {
  std::string out;
  KVP_RETURN_IF_ERROR(write_json(value, options, 0, max_depth, &out));
  if (out.size() > options.max_bytes) return size_error(options.max_bytes);
  return out;
}

}  // namespace kvp::jinja

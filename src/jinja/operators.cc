// Arithmetic, comparison, membership, iteration and slicing with Python's semantics.
#include <cmath>

#include "jinja/builtins.h"
#include "jinja/evaluator.h"
#include "jinja/template.h"
#include "jinja/text.h"

namespace kvp::jinja {

namespace {

const char* op_symbol(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd:
      return "+";
    case BinaryOp::kSub:
      return "-";
    case BinaryOp::kMul:
      return "*";
    case BinaryOp::kDiv:
      return "/";
    case BinaryOp::kFloorDiv:
      return "//";
    case BinaryOp::kMod:
      return "%";
    case BinaryOp::kPow:
      return "**";
    case BinaryOp::kLt:
      return "<";
    case BinaryOp::kLe:
      return "<=";
    case BinaryOp::kGt:
      return ">";
    case BinaryOp::kGe:
      return ">=";
    default:
      return "?";
  }
}

Status type_error(BinaryOp op, const Value& a, const Value& b) {
  if (a.is_undefined()) return Status::invalid_argument("{}", a.undefined_hint());
  if (b.is_undefined()) return Status::invalid_argument("{}", b.undefined_hint());
  return Status::invalid_argument("unsupported operand type(s) for {}: '{}' and '{}'",
                                  op_symbol(op), a.type_name(), b.type_name());
}

Status overflow() { return Status::invalid_argument("integer overflow (past 64 bits)"); }

Result<Value> repeat(Evaluator& ev, const Value& seq, int64_t times) {
  if (times < 0) times = 0;
  if (seq.is_string()) {
    const size_t size = seq.as_string().size();
    if (size > 0 && static_cast<uint64_t>(times) > ev.limits().max_output_bytes / size) {
      return ev.check_size(ev.limits().max_output_bytes + 1);
    }
    std::string out;
    out.reserve(size * static_cast<size_t>(times));
    for (int64_t i = 0; i < times; ++i) out += seq.as_string();
    return Value::string(std::move(out));
  }
  const size_t size = seq.items().size();
  if (size > 0 && static_cast<uint64_t>(times) > ev.limits().max_loop_iterations / size) {
    return ev.count_iterations(ev.limits().max_loop_iterations + 1);
  }
  KVP_RETURN_IF_ERROR(ev.count_iterations(size * static_cast<uint64_t>(times)));
  std::vector<Value> items;
  for (int64_t i = 0; i < times; ++i) {
    items.insert(items.end(), seq.items().begin(), seq.items().end());
  }
  return Value::list(std::move(items), seq.is_tuple());
}

double python_fmod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0.0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

// "%s" % args, for %s, %d, %i, %r and %%.
Result<Value> percent_format(Evaluator& ev, const std::string& format, const Value& args) {
  std::vector<Value> values;
  if (args.is_tuple()) {
    values = args.items();
  } else {
    values.push_back(args);
  }
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out.push_back(format[i]);
      continue;
    }
    if (++i == format.size()) return Status::invalid_argument("incomplete format");
    const char spec = format[i];
    if (spec == '%') {
      out.push_back('%');
      continue;
    }
    if (next >= values.size()) {
      return Status::invalid_argument("not enough arguments for format string");
    }
    KVP_RETURN_IF_ERROR(ev.check_size(out.size()));
    const Value& v = values[next++];
    if (spec == 's') {
      KVP_ASSIGN_OR_RETURN(std::string text, v.to_str());
      out += text;
    } else if (spec == 'r') {
      KVP_ASSIGN_OR_RETURN(std::string text, v.to_repr());
      out += text;
    } else if (spec == 'd' || spec == 'i') {
      if (!v.is_number()) return Status::invalid_argument("%d format: a number is required");
      out += std::to_string(v.is_float() ? static_cast<int64_t>(v.as_double()) : v.as_int());
    } else {
      return Status::unsupported("format character '{}' is not supported", spec);
    }
  }
  if (next < values.size()) {
    return Status::invalid_argument("not all arguments converted during string formatting");
  }
  KVP_RETURN_IF_ERROR(ev.check_size(out.size()));
  return Value::string(std::move(out));
}

Result<Value> arithmetic(BinaryOp op, const Value& a, const Value& b) {
  if (!a.is_number() || !b.is_number()) return type_error(op, a, b);
  const bool ints = !a.is_float() && !b.is_float();
  const int64_t x = ints ? a.as_int() : 0;
  const int64_t y = ints ? b.as_int() : 0;
  const double fx = a.as_double();
  const double fy = b.as_double();
  int64_t r = 0;
  switch (op) {
    case BinaryOp::kAdd:
      if (!ints) return Value::number(fx + fy);
      if (__builtin_add_overflow(x, y, &r)) return overflow();
      return Value::integer(r);
    case BinaryOp::kSub:
      if (!ints) return Value::number(fx - fy);
      if (__builtin_sub_overflow(x, y, &r)) return overflow();
      return Value::integer(r);
    case BinaryOp::kMul:
      if (!ints) return Value::number(fx * fy);
      if (__builtin_mul_overflow(x, y, &r)) return overflow();
      return Value::integer(r);
    case BinaryOp::kDiv:
      if (fy == 0.0) return Status::invalid_argument("division by zero");
      return Value::number(fx / fy);
    case BinaryOp::kFloorDiv:
      if (fy == 0.0) return Status::invalid_argument("integer division or modulo by zero");
      if (!ints) return Value::number(std::floor(fx / fy));
      if (x == INT64_MIN && y == -1) return overflow();
      r = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --r;
      return Value::integer(r);
    case BinaryOp::kMod:
      if (fy == 0.0) return Status::invalid_argument("integer division or modulo by zero");
      if (!ints) return Value::number(python_fmod(fx, fy));
      if (y == -1) return Value::integer(0);
      r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return Value::integer(r);
    case BinaryOp::kPow: {
      if (!ints || y < 0) {
        if (fx == 0.0 && fy < 0) {
          return Status::invalid_argument("0.0 cannot be raised to a negative power");
        }
        return Value::number(std::pow(fx, fy));
      }
      int64_t result = 1;
      int64_t base = x;
      for (int64_t e = y; e > 0; e >>= 1) {
        if ((e & 1) && __builtin_mul_overflow(result, base, &result)) return overflow();
        if (e > 1 && __builtin_mul_overflow(base, base, &base)) return overflow();
      }
      return Value::integer(result);
    }
    default:
      break;
  }
  return type_error(op, a, b);
}

}  // namespace

Result<Value> binary_op(Evaluator& ev, BinaryOp op, const Value& a, const Value& b) {
  switch (op) {
    case BinaryOp::kEq:
      return Value::boolean(values_equal(a, b));
    case BinaryOp::kNe:
      return Value::boolean(!values_equal(a, b));
    case BinaryOp::kLt:
    case BinaryOp::kLe:
    case BinaryOp::kGt:
    case BinaryOp::kGe: {
      if (a.is_undefined() || b.is_undefined()) return type_error(op, a, b);
      bool less = false;
      if (op == BinaryOp::kLt || op == BinaryOp::kGe) {
        Status s = values_less(a, b, &less);
        if (!s.is_ok()) return type_error(op, a, b);
        return Value::boolean(op == BinaryOp::kLt ? less : !less);
      }
      Status s = values_less(b, a, &less);
      if (!s.is_ok()) return type_error(op, a, b);
      return Value::boolean(op == BinaryOp::kGt ? less : !less);
    }
    case BinaryOp::kIn:
    case BinaryOp::kNotIn: {
      KVP_ASSIGN_OR_RETURN(bool found, contains(ev, b, a));
      return Value::boolean(found == (op == BinaryOp::kIn));
    }
    case BinaryOp::kConcat: {
      KVP_ASSIGN_OR_RETURN(std::string x, a.to_str());
      KVP_ASSIGN_OR_RETURN(std::string y, b.to_str());
      KVP_RETURN_IF_ERROR(ev.check_size(x.size() + y.size()));
      return Value::string(x + y);
    }
    case BinaryOp::kAdd:
      if (a.is_string() && b.is_string()) {
        KVP_RETURN_IF_ERROR(ev.check_size(a.as_string().size() + b.as_string().size()));
        return Value::string(a.as_string() + b.as_string());
      }
      if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
        // every item of the new list counts: a list doubled in a loop stops at the limit
        KVP_RETURN_IF_ERROR(ev.count_iterations(a.items().size() + b.items().size()));
        std::vector<Value> items = a.items();
        items.insert(items.end(), b.items().begin(), b.items().end());
        return Value::list(std::move(items), a.is_tuple());
      }
      return arithmetic(op, a, b);
    case BinaryOp::kMul:
      if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) {
        return repeat(ev, a, b.as_int());
      }
      if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) {
        return repeat(ev, b, a.as_int());
      }
      return arithmetic(op, a, b);
    case BinaryOp::kMod:
      if (a.is_string()) return percent_format(ev, a.as_string(), b);
      return arithmetic(op, a, b);
    default:
      return arithmetic(op, a, b);
  }
}

Result<std::vector<Value>> iterate(Evaluator& ev, const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return std::vector<Value>();
    case Value::Kind::kList:
      KVP_RETURN_IF_ERROR(ev.count_iterations(value.items().size()));
      return value.items();
    case Value::Kind::kDict: {
      if (value.is_namespace()) break;
      KVP_RETURN_IF_ERROR(ev.count_iterations(value.dict_data().size()));
      std::vector<Value> keys;
      keys.reserve(value.dict_data().size());
      for (const auto& [key, item] : value.dict_data().entries) keys.push_back(key);
      return keys;
    }
    case Value::Kind::kString: {
      const std::vector<uint32_t> code_points = decode_utf8(value.as_string());
      KVP_RETURN_IF_ERROR(ev.count_iterations(code_points.size()));
      std::vector<Value> chars;
      for (uint32_t cp : code_points) {
        std::string c;
        append_utf8(cp, &c);
        chars.push_back(Value::string(std::move(c)));
      }
      return chars;
    }
    default:
      break;
  }
  return Status::invalid_argument("'{}' object is not iterable", value.type_name());
}

Result<bool> contains(Evaluator& ev, const Value& haystack, const Value& needle) {
  switch (haystack.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!needle.is_string()) {
        return Status::invalid_argument("'in <string>' requires string as left operand, not {}",
                                        needle.type_name());
      }
      return haystack.as_string().find(needle.as_string()) != std::string::npos;
    case Value::Kind::kList:
      KVP_RETURN_IF_ERROR(ev.count_iterations(haystack.items().size()));
      for (const Value& item : haystack.items()) {
        if (values_equal(item, needle)) return true;
      }
      return false;
    case Value::Kind::kDict:
      if (haystack.is_namespace()) break;
      if (!DictData::hash_key(needle).is_ok()) {
        return Status::invalid_argument("unhashable type: '{}'", needle.type_name());
      }
      return haystack.dict_data().find(needle) != nullptr;
    default:
      break;
  }
  return Status::invalid_argument("argument of type '{}' is not iterable", haystack.type_name());
}

Result<Value> slice(const Value& value, const Value* start, const Value* stop, const Value* step) {
  auto as_index = [](const Value* v, int64_t* out) -> Status {
    if (v == nullptr || v->is_none()) return Status::ok();
    if (!v->is_int() && !v->is_bool()) {
      return Status::invalid_argument("slice indices must be integers or None");
    }
    *out = v->as_int();
    return Status::ok();
  };
  if (!value.is_list() && !value.is_string()) return Value::undefined("not sliceable");
  std::vector<uint32_t> cps;
  if (value.is_string()) cps = decode_utf8(value.as_string());
  const auto length = static_cast<int64_t>(value.is_string() ? cps.size() : value.items().size());
  int64_t step_value = 1;
  KVP_RETURN_IF_ERROR(as_index(step, &step_value));
  if (step_value == 0) return Status::invalid_argument("slice step cannot be zero");
  const int64_t lower = step_value > 0 ? 0 : -1;
  const int64_t upper = step_value > 0 ? length : length - 1;
  auto adjust = [&](const Value* v, int64_t fallback, int64_t* out) -> Status {
    *out = fallback;
    if (v == nullptr || v->is_none()) return Status::ok();
    KVP_RETURN_IF_ERROR(as_index(v, out));
    if (*out < 0) {
      *out += length;
      if (*out < lower) *out = lower;
    } else if (*out > upper) {
      *out = upper;
    }
    return Status::ok();
  };
  int64_t begin = 0;
  int64_t end = 0;
  KVP_RETURN_IF_ERROR(adjust(start, step_value > 0 ? lower : upper, &begin));
  KVP_RETURN_IF_ERROR(adjust(stop, step_value > 0 ? upper : lower, &end));
  if (value.is_string()) {
    std::string out;
    for (int64_t i = begin; step_value > 0 ? i < end : i > end; i += step_value) {
      append_utf8(cps[static_cast<size_t>(i)], &out);
    }
    return Value::string(std::move(out));
  }
  std::vector<Value> items;
  for (int64_t i = begin; step_value > 0 ? i < end : i > end; i += step_value) {
    items.push_back(value.items()[static_cast<size_t>(i)]);
  }
  return Value::list(std::move(items), value.is_tuple());
}

}  // namespace kvp::jinja

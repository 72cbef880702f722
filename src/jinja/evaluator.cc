#include "jinja/evaluator.h"

#include "jinja/builtins.h"

namespace kvp::jinja {

namespace {

// Restores the evaluator's scope when a child scope ends.
class ScopeGuard {
 public:
  ScopeGuard(std::shared_ptr<Scope>* slot, std::shared_ptr<Scope> scope)
      : slot_(slot), saved_(std::move(*slot)) {
    *slot_ = std::move(scope);
  }
  ~ScopeGuard() { *slot_ = std::move(saved_); }
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;

 private:
  std::shared_ptr<Scope>* slot_;
  std::shared_ptr<Scope> saved_;
};

class CountGuard {
 public:
  explicit CountGuard(size_t* counter) : counter_(counter) { ++*counter_; }
  ~CountGuard() { --*counter_; }
  CountGuard(const CountGuard&) = delete;
  CountGuard& operator=(const CountGuard&) = delete;

 private:
  size_t* counter_;
};

std::shared_ptr<Scope> child_of(const std::shared_ptr<Scope>& parent) {
  auto scope = std::make_shared<Scope>();
  scope->parent = parent;
  return scope;
}

Status undefined_error(const Value& v) {
  return Status::invalid_argument(
      "{}", v.undefined_hint().empty() ? "value is undefined" : v.undefined_hint());
}

}  // namespace

Evaluator::Evaluator(const Limits& limits) : limits_(limits) {}

Status Evaluator::located(SourcePos pos, const Status& status) {
  if (status.is_ok() || status.message().starts_with("line ")) return status;
  return Status(status.code(),
                fmt::format("line {}:{}: {}", pos.line, pos.column, status.message()));
}

Status Evaluator::check_size(size_t num_bytes) const {
  if (num_bytes <= limits_.max_output_bytes) return Status::ok();
  return Status::resource_exhausted("output size limit ({} bytes) exceeded",
                                    limits_.max_output_bytes);
}

Status Evaluator::count_iterations(uint64_t count) {
  num_iterations_ += count;
  if (num_iterations_ <= limits_.max_loop_iterations) return Status::ok();
  return Status::resource_exhausted("loop iteration limit ({}) exceeded",
                                    limits_.max_loop_iterations);
}

Status Evaluator::count_built_bytes(uint64_t num_bytes) {
  num_built_bytes_ += num_bytes;
  if (num_built_bytes_ <= limits_.max_built_bytes) return Status::ok();
  return Status::resource_exhausted("limit on the bytes of strings built ({}) exceeded",
                                    limits_.max_built_bytes);
}

Status Evaluator::emit(std::string_view text, std::string* out) const {
  KVP_RETURN_IF_ERROR(check_size(out->size() + text.size()));
  out->append(text);
  return Status::ok();
}

Result<std::string> Evaluator::render(const Body& body, const Value& context) {
  auto globals = std::make_shared<Scope>();
  add_globals(globals.get());
  for (const auto& [key, value] : context.dict_data().entries) {
    if (key.is_string()) globals->vars[key.as_string()] = value;
  }
  scope_ = child_of(globals);
  std::string out;
  Result<Flow> flow = exec_body(body, &out);
  for (const std::shared_ptr<Scope>& s : macro_scopes_) s->vars.clear();
  for (const Value& ns : namespaces_) {
    ns.dict_data().entries.clear();
    ns.dict_data().index.clear();
  }
  macro_scopes_.clear();
  namespaces_.clear();
  scope_.reset();
  if (!flow.is_ok()) return flow.status();
  return out;
}

Value Evaluator::lookup(const std::string& name) const {
  for (const Scope* s = scope_.get(); s != nullptr; s = s->parent.get()) {
    const auto it = s->vars.find(name);
    if (it != s->vars.end()) return it->second;
  }
  return Value::undefined("'" + name + "' is undefined");
}

Result<Evaluator::Flow> Evaluator::exec_body(const Body& body, std::string* out) {
  for (const StmtPtr& stmt : body) {
    KVP_ASSIGN_OR_RETURN(Flow flow, exec(*stmt, out));
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Result<Evaluator::Flow> Evaluator::exec(const Stmt& stmt, std::string* out) {
  CountGuard depth(&depth_);
  if (depth_ > 4 * limits_.max_nesting_depth) {
    return located(stmt.pos, Status::resource_exhausted("render depth limit ({}) exceeded",
                                                        4 * limits_.max_nesting_depth));
  }
  switch (stmt.kind) {
    case Stmt::Kind::kText:
      KVP_RETURN_IF_ERROR(located(stmt.pos, emit(stmt.text, out)));
      return Flow::kNormal;
    case Stmt::Kind::kOutput: {
      KVP_ASSIGN_OR_RETURN(Value v, eval(*stmt.expr));
      KVP_ASSIGN_OR_RETURN(std::string text, v.to_str());
      KVP_RETURN_IF_ERROR(located(stmt.pos, emit(text, out)));
      return Flow::kNormal;
    }
    case Stmt::Kind::kIf:
      for (const auto& [condition, body] : stmt.branches) {
        if (condition) {
          KVP_ASSIGN_OR_RETURN(Value v, eval(*condition));
          if (!v.truthy()) continue;
        }
        return exec_body(body, out);
      }
      return Flow::kNormal;
    case Stmt::Kind::kFor:
      return exec_for(stmt, out);
    case Stmt::Kind::kSet:
      KVP_RETURN_IF_ERROR(exec_set(stmt));
      return Flow::kNormal;
    case Stmt::Kind::kSetBlock: {
      std::string text;
      {
        ScopeGuard guard(&scope_, child_of(scope_));
        KVP_ASSIGN_OR_RETURN(Flow flow, exec_body(stmt.body, &text));
        (void)flow;
      }
      Value value = Value::string(std::move(text));
      if (stmt.filter) {
        KVP_ASSIGN_OR_RETURN(value, eval_filter(*stmt.filter, &value));
      }
      KVP_RETURN_IF_ERROR(assign(stmt.targets, false, value, stmt.pos));
      return Flow::kNormal;
    }
    case Stmt::Kind::kMacro:
      KVP_RETURN_IF_ERROR(define_macro(stmt));
      return Flow::kNormal;
    case Stmt::Kind::kCallBlock: {
      const Expr& call_expr = *stmt.expr;
      KVP_ASSIGN_OR_RETURN(Value callee, eval(*call_expr.a));
      KVP_ASSIGN_OR_RETURN(CallArgs args, eval_args(call_expr));
      auto closure = scope_;
      macro_scopes_.push_back(closure);
      const Stmt* block = &stmt;
      args.keyword.emplace_back(
          "caller", Value::callable(
                        "caller", [this, block, closure](Evaluator&, CallArgs& a) -> Result<Value> {
                          KVP_ASSIGN_OR_RETURN(std::string text, call_macro(*block, closure, a));
                          return Value::string(std::move(text));
                        }));
      Result<Value> result = call(callee, args);
      if (!result.is_ok()) return located(call_expr.pos, result.status());
      KVP_ASSIGN_OR_RETURN(std::string text, result->to_str());
      KVP_RETURN_IF_ERROR(located(stmt.pos, emit(text, out)));
      return Flow::kNormal;
    }
    case Stmt::Kind::kFilterBlock: {
      std::string text;
      {
        ScopeGuard guard(&scope_, child_of(scope_));
        KVP_ASSIGN_OR_RETURN(Flow flow, exec_body(stmt.body, &text));
        (void)flow;
      }
      const Value input = Value::string(std::move(text));
      KVP_ASSIGN_OR_RETURN(Value v, eval_filter(*stmt.filter, &input));
      KVP_ASSIGN_OR_RETURN(std::string rendered, v.to_str());
      KVP_RETURN_IF_ERROR(located(stmt.pos, emit(rendered, out)));
      return Flow::kNormal;
    }
    case Stmt::Kind::kWith: {
      std::vector<Value> values;
      for (const ExprPtr& value : stmt.values) {
        KVP_ASSIGN_OR_RETURN(Value v, eval(*value));
        values.push_back(std::move(v));
      }
      ScopeGuard guard(&scope_, child_of(scope_));
      for (size_t i = 0; i < values.size(); ++i) scope_->vars[stmt.targets[i]] = values[i];
      return exec_body(stmt.body, out);
    }
    case Stmt::Kind::kBreak:
      return Flow::kBreak;
    case Stmt::Kind::kContinue:
      return Flow::kContinue;
  }
  return Flow::kNormal;
}

Status Evaluator::assign(const std::vector<std::string>& targets, bool unpack, const Value& value,
                         SourcePos pos) {
  if (!unpack) {
    scope_->vars[targets[0]] = value;
    return Status::ok();
  }
  Result<std::vector<Value>> items = iterate(*this, value);
  if (!items.is_ok()) return located(pos, items.status());
  if (items->size() != targets.size()) {
    return located(pos, Status::invalid_argument("cannot unpack {} values into {} names",
                                                 items->size(), targets.size()));
  }
  for (size_t i = 0; i < targets.size(); ++i) scope_->vars[targets[i]] = (*items)[i];
  return Status::ok();
}

Result<Evaluator::Flow> Evaluator::exec_for(const Stmt& stmt, std::string* out) {
  KVP_ASSIGN_OR_RETURN(Value iterable, eval(*stmt.expr));
  if (iterable.is_undefined() && !iterable.undefined_hint().empty() &&
      iterable.undefined_hint().find("unsafe") != std::string::npos) {
    return located(stmt.expr->pos, undefined_error(iterable));
  }
  Result<std::vector<Value>> listed = iterate(*this, iterable);
  if (!listed.is_ok()) return located(stmt.expr->pos, listed.status());
  std::vector<Value> items = std::move(listed).value();
  const std::shared_ptr<Scope> outer = scope_;
  if (stmt.condition) {
    // The filter sees each item, not `loop`; its assignments vanish with its scope.
    ScopeGuard guard(&scope_, child_of(outer));
    std::vector<Value> kept;
    for (const Value& item : items) {
      KVP_RETURN_IF_ERROR(located(stmt.pos, count_iterations(1)));
      KVP_RETURN_IF_ERROR(assign(stmt.targets, stmt.targets_tuple, item, stmt.pos));
      KVP_ASSIGN_OR_RETURN(Value keep, eval(*stmt.condition));
      if (keep.truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    ScopeGuard guard(&scope_, child_of(outer));
    return exec_body(stmt.else_body, out);
  }
  const auto num_items = static_cast<int64_t>(items.size());
  // One `loop` object per loop, updated in place each iteration (jinja2's LoopContext advances
  // the same way): building it afresh cost a dozen allocations per iteration.
  auto index = std::make_shared<int64_t>(0);
  Value loop = Value::dict();
  DictData& d = loop.dict_data();
  for (const char* key : {"index", "index0", "revindex", "revindex0", "first", "last", "length",
                          "depth", "depth0", "previtem", "nextitem"}) {
    (void)d.set(Value::string(key), Value());
  }
  (void)d.set(Value::string("cycle"),
              Value::callable("cycle", [index](Evaluator&, CallArgs& args) -> Result<Value> {
                if (args.positional.empty()) {
                  return Status::invalid_argument("no items for cycling given");
                }
                return args.positional[static_cast<size_t>(*index) % args.positional.size()];
              }));
  for (int64_t i = 0; i < num_items; ++i) {
    // Each iteration starts from the enclosing scope: a `set` in the body lasts one iteration.
    ScopeGuard guard(&scope_, child_of(outer));
    KVP_RETURN_IF_ERROR(located(stmt.pos, count_iterations(1)));
    KVP_RETURN_IF_ERROR(assign(stmt.targets, stmt.targets_tuple, items[i], stmt.pos));
    *index = i;
    auto& fields = d.entries;  // in the order set above
    fields[0].second = Value::integer(i + 1);
    fields[1].second = Value::integer(i);
    fields[2].second = Value::integer(num_items - i);
    fields[3].second = Value::integer(num_items - i - 1);
    fields[4].second = Value::boolean(i == 0);
    fields[5].second = Value::boolean(i == num_items - 1);
    fields[6].second = Value::integer(num_items);
    fields[7].second = Value::integer(1);
    fields[8].second = Value::integer(0);
    fields[9].second = i > 0 ? items[i - 1] : Value::undefined("there is no previous item");
    fields[10].second =
        i + 1 < num_items ? items[i + 1] : Value::undefined("there is no next item");
    scope_->vars["loop"] = loop;
    KVP_ASSIGN_OR_RETURN(Flow flow, exec_body(stmt.body, out));
    if (flow == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

Status Evaluator::exec_set(const Stmt& stmt) {
  KVP_ASSIGN_OR_RETURN(Value value, eval(*stmt.expr));
  if (!stmt.target_expr) return assign(stmt.targets, stmt.targets_tuple, value, stmt.pos);
  const Expr& target = *stmt.target_expr;
  const Value ns = lookup(target.a->name);
  if (!ns.is_namespace()) {
    return located(target.pos,
                   Status::invalid_argument("cannot assign attribute on non-namespace object '{}'",
                                            target.a->name));
  }
  if (target.name.starts_with("_")) {
    return located(
        target.pos,
        Status::invalid_argument("namespace attributes cannot start with '_' ('{}')", target.name));
  }
  return located(target.pos, ns.dict_data().set(Value::string(target.name), std::move(value)));
}

Status Evaluator::define_macro(const Stmt& stmt) {
  auto closure = scope_;
  macro_scopes_.push_back(closure);
  const Stmt* macro = &stmt;
  scope_->vars[stmt.name] = Value::callable(
      stmt.name, [this, macro, closure](Evaluator&, CallArgs& args) -> Result<Value> {
        KVP_ASSIGN_OR_RETURN(std::string text, call_macro(*macro, closure, args));
        return Value::string(std::move(text));
      });
  return Status::ok();
}

Result<std::string> Evaluator::call_macro(const Stmt& macro, const std::shared_ptr<Scope>& closure,
                                          CallArgs& args) {
  CountGuard calls(&call_depth_);
  if (call_depth_ > limits_.max_call_depth) {
    return located(macro.pos, Status::resource_exhausted("macro call depth limit ({}) exceeded",
                                                         limits_.max_call_depth));
  }
  const std::string& name = macro.kind == Stmt::Kind::kMacro ? macro.name : "caller";
  if (args.positional.size() > macro.params.size()) {
    return Status::invalid_argument("macro '{}' takes not more than {} argument(s)", name,
                                    macro.params.size());
  }
  ScopeGuard guard(&scope_, child_of(closure));
  std::vector<bool> given(macro.params.size(), false);
  for (size_t i = 0; i < args.positional.size(); ++i) {
    scope_->vars[macro.params[i].name] = args.positional[i];
    given[i] = true;
  }
  for (auto& [key, value] : args.keyword) {
    size_t i = 0;
    while (i < macro.params.size() && macro.params[i].name != key) ++i;
    if (i < macro.params.size()) {
      scope_->vars[key] = value;
      given[i] = true;
    } else if (key == "caller" && macro.kind == Stmt::Kind::kMacro) {
      scope_->vars["caller"] = value;
    } else {
      return Status::invalid_argument("macro '{}' takes no keyword argument '{}'", name, key);
    }
  }
  for (size_t i = 0; i < macro.params.size(); ++i) {
    if (given[i]) continue;
    if (macro.params[i].default_value) {
      KVP_ASSIGN_OR_RETURN(Value v, eval(*macro.params[i].default_value));
      scope_->vars[macro.params[i].name] = std::move(v);
    } else {
      scope_->vars[macro.params[i].name] =
          Value::undefined("parameter '" + macro.params[i].name + "' was not provided");
    }
  }
  std::string out;
  KVP_ASSIGN_OR_RETURN(Flow flow, exec_body(macro.body, &out));
  (void)flow;
  return out;
}

Result<Value> Evaluator::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) return undefined_error(callee);
  if (!callee.is_callable()) {
    return Status::invalid_argument("'{}' object is not callable", callee.type_name());
  }
  return callee.callable_data().fn(*this, args);
}

Result<Value> Evaluator::apply_filter(const std::string& name, const Value& input, CallArgs& args) {
  if (!is_filter(name)) return Status::invalid_argument("no filter named '{}'", name);
  return builtin_filter(*this, name, input, args);
}

Result<bool> Evaluator::apply_test(const std::string& name, const Value& input, CallArgs& args) {
  if (!is_test(name)) return Status::invalid_argument("no test named '{}'", name);
  return builtin_test(*this, name, input, args);
}

Result<CallArgs> Evaluator::eval_args(const Expr& expr) {
  CallArgs args;
  for (const ExprPtr& item : expr.items) {
    KVP_ASSIGN_OR_RETURN(Value v, eval(*item));
    args.positional.push_back(std::move(v));
  }
  for (const auto& [name, item] : expr.keywords) {
    KVP_ASSIGN_OR_RETURN(Value v, eval(*item));
    args.keyword.emplace_back(name, std::move(v));
  }
  return args;
}

Result<Value> Evaluator::eval(const Expr& expr) {
  CountGuard depth(&depth_);
  if (depth_ > 4 * limits_.max_nesting_depth) {
    return located(expr.pos, Status::resource_exhausted("render depth limit ({}) exceeded",
                                                        4 * limits_.max_nesting_depth));
  }
  Result<Value> result = eval_inner(expr);
  if (!result.is_ok()) return located(expr.pos, result.status());
  // Operators, filters, calls and slices make new strings (names, attributes and items share
  // theirs): their bytes count, so a loop that rebuilds a long string stops.
  const bool builds = expr.kind == Expr::Kind::kBinary || expr.kind == Expr::Kind::kFilter ||
                      expr.kind == Expr::Kind::kCall || expr.kind == Expr::Kind::kSlice;
  if (builds && result->is_string()) {
    KVP_RETURN_IF_ERROR(located(expr.pos, count_built_bytes(result->as_string().size())));
  }
  return result;
}

Result<Value> Evaluator::eval_filter(const Expr& expr, const Value* block_input) {
  Value input;
  if (expr.a && block_input != nullptr && expr.a->kind == Expr::Kind::kFilter) {
    KVP_ASSIGN_OR_RETURN(input, eval_filter(*expr.a, block_input));  // a filter block's chain
  } else if (expr.a) {
    KVP_ASSIGN_OR_RETURN(input, eval(*expr.a));
  } else if (block_input != nullptr) {
    input = *block_input;
  }
  KVP_ASSIGN_OR_RETURN(CallArgs args, eval_args(expr));
  Result<Value> result = apply_filter(expr.name, input, args);
  if (!result.is_ok()) return located(expr.pos, result.status());
  return result;
}

Result<Value> Evaluator::eval_inner(const Expr& expr) {
  switch (expr.kind) {
    case Expr::Kind::kLiteral:
      return expr.literal;
    case Expr::Kind::kName:
      return lookup(expr.name);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      std::vector<Value> items;
      items.reserve(expr.items.size());
      for (const ExprPtr& item : expr.items) {
        KVP_ASSIGN_OR_RETURN(Value v, eval(*item));
        items.push_back(std::move(v));
      }
      return Value::list(std::move(items), expr.kind == Expr::Kind::kTuple);
    }
    case Expr::Kind::kDict: {
      Value d = Value::dict();
      for (size_t i = 0; i + 1 < expr.items.size(); i += 2) {
        KVP_ASSIGN_OR_RETURN(Value key, eval(*expr.items[i]));
        KVP_ASSIGN_OR_RETURN(Value value, eval(*expr.items[i + 1]));
        KVP_RETURN_IF_ERROR(d.dict_data().set(key, std::move(value)));
      }
      return d;
    }
    case Expr::Kind::kAttribute: {
      KVP_ASSIGN_OR_RETURN(Value object, eval(*expr.a));
      if (object.is_undefined()) return undefined_error(object);
      return get_attribute(object, expr.name);
    }
    case Expr::Kind::kSubscript: {
      KVP_ASSIGN_OR_RETURN(Value object, eval(*expr.a));
      KVP_ASSIGN_OR_RETURN(Value key, eval(*expr.b));
      if (object.is_undefined()) return undefined_error(object);
      return get_item(object, key);
    }
    case Expr::Kind::kSlice: {
      KVP_ASSIGN_OR_RETURN(Value object, eval(*expr.a));
      if (object.is_undefined()) return undefined_error(object);
      Value parts[3];
      const Expr* exprs[3] = {expr.b.get(), expr.c.get(), expr.d.get()};
      for (int i = 0; i < 3; ++i) {
        if (exprs[i] != nullptr) {
          KVP_ASSIGN_OR_RETURN(parts[i], eval(*exprs[i]));
        }
      }
      return slice(object, exprs[0] ? &parts[0] : nullptr, exprs[1] ? &parts[1] : nullptr,
                   exprs[2] ? &parts[2] : nullptr);
    }
    case Expr::Kind::kCall: {
      KVP_ASSIGN_OR_RETURN(Value callee, eval(*expr.a));
      KVP_ASSIGN_OR_RETURN(CallArgs args, eval_args(expr));
      return call(callee, args);
    }
    case Expr::Kind::kFilter:
      return eval_filter(expr, nullptr);
    case Expr::Kind::kTest: {
      KVP_ASSIGN_OR_RETURN(Value input, eval(*expr.a));
      KVP_ASSIGN_OR_RETURN(CallArgs args, eval_args(expr));
      KVP_ASSIGN_OR_RETURN(bool passed, apply_test(expr.name, input, args));
      return Value::boolean(passed != expr.negated);
    }
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: {
      KVP_ASSIGN_OR_RETURN(Value v, eval(*expr.a));
      if (v.is_undefined()) return undefined_error(v);
      if (!v.is_number()) {
        return Status::invalid_argument("bad operand type for unary {}: '{}'",
                                        expr.kind == Expr::Kind::kNeg ? "-" : "+", v.type_name());
      }
      if (expr.kind == Expr::Kind::kPos) return v.is_bool() ? Value::integer(v.as_int()) : v;
      if (v.is_float()) return Value::number(-v.as_double());
      if (v.as_int() == INT64_MIN) return Status::invalid_argument("integer overflow");
      return Value::integer(-v.as_int());
    }
    case Expr::Kind::kNot: {
      KVP_ASSIGN_OR_RETURN(Value v, eval(*expr.a));
      return Value::boolean(!v.truthy());
    }
    case Expr::Kind::kBinary:
      return eval_binary(expr);
    case Expr::Kind::kCondition: {
      KVP_ASSIGN_OR_RETURN(Value condition, eval(*expr.b));
      if (condition.truthy()) return eval(*expr.a);
      if (expr.c) return eval(*expr.c);
      return Value::undefined("the inline if-expression evaluated to false and has no else");
    }
  }
  return Value();
}

Result<Value> Evaluator::eval_binary(const Expr& expr) {
  KVP_ASSIGN_OR_RETURN(Value left, eval(*expr.a));
  if (expr.op == BinaryOp::kAnd) {
    if (!left.truthy()) return left;
    return eval(*expr.b);
  }
  if (expr.op == BinaryOp::kOr) {
    if (left.truthy()) return left;
    return eval(*expr.b);
  }
  KVP_ASSIGN_OR_RETURN(Value right, eval(*expr.b));
  return binary_op(*this, expr.op, left, right);
}

}  // namespace kvp::jinja

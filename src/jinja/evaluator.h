// Evaluator: walks a syntax tree and writes the rendered text. One Evaluator serves one render
// (it holds that render's scopes, counters and output); the tree is only read.
//
// Scopes follow jinja2: the globals and context at the root, the template's own variables above
// them, a new scope for each for loop (not each iteration), macro call, with block and block
// set; `if` opens none. Macros close over the scope they were defined in.
//
// Builtin filters, tests, methods and globals (builtins.h) call back into the evaluator to call
// values, apply other filters and tests, and respect the limits.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/status.h"
#include "jinja/ast.h"
#include "jinja/template.h"
#include "jinja/value.h"

namespace kvp::jinja {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
};

class Evaluator {
 public:
  explicit Evaluator(const Limits& limits);

  // Renders `body` with `context` (a dict) visible under the globals.
  Result<std::string> render(const Body& body, const Value& context);

  // For builtins. Calls a callable value; an error for anything else.
  Result<Value> call(const Value& callee, CallArgs& args);
  // A builtin filter / test by name (the names are checked at parse time).
  Result<Value> apply_filter(const std::string& name, const Value& input, CallArgs& args);
  Result<bool> apply_test(const std::string& name, const Value& input, CallArgs& args);
  // kResourceExhausted when a string of num_bytes would pass max_output_bytes.
  Status check_size(size_t num_bytes) const;
  // Counts loop bodies (and other per-item work) against max_loop_iterations.
  Status count_iterations(uint64_t count);
  // Counts the bytes of a string an expression built against max_built_bytes.
  Status count_built_bytes(uint64_t num_bytes);
  const Limits& limits() const { return limits_; }
  // A namespace() made during the render: emptied when the render ends, so one that holds
  // itself (or a macro that holds its own scope) is not kept alive by the cycle.
  void track_namespace(const Value& ns) { namespaces_.push_back(ns); }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Result<Flow> exec_body(const Body& body, std::string* out);
  Result<Flow> exec(const Stmt& stmt, std::string* out);
  Result<Flow> exec_for(const Stmt& stmt, std::string* out);
  Status exec_set(const Stmt& stmt);
  Status define_macro(const Stmt& stmt);
  Result<std::string> call_macro(const Stmt& macro, const std::shared_ptr<Scope>& closure,
                                 CallArgs& args);
  Status assign(const std::vector<std::string>& targets, bool unpack, const Value& value,
                SourcePos pos);
  Status emit(std::string_view text, std::string* out) const;

  Result<Value> eval(const Expr& expr);
  Result<Value> eval_inner(const Expr& expr);
  Result<Value> eval_binary(const Expr& expr);
  Result<Value> eval_filter(const Expr& expr, const Value* block_input);
  Result<CallArgs> eval_args(const Expr& expr);
  Value lookup(const std::string& name) const;

  // Adds "line L:C: " to an error that does not name a position yet.
  static Status located(SourcePos pos, const Status& status);

  Limits limits_;
  std::shared_ptr<Scope> scope_;
  // Scopes holding macros (a macro keeps its defining scope, which holds the macro) and the
  // namespaces made: emptied at the end of render() to break their reference cycles.
  std::vector<std::shared_ptr<Scope>> macro_scopes_;
  std::vector<Value> namespaces_;
  size_t depth_ = 0;       // current eval/exec recursion
  size_t call_depth_ = 0;  // current macro recursion
  uint64_t num_iterations_ = 0;
  uint64_t num_built_bytes_ = 0;
};

}  // namespace kvp::jinja

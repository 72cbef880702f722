// The syntax tree the parser builds and the evaluator walks. Nodes are immutable after parsing,
// so one tree serves many renders at once. Each node keeps the line:column where it starts.
//
// Expressions and statements are tagged structs: `kind` says which fields are used (listed per
// kind below). Children are owned through unique_ptr; the parser bounds the depth.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace kvp::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct SourcePos {
  int line = 1;
  int column = 1;
};

enum class BinaryOp {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kFloorDiv,
  kMod,
  kPow,
  kConcat,  // ~
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,
  kIn,
  kNotIn,
  kAnd,
  kOr,
};

struct Expr {
  enum class Kind {
    kLiteral,    // literal
    kName,       // name
    kList,       // items
    kTuple,      // items
    kDict,       // items: key, value, key, value, ...
    kAttribute,  // a.name
    kSubscript,  // a[b]
    kSlice,      // a[b:c:d]; absent parts are null
    kCall,       // a(items..., keywords...)
    kFilter,     // a|name(items..., keywords...); a is null inside a filter block's chain
    kTest,       // a is [not] name(items...); negated
    kNeg,        // -a
    kPos,        // +a
    kNot,        // not a
    kBinary,     // a op b
    kCondition,  // a if b else c (c may be null)
  };
  Kind kind = Kind::kLiteral;
  SourcePos pos;
  size_t height = 1;  // 1 + the tallest child's height (the parser bounds it)
  Value literal;
  std::string name;
  BinaryOp op = BinaryOp::kAdd;
  bool negated = false;
  ExprPtr a, b, c, d;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
};

// A macro parameter, or a call block's caller parameter.
struct Param {
  std::string name;
  ExprPtr default_value;  // null: none given
};

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // branches (condition, body); a null condition is the else branch
    kFor,          // targets in expr [if condition] body [else else_body]; recursive
    kSet,          // targets = expr, or target_expr (ns.attr) = expr
    kSetBlock,     // targets[0] = rendered body, through filter (may be null)
    kMacro,        // name(params) body
    kCallBlock,    // expr (the call), params (the caller's), body
    kFilterBlock,  // filter chain applied to the rendered body
    kWith,         // assignments (targets[i] = values[i]) in a new scope; body
    kBreak,
    kContinue,
  };
  Kind kind = Kind::kText;
  SourcePos pos;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  ExprPtr target_expr;
  ExprPtr filter;
  std::vector<std::string> targets;
  bool targets_tuple = false;  // `for a, b in` / `set a, b =`: unpack
  bool recursive = false;
  std::vector<ExprPtr> values;
  std::string name;
  std::vector<Param> params;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
};

}  // namespace kvp::jinja

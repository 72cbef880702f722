#include "jinja/parser.h"

#include <algorithm>
#include <charconv>
#include <initializer_list>
#include <string_view>

namespace kvp::jinja {

namespace {

using TK = Token::Kind;

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, size_t max_depth)
      : tokens_(tokens), max_depth_(max_depth) {}

  Result<Body> parse_template() {
    std::string end;
    KVP_ASSIGN_OR_RETURN(Body body, parse_body({}, &end));
    return body;
  }

 private:
  // Counts one level of recursion for as long as it lives.
  class DepthGuard {
   public:
    explicit DepthGuard(size_t* depth) : depth_(depth) { ++*depth_; }
    ~DepthGuard() { --*depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;

   private:
    size_t* depth_;
  };

  const Token& cur() const { return tokens_[pos_]; }
  const Token& peek(size_t ahead = 1) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  void advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool is_op(std::string_view op) const { return cur().kind == TK::kOperator && cur().text == op; }
  bool is_name(std::string_view name) const {
    return cur().kind == TK::kName && cur().text == name;
  }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    advance();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.kind) {
      case TK::kText:
        return "template text";
      case TK::kVariableBegin:
        return "'{{'";
      case TK::kVariableEnd:
        return "'}}'";
      case TK::kBlockBegin:
        return "'{%'";
      case TK::kBlockEnd:
        return "'%}'";
      case TK::kString:
        return "string literal";
      case TK::kEnd:
        return "end of template";
      default:
        return "'" + t.text + "'";
    }
  }

  Status error_at(const Token& t, const std::string& what) const {
    return Status::invalid_argument("line {}:{}: {}", t.line, t.column, what);
  }
  Status unexpected(const std::string& expected) const {
    return error_at(cur(), "unexpected " + describe(cur()) + ", expected " + expected);
  }
  Status check_depth() const {
    if (depth_ <= max_depth_) return Status::ok();
    return Status::resource_exhausted("line {}:{}: nesting depth limit ({}) exceeded", cur().line,
                                      cur().column, max_depth_);
  }

  Status expect_op(std::string_view op) {
    if (skip_op(op)) return Status::ok();
    return unexpected(fmt::format("'{}'", op));
  }
  Status expect_block_end() {
    if (cur().kind == TK::kBlockEnd) {
      advance();
      return Status::ok();
    }
    return unexpected("end of block tag '%}'");
  }
  Result<std::string> expect_name() {
    if (cur().kind != TK::kName) return unexpected("a name");
    std::string name = cur().text;
    advance();
    return name;
  }

  ExprPtr node(Expr::Kind kind, const Token& at) const {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = {at.line, at.column};
    return e;
  }
  // Sets e's height from its children; fails when it passes the nesting limit.
  Status seal(Expr& e) const {
    size_t tallest = 0;
    for (const ExprPtr* child : {&e.a, &e.b, &e.c, &e.d}) {
      if (*child) tallest = std::max(tallest, (*child)->height);
    }
    for (const auto& item : e.items) tallest = std::max(tallest, item->height);
    for (const auto& [name, item] : e.keywords) tallest = std::max(tallest, item->height);
    e.height = tallest + 1;
    if (e.height <= max_depth_) return Status::ok();
    return Status::resource_exhausted("line {}:{}: expression nesting depth limit ({}) exceeded",
                                      e.pos.line, e.pos.column, max_depth_);
  }
  Result<ExprPtr> binary(BinaryOp op, ExprPtr left, ExprPtr right, const Token& at) const {
    ExprPtr e = node(Expr::Kind::kBinary, at);
    e->op = op;
    e->a = std::move(left);
    e->b = std::move(right);
    KVP_RETURN_IF_ERROR(seal(*e));
    return e;
  }

  // ---- statements ----

  // Statements up to a `{% name %}` with name in `ends` (left at that name; *end says which),
  // or the end of the template when `ends` is empty.
  Result<Body> parse_body(std::initializer_list<std::string_view> ends, std::string* end) {
    DepthGuard guard(&depth_);
    KVP_RETURN_IF_ERROR(check_depth());
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.kind == TK::kEnd) {
        if (ends.size() == 0) return body;
        std::string names;
        for (std::string_view e : ends)
          names += (names.empty() ? "'" : " or '") + std::string(e) + "'";
        return error_at(t, "unexpected end of template, expected " + names);
      }
      if (t.kind == TK::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->pos = {t.line, t.column};
        s->text = t.text;
        body.push_back(std::move(s));
        advance();
        continue;
      }
      if (t.kind == TK::kVariableBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->pos = {t.line, t.column};
        advance();
        KVP_ASSIGN_OR_RETURN(s->expr, parse_tuple(true, {}, false));
        if (cur().kind != TK::kVariableEnd) return unexpected("end of print statement '}}'");
        advance();
        body.push_back(std::move(s));
        continue;
      }
      if (t.kind != TK::kBlockBegin) return unexpected("template text or a tag");
      advance();
      if (cur().kind != TK::kName) return unexpected("a statement name");
      if (std::find(ends.begin(), ends.end(), cur().text) != ends.end()) {
        *end = cur().text;
        return body;
      }
      KVP_ASSIGN_OR_RETURN(StmtPtr s, parse_statement());
      body.push_back(std::move(s));
    }
  }

  // Consumes `{% <name> %}` where the parser stands at <name>.
  Status finish_end_tag() {
    advance();
    return expect_block_end();
  }

  Result<StmtPtr> parse_statement() {
    const Token& t = cur();
    auto s = std::make_unique<Stmt>();
    s->pos = {t.line, t.column};
    const std::string keyword = t.text;
    advance();
    if (keyword == "if") return parse_if(std::move(s));
    if (keyword == "for") return parse_for(std::move(s));
    if (keyword == "set") return parse_set(std::move(s));
    if (keyword == "macro") return parse_macro(std::move(s));
    if (keyword == "call") return parse_call_block(std::move(s));
    if (keyword == "filter") return parse_filter_block(std::move(s));
    if (keyword == "with") return parse_with(std::move(s));
    if (keyword == "generation") {
      // transformers' {% generation %} marks assistant text; it renders its body unchanged.
      s->kind = Stmt::Kind::kWith;
      KVP_RETURN_IF_ERROR(expect_block_end());
      std::string end;
      KVP_ASSIGN_OR_RETURN(s->body, parse_body({"endgeneration"}, &end));
      KVP_RETURN_IF_ERROR(finish_end_tag());
      return s;
    }
    if (keyword == "break" || keyword == "continue") {
      s->kind = keyword == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      KVP_RETURN_IF_ERROR(expect_block_end());
      return s;
    }
    if (keyword.starts_with("end") || keyword == "else" || keyword == "elif") {
      return error_at(t, "unexpected '" + keyword + "' (no open block it could close)");
    }
    return error_at(t, "unknown tag '" + keyword + "'");
  }

  Result<StmtPtr> parse_if(StmtPtr s) {
    s->kind = Stmt::Kind::kIf;
    while (true) {
      KVP_ASSIGN_OR_RETURN(ExprPtr condition, parse_tuple(false, {}, false));
      KVP_RETURN_IF_ERROR(expect_block_end());
      std::string end;
      KVP_ASSIGN_OR_RETURN(Body body, parse_body({"elif", "else", "endif"}, &end));
      s->branches.emplace_back(std::move(condition), std::move(body));
      advance();
      if (end == "elif") continue;
      if (end == "else") {
        KVP_RETURN_IF_ERROR(expect_block_end());
        KVP_ASSIGN_OR_RETURN(Body else_body, parse_body({"endif"}, &end));
        s->branches.emplace_back(nullptr, std::move(else_body));
        advance();
      }
      KVP_RETURN_IF_ERROR(expect_block_end());
      return s;
    }
  }

  // Names for `for` and `set` targets: `a`, `a, b`, `(a, b)`.
  Status parse_target_names(Stmt* s, std::string_view stop) {
    const bool parenthesized = skip_op("(");
    while (true) {
      KVP_ASSIGN_OR_RETURN(std::string name, expect_name());
      s->targets.push_back(std::move(name));
      if (!skip_op(",")) break;
      s->targets_tuple = true;
      if (is_name(stop) || is_op(")") || is_op("=") || cur().kind == TK::kBlockEnd) break;
    }
    if (parenthesized) {
      s->targets_tuple = true;
      KVP_RETURN_IF_ERROR(expect_op(")"));
    }
    return Status::ok();
  }

  Result<StmtPtr> parse_for(StmtPtr s) {
    s->kind = Stmt::Kind::kFor;
    KVP_RETURN_IF_ERROR(parse_target_names(s.get(), "in"));
    if (!skip_name("in")) return unexpected("'in'");
    KVP_ASSIGN_OR_RETURN(s->expr, parse_tuple(false, {"recursive"}, false));
    if (skip_name("if")) {
      KVP_ASSIGN_OR_RETURN(s->condition, parse_expression(true));
    }
    s->recursive = skip_name("recursive");
    KVP_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    KVP_ASSIGN_OR_RETURN(s->body, parse_body({"endfor", "else"}, &end));
    advance();
    if (end == "else") {
      KVP_RETURN_IF_ERROR(expect_block_end());
      KVP_ASSIGN_OR_RETURN(s->else_body, parse_body({"endfor"}, &end));
      advance();
    }
    KVP_RETURN_IF_ERROR(expect_block_end());
    return s;
  }

  Result<StmtPtr> parse_set(StmtPtr s) {
    if (cur().kind == TK::kName && peek().kind == TK::kOperator && peek().text == ".") {
      const Token& at = cur();
      ExprPtr target = node(Expr::Kind::kAttribute, at);
      target->a = node(Expr::Kind::kName, at);
      target->a->name = at.text;
      advance();
      advance();
      KVP_ASSIGN_OR_RETURN(target->name, expect_name());
      s->target_expr = std::move(target);
    } else {
      KVP_RETURN_IF_ERROR(parse_target_names(s.get(), ""));
    }
    if (skip_op("=")) {
      s->kind = Stmt::Kind::kSet;
      KVP_ASSIGN_OR_RETURN(s->expr, parse_tuple(true, {}, false));
      KVP_RETURN_IF_ERROR(expect_block_end());
      return s;
    }
    if (s->target_expr || s->targets_tuple) return unexpected("'='");
    s->kind = Stmt::Kind::kSetBlock;
    if (is_op("|")) {
      KVP_ASSIGN_OR_RETURN(s->filter, parse_filter_chain(nullptr));
    }
    KVP_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    KVP_ASSIGN_OR_RETURN(s->body, parse_body({"endset"}, &end));
    KVP_RETURN_IF_ERROR(finish_end_tag());
    return s;
  }

  Status parse_params(std::vector<Param>* params) {
    KVP_RETURN_IF_ERROR(expect_op("("));
    while (!is_op(")")) {
      if (!params->empty()) KVP_RETURN_IF_ERROR(expect_op(","));
      if (is_op(")")) break;
      Param p;
      KVP_ASSIGN_OR_RETURN(p.name, expect_name());
      if (skip_op("=")) {
        KVP_ASSIGN_OR_RETURN(p.default_value, parse_expression(true));
      }
      params->push_back(std::move(p));
    }
    advance();
    return Status::ok();
  }

  Result<StmtPtr> parse_macro(StmtPtr s) {
    s->kind = Stmt::Kind::kMacro;
    KVP_ASSIGN_OR_RETURN(s->name, expect_name());
    KVP_RETURN_IF_ERROR(parse_params(&s->params));
    KVP_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    KVP_ASSIGN_OR_RETURN(s->body, parse_body({"endmacro"}, &end));
    KVP_RETURN_IF_ERROR(finish_end_tag());
    return s;
  }

  Result<StmtPtr> parse_call_block(StmtPtr s) {
    s->kind = Stmt::Kind::kCallBlock;
    if (is_op("(")) KVP_RETURN_IF_ERROR(parse_params(&s->params));
    const Token& at = cur();
    KVP_ASSIGN_OR_RETURN(s->expr, parse_expression(true));
    if (s->expr->kind != Expr::Kind::kCall) return error_at(at, "expected a call after 'call'");
    KVP_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    KVP_ASSIGN_OR_RETURN(s->body, parse_body({"endcall"}, &end));
    KVP_RETURN_IF_ERROR(finish_end_tag());
    return s;
  }

  Result<StmtPtr> parse_filter_block(StmtPtr s) {
    s->kind = Stmt::Kind::kFilterBlock;
    KVP_ASSIGN_OR_RETURN(s->filter, parse_filter_chain(nullptr, /*start_inline=*/true));
    KVP_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    KVP_ASSIGN_OR_RETURN(s->body, parse_body({"endfilter"}, &end));
    KVP_RETURN_IF_ERROR(finish_end_tag());
    return s;
  }

  Result<StmtPtr> parse_with(StmtPtr s) {
    s->kind = Stmt::Kind::kWith;
    while (cur().kind != TK::kBlockEnd) {
      if (!s->targets.empty()) KVP_RETURN_IF_ERROR(expect_op(","));
      KVP_ASSIGN_OR_RETURN(std::string name, expect_name());
      s->targets.push_back(std::move(name));
      KVP_RETURN_IF_ERROR(expect_op("="));
      KVP_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
      s->values.push_back(std::move(value));
    }
    advance();
    std::string end;
    KVP_ASSIGN_OR_RETURN(s->body, parse_body({"endwith"}, &end));
    KVP_RETURN_IF_ERROR(finish_end_tag());
    return s;
  }

  // ---- expressions ----

  bool at_tuple_end(std::initializer_list<std::string_view> extra_ends) const {
    if (cur().kind == TK::kVariableEnd || cur().kind == TK::kBlockEnd || is_op(")")) return true;
    return cur().kind == TK::kName &&
           std::find(extra_ends.begin(), extra_ends.end(), cur().text) != extra_ends.end();
  }

  Result<ExprPtr> parse_tuple(bool with_condexpr,
                              std::initializer_list<std::string_view> extra_ends,
                              bool explicit_parentheses) {
    const Token& at = cur();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) KVP_RETURN_IF_ERROR(expect_op(","));
      if (at_tuple_end(extra_ends)) break;
      KVP_ASSIGN_OR_RETURN(ExprPtr item, parse_expression(with_condexpr));
      items.push_back(std::move(item));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) return unexpected("an expression");
    }
    ExprPtr e = node(Expr::Kind::kTuple, at);
    e->items = std::move(items);
    KVP_RETURN_IF_ERROR(seal(*e));
    return e;
  }

  Result<ExprPtr> parse_expression(bool with_condexpr) {
    DepthGuard guard(&depth_);
    KVP_RETURN_IF_ERROR(check_depth());
    KVP_ASSIGN_OR_RETURN(ExprPtr e, parse_or());
    if (!with_condexpr) return e;
    while (is_name("if")) {
      const Token& at = cur();
      advance();
      ExprPtr cond = node(Expr::Kind::kCondition, at);
      cond->a = std::move(e);
      KVP_ASSIGN_OR_RETURN(cond->b, parse_or());
      if (skip_name("else")) {
        KVP_ASSIGN_OR_RETURN(cond->c, parse_expression(true));
      }
      KVP_RETURN_IF_ERROR(seal(*cond));
      e = std::move(cond);
    }
    return e;
  }

  Result<ExprPtr> parse_or() {
    KVP_ASSIGN_OR_RETURN(ExprPtr left, parse_and());
    while (is_name("or")) {
      const Token& at = cur();
      advance();
      KVP_ASSIGN_OR_RETURN(ExprPtr right, parse_and());
      KVP_ASSIGN_OR_RETURN(left, binary(BinaryOp::kOr, std::move(left), std::move(right), at));
    }
    return left;
  }

  Result<ExprPtr> parse_and() {
    KVP_ASSIGN_OR_RETURN(ExprPtr left, parse_not());
    while (is_name("and")) {
      const Token& at = cur();
      advance();
      KVP_ASSIGN_OR_RETURN(ExprPtr right, parse_not());
      KVP_ASSIGN_OR_RETURN(left, binary(BinaryOp::kAnd, std::move(left), std::move(right), at));
    }
    return left;
  }

  Result<ExprPtr> parse_not() {
    if (!is_name("not")) return parse_compare();
    DepthGuard guard(&depth_);
    KVP_RETURN_IF_ERROR(check_depth());
    ExprPtr e = node(Expr::Kind::kNot, cur());
    advance();
    KVP_ASSIGN_OR_RETURN(e->a, parse_not());
    KVP_RETURN_IF_ERROR(seal(*e));
    return e;
  }

  Result<ExprPtr> parse_compare() {
    KVP_ASSIGN_OR_RETURN(ExprPtr left, parse_math1());
    while (true) {
      const Token& at = cur();
      BinaryOp op;
      if (is_op("==")) {
        op = BinaryOp::kEq;
      } else if (is_op("!=")) {
        op = BinaryOp::kNe;
      } else if (is_op("<")) {
        op = BinaryOp::kLt;
      } else if (is_op("<=")) {
        op = BinaryOp::kLe;
      } else if (is_op(">")) {
        op = BinaryOp::kGt;
      } else if (is_op(">=")) {
        op = BinaryOp::kGe;
      } else if (is_name("in")) {
        op = BinaryOp::kIn;
      } else if (is_name("not") && peek().kind == TK::kName && peek().text == "in") {
        op = BinaryOp::kNotIn;
        advance();
      } else {
        return left;
      }
      advance();
      KVP_ASSIGN_OR_RETURN(ExprPtr right, parse_math1());
      KVP_ASSIGN_OR_RETURN(left, binary(op, std::move(left), std::move(right), at));
    }
  }

  Result<ExprPtr> parse_math1() {
    KVP_ASSIGN_OR_RETURN(ExprPtr left, parse_concat());
    while (is_op("+") || is_op("-")) {
      const Token& at = cur();
      const BinaryOp op = at.text == "+" ? BinaryOp::kAdd : BinaryOp::kSub;
      advance();
      KVP_ASSIGN_OR_RETURN(ExprPtr right, parse_concat());
      KVP_ASSIGN_OR_RETURN(left, binary(op, std::move(left), std::move(right), at));
    }
    return left;
  }

  Result<ExprPtr> parse_concat() {
    KVP_ASSIGN_OR_RETURN(ExprPtr left, parse_math2());
    while (is_op("~")) {
      const Token& at = cur();
      advance();
      KVP_ASSIGN_OR_RETURN(ExprPtr right, parse_math2());
      KVP_ASSIGN_OR_RETURN(left, binary(BinaryOp::kConcat, std::move(left), std::move(right), at));
    }
    return left;
  }

  Result<ExprPtr> parse_math2() {
    KVP_ASSIGN_OR_RETURN(ExprPtr left, parse_pow());
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& at = cur();
      const BinaryOp op = at.text == "*"    ? BinaryOp::kMul
                          : at.text == "/"  ? BinaryOp::kDiv
                          : at.text == "//" ? BinaryOp::kFloorDiv
                                            : BinaryOp::kMod;
      advance();
      KVP_ASSIGN_OR_RETURN(ExprPtr right, parse_pow());
      KVP_ASSIGN_OR_RETURN(left, binary(op, std::move(left), std::move(right), at));
    }
    return left;
  }

  Result<ExprPtr> parse_pow() {
    KVP_ASSIGN_OR_RETURN(ExprPtr left, parse_unary(true));
    while (is_op("**")) {
      const Token& at = cur();
      advance();
      KVP_ASSIGN_OR_RETURN(ExprPtr right, parse_unary(true));
      KVP_ASSIGN_OR_RETURN(left, binary(BinaryOp::kPow, std::move(left), std::move(right), at));
    }
    return left;
  }

  Result<ExprPtr> parse_unary(bool with_filter) {
    DepthGuard guard(&depth_);
    KVP_RETURN_IF_ERROR(check_depth());
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = node(is_op("-") ? Expr::Kind::kNeg : Expr::Kind::kPos, cur());
      advance();
      KVP_ASSIGN_OR_RETURN(e->a, parse_unary(false));
      KVP_RETURN_IF_ERROR(seal(*e));
    } else {
      KVP_ASSIGN_OR_RETURN(e, parse_primary());
    }
    KVP_ASSIGN_OR_RETURN(e, parse_postfix(std::move(e)));
    if (with_filter) {
      KVP_ASSIGN_OR_RETURN(e, parse_filter_expr(std::move(e)));
    }
    return e;
  }

  Result<ExprPtr> parse_primary() {
    DepthGuard guard(&depth_);
    KVP_RETURN_IF_ERROR(check_depth());
    const Token& t = cur();
    switch (t.kind) {
      case TK::kName: {
        ExprPtr e = node(Expr::Kind::kLiteral, t);
        if (t.text == "true" || t.text == "True") {
          e->literal = Value::boolean(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value::boolean(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::none();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.text;
        }
        advance();
        return e;
      }
      case TK::kString: {
        ExprPtr e = node(Expr::Kind::kLiteral, t);
        std::string text;
        while (cur().kind == TK::kString) {
          text += cur().text;
          advance();
        }
        e->literal = Value::string(std::move(text));
        return e;
      }
      case TK::kInteger: {
        ExprPtr e = node(Expr::Kind::kLiteral, t);
        int64_t value = 0;
        const auto result = std::from_chars(t.text.data(), t.text.data() + t.text.size(), value);
        if (result.ec != std::errc()) {
          return error_at(t, "integer literal " + t.text + " does not fit in 64 bits");
        }
        e->literal = Value::integer(value);
        advance();
        return e;
      }
      case TK::kFloat: {
        ExprPtr e = node(Expr::Kind::kLiteral, t);
        e->literal = Value::number(std::strtod(t.text.c_str(), nullptr));
        advance();
        return e;
      }
      case TK::kOperator:
        if (t.text == "(") {
          advance();
          KVP_ASSIGN_OR_RETURN(ExprPtr e, parse_tuple(true, {}, true));
          KVP_RETURN_IF_ERROR(expect_op(")"));
          return e;
        }
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        break;
      default:
        break;
    }
    return unexpected("an expression");
  }

  Result<ExprPtr> parse_list() {
    ExprPtr e = node(Expr::Kind::kList, cur());
    advance();
    while (!is_op("]")) {
      if (!e->items.empty()) KVP_RETURN_IF_ERROR(expect_op(","));
      if (is_op("]")) break;
      KVP_ASSIGN_OR_RETURN(ExprPtr item, parse_expression(true));
      e->items.push_back(std::move(item));
    }
    advance();
    KVP_RETURN_IF_ERROR(seal(*e));
    return e;
  }

  Result<ExprPtr> parse_dict() {
    ExprPtr e = node(Expr::Kind::kDict, cur());
    advance();
    while (!is_op("}")) {
      if (!e->items.empty()) KVP_RETURN_IF_ERROR(expect_op(","));
      if (is_op("}")) break;
      KVP_ASSIGN_OR_RETURN(ExprPtr key, parse_expression(true));
      KVP_RETURN_IF_ERROR(expect_op(":"));
      KVP_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
      e->items.push_back(std::move(key));
      e->items.push_back(std::move(value));
    }
    advance();
    KVP_RETURN_IF_ERROR(seal(*e));
    return e;
  }

  Result<ExprPtr> parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        KVP_ASSIGN_OR_RETURN(e, parse_subscript(std::move(e)));
      } else if (is_op("(")) {
        KVP_ASSIGN_OR_RETURN(e, parse_call(std::move(e)));
      } else {
        return e;
      }
    }
  }

  Result<ExprPtr> parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        KVP_ASSIGN_OR_RETURN(e, parse_filter_chain(std::move(e)));
      } else if (is_name("is")) {
        KVP_ASSIGN_OR_RETURN(e, parse_test(std::move(e)));
      } else if (is_op("(")) {
        KVP_ASSIGN_OR_RETURN(e, parse_call(std::move(e)));
      } else {
        return e;
      }
    }
  }

  Result<ExprPtr> parse_subscript(ExprPtr target) {
    const Token& at = cur();
    if (skip_op(".")) {
      if (cur().kind == TK::kName) {
        ExprPtr e = node(Expr::Kind::kAttribute, at);
        e->a = std::move(target);
        e->name = cur().text;
        advance();
        KVP_RETURN_IF_ERROR(seal(*e));
        return e;
      }
      if (cur().kind == TK::kInteger) {
        ExprPtr e = node(Expr::Kind::kSubscript, at);
        e->a = std::move(target);
        KVP_ASSIGN_OR_RETURN(e->b, parse_primary());
        KVP_RETURN_IF_ERROR(seal(*e));
        return e;
      }
      return unexpected("an attribute name after '.'");
    }
    advance();  // [
    std::vector<ExprPtr> indexes;
    while (!is_op("]")) {
      if (!indexes.empty()) KVP_RETURN_IF_ERROR(expect_op(","));
      KVP_ASSIGN_OR_RETURN(ExprPtr index, parse_subscribed());
      indexes.push_back(std::move(index));
    }
    advance();
    if (indexes.empty()) return error_at(at, "empty subscript '[]'");
    ExprPtr e;
    if (indexes.size() == 1 && indexes[0]->kind == Expr::Kind::kSlice && !indexes[0]->a) {
      e = std::move(indexes[0]);
      e->a = std::move(target);
    } else {
      e = node(Expr::Kind::kSubscript, at);
      e->a = std::move(target);
      if (indexes.size() == 1) {
        e->b = std::move(indexes[0]);
      } else {
        // a slice is a subscript of its own (it gets the target); jinja2 would make a tuple
        // holding a slice object, which no list, dict or string takes as an index
        for (const ExprPtr& index : indexes) {
          if (index->kind == Expr::Kind::kSlice) {
            return error_at(at, "a slice cannot be part of a tuple subscript");
          }
        }
        e->b = node(Expr::Kind::kTuple, at);
        e->b->items = std::move(indexes);
        KVP_RETURN_IF_ERROR(seal(*e->b));
      }
    }
    KVP_RETURN_IF_ERROR(seal(*e));
    return e;
  }

  // One subscript: an expression, or a slice [b]:[c][:[d]] (a kSlice without its target).
  Result<ExprPtr> parse_subscribed() {
    const Token& at = cur();
    ExprPtr start;
    if (!is_op(":")) {
      KVP_ASSIGN_OR_RETURN(start, parse_expression(true));
      if (!is_op(":")) return start;
    }
    advance();
    ExprPtr slice = node(Expr::Kind::kSlice, at);
    slice->b = std::move(start);
    if (!is_op("]") && !is_op(",") && !is_op(":")) {
      KVP_ASSIGN_OR_RETURN(slice->c, parse_expression(true));
    }
    if (skip_op(":") && !is_op("]") && !is_op(",")) {
      KVP_ASSIGN_OR_RETURN(slice->d, parse_expression(true));
    }
    KVP_RETURN_IF_ERROR(seal(*slice));
    return slice;
  }

  // `(args)` into e->items and e->keywords.
  Status parse_call_args(Expr* e) {
    KVP_RETURN_IF_ERROR(expect_op("("));
    while (!is_op(")")) {
      if (!e->items.empty() || !e->keywords.empty()) KVP_RETURN_IF_ERROR(expect_op(","));
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) return error_at(cur(), "*args and **kwargs are not supported");
      if (cur().kind == TK::kName && peek().kind == TK::kOperator && peek().text == "=") {
        std::string name = cur().text;
        advance();
        advance();
        KVP_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
        e->keywords.emplace_back(std::move(name), std::move(value));
        continue;
      }
      if (!e->keywords.empty()) {
        return error_at(cur(), "positional argument after keyword argument");
      }
      KVP_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
      e->items.push_back(std::move(value));
    }
    advance();
    return Status::ok();
  }

  Result<ExprPtr> parse_call(ExprPtr target) {
    ExprPtr e = node(Expr::Kind::kCall, cur());
    e->pos = target->pos;  // errors point at the callee, not at '('
    e->a = std::move(target);
    KVP_RETURN_IF_ERROR(parse_call_args(e.get()));
    KVP_RETURN_IF_ERROR(seal(*e));
    return e;
  }

  Result<std::string> parse_dotted_name() {
    KVP_ASSIGN_OR_RETURN(std::string name, expect_name());
    while (is_op(".") && peek().kind == TK::kName) {
      advance();
      name += "." + cur().text;
      advance();
    }
    return name;
  }

  // `|f(args)|g...` applied to `input` (null inside filter blocks); the parser stands at `|`
  // unless start_inline.
  Result<ExprPtr> parse_filter_chain(ExprPtr input, bool start_inline = false) {
    ExprPtr e = std::move(input);
    bool first = true;
    while (is_op("|") || (first && start_inline)) {
      if (!(first && start_inline)) advance();
      first = false;
      ExprPtr f = node(Expr::Kind::kFilter, cur());
      KVP_ASSIGN_OR_RETURN(f->name, parse_dotted_name());
      if (is_op("(")) KVP_RETURN_IF_ERROR(parse_call_args(f.get()));
      f->a = std::move(e);
      KVP_RETURN_IF_ERROR(seal(*f));
      e = std::move(f);
    }
    return e;
  }

  Result<ExprPtr> parse_test(ExprPtr target) {
    ExprPtr e = node(Expr::Kind::kTest, cur());
    advance();  // is
    e->negated = skip_name("not");
    KVP_ASSIGN_OR_RETURN(e->name, parse_dotted_name());
    e->a = std::move(target);
    if (is_op("(")) {
      KVP_RETURN_IF_ERROR(parse_call_args(e.get()));
    } else if ((cur().kind == TK::kName || cur().kind == TK::kString ||
                cur().kind == TK::kInteger || cur().kind == TK::kFloat || is_op("(") ||
                is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) return error_at(cur(), "you cannot chain multiple tests with 'is'");
      KVP_ASSIGN_OR_RETURN(ExprPtr arg, parse_primary());
      KVP_ASSIGN_OR_RETURN(arg, parse_postfix(std::move(arg)));
      e->items.push_back(std::move(arg));
    }
    KVP_RETURN_IF_ERROR(seal(*e));
    return e;
  }

  const std::vector<Token>& tokens_;
  size_t max_depth_;
  size_t pos_ = 0;
  size_t depth_ = 0;  // current recursion depth of parse_body / parse_expression / ...
};

}  // namespace

Result<Body> parse(const std::vector<Token>& tokens, size_t max_nesting_depth) {
  return Parser(tokens, max_nesting_depth).parse_template();
}

}  // namespace kvp::jinja

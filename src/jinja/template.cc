#include "jinja/template.h"

#include "jinja/builtins.h"
#include "jinja/evaluator.h"
#include "jinja/lexer.h"
#include "jinja/parser.h"

namespace kvp::jinja {

namespace {

// jinja2 rejects unknown filters and tests when it compiles the template, except directly
// inside an `if` (its tests and bodies) or an inline `a if c else b`, where the error waits until
// the filter runs (a "soft" frame; loops, macros and blocks inside start hard again).
Status check_names(const Expr& e, bool soft) {
  if (!soft && e.kind == Expr::Kind::kFilter && !is_filter(e.name)) {
    return Status::invalid_argument("line {}:{}: no filter named '{}'", e.pos.line, e.pos.column,
                                    e.name);
  }
  if (!soft && e.kind == Expr::Kind::kTest && !is_test(e.name)) {
    return Status::invalid_argument("line {}:{}: no test named '{}'", e.pos.line, e.pos.column,
                                    e.name);
  }
  soft = soft || e.kind == Expr::Kind::kCondition;
  for (const ExprPtr* child : {&e.a, &e.b, &e.c, &e.d}) {
    if (*child) KVP_RETURN_IF_ERROR(check_names(**child, soft));
  }
  for (const ExprPtr& item : e.items) KVP_RETURN_IF_ERROR(check_names(*item, soft));
  for (const auto& [name, item] : e.keywords) KVP_RETURN_IF_ERROR(check_names(*item, soft));
  return Status::ok();
}

Status check_names(const Body& body, bool soft) {
  for (const StmtPtr& s : body) {
    for (const ExprPtr* e : {&s->expr, &s->condition, &s->target_expr, &s->filter}) {
      if (*e) KVP_RETURN_IF_ERROR(check_names(**e, soft));
    }
    for (const ExprPtr& v : s->values) KVP_RETURN_IF_ERROR(check_names(*v, soft));
    for (const Param& p : s->params) {
      if (p.default_value) KVP_RETURN_IF_ERROR(check_names(*p.default_value, false));
    }
    for (const auto& [condition, branch] : s->branches) {
      if (condition) KVP_RETURN_IF_ERROR(check_names(*condition, true));
      KVP_RETURN_IF_ERROR(check_names(branch, true));
    }
    KVP_RETURN_IF_ERROR(check_names(s->body, false));
    KVP_RETURN_IF_ERROR(check_names(s->else_body, false));
  }
  return Status::ok();
}

}  // namespace

Result<Template> Template::parse(const std::string& source, const TemplateOptions& options) {
  LexerOptions lexer_options;
  lexer_options.trim_blocks = options.trim_blocks;
  lexer_options.lstrip_blocks = options.lstrip_blocks;
  lexer_options.keep_trailing_newline = options.keep_trailing_newline;
  KVP_ASSIGN_OR_RETURN(std::vector<Token> tokens, tokenize(source, lexer_options));
  KVP_ASSIGN_OR_RETURN(Body body, jinja::parse(tokens, options.limits.max_nesting_depth));
  KVP_RETURN_IF_ERROR(check_names(body, false));
  Template t;
  t.body_ = std::make_shared<const Body>(std::move(body));
  t.options_ = options;
  return t;
}

Result<std::string> Template::render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) {
    return Status::invalid_argument("template context must be a JSON object, not {}",
                                    context.type_name());
  }
  KVP_ASSIGN_OR_RETURN(Value variables, Value::from_json(context));
  Evaluator evaluator(options_.limits);
  return evaluator.render(*body_, variables);
}

}  // namespace kvp::jinja

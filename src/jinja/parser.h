// Parser: the lexer's tokens to a syntax tree (ast.h), by recursive descent with jinja2's
// grammar and operator precedence (lowest first):
//   a if c else b  <  or  <  and  <  not  <  comparisons, in, not in  <  + -  <  ~
//   <  * / // %  <  **  <  unary - +  <  postfix (.x [i] [a:b:c] (args))  with  |filter, is test
// Nesting (blocks, brackets, expression height) is bounded, so no input can exhaust the stack
// here, in the evaluator or when the tree is destroyed.
#pragma once

#include <vector>

#include "common/status.h"
#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace kvp::jinja {

// Errors (kInvalidArgument) name line:column and what was expected: an unknown tag, a missing
// end tag, an unexpected token; kResourceExhausted when nesting passes max_nesting_depth.
Result<Body> parse(const std::vector<Token>& tokens, size_t max_nesting_depth);

}  // namespace kvp::jinja

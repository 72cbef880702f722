// Lexer: template source to tokens, as jinja2's lexer splits it.
//
// Text between tags becomes kText tokens with whitespace control already applied: `{%-`/`-%}`
// strip all whitespace on that side, trim_blocks drops the newline right after a block or
// comment tag, lstrip_blocks drops the spaces and tabs before a block or comment tag that starts
// its line, `{%+`/`+%}` turn those off for one tag. Comments vanish; `{% raw %}` bodies become
// text. Inside `{{ }}` and `{% %}` the lexer yields names, literals and operators; each token
// carries the line and column (1-based) where it starts, for error messages.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace kvp::jinja {

struct LexerOptions {
  bool trim_blocks = true;  // transformers' environment sets both
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;  // jinja2's default: one final newline is dropped
};

struct Token {
  enum class Kind {
    kText,
    kVariableBegin,  // {{
    kVariableEnd,    // }}
    kBlockBegin,     // {%
    kBlockEnd,       // %}
    kName,
    kString,
    kInteger,
    kFloat,
    kOperator,
    kEnd,  // end of the source
  };
  Kind kind = Kind::kEnd;
  std::string text;  // kText: the text; kString: the unescaped value; else the token as written
  int line = 1;
  int column = 1;
};

// Errors (kInvalidArgument) name line:column: an unclosed tag, comment or string, an
// unexpected character, mismatched brackets.
Result<std::vector<Token>> tokenize(const std::string& source, const LexerOptions& options);

}  // namespace kvp::jinja

#include "jinja/lexer.h"

#include <algorithm>
#include <cctype>

#include "jinja/text.h"

namespace kvp::jinja {

namespace {

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

// Python's unicode-escape decoding of a string literal's body.
std::string unescape(std::string_view body) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out.push_back(body[i]);
      continue;
    }
    const char c = body[++i];
    auto hex_escape = [&](size_t num_digits) {
      if (i + num_digits >= body.size()) return false;
      uint32_t cp = 0;
      for (size_t k = 1; k <= num_digits; ++k) {
        const char h = body[i + k];
        if (!std::isxdigit(static_cast<unsigned char>(h))) return false;
        cp = cp * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
      }
      append_utf8(cp, &out);
      i += num_digits;
      return true;
    };
    switch (c) {
      case '\n':
        break;
      case '\\':
      case '\'':
      case '"':
        out.push_back(c);
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
        if (!hex_escape(2)) out += "\\x";
        break;
      case 'u':
        if (!hex_escape(4)) out += "\\u";
        break;
      case 'U':
        if (!hex_escape(8)) out += "\\U";
        break;
      default:
        if (c >= '0' && c <= '7') {
          uint32_t cp = 0;
          size_t num_digits = 0;
          while (num_digits < 3 && i < body.size() && body[i] >= '0' && body[i] <= '7') {
            cp = cp * 8 + static_cast<uint32_t>(body[i] - '0');
            ++i;
            ++num_digits;
          }
          --i;
          append_utf8(cp, &out);
        } else {
          out.push_back('\\');
          out.push_back(c);
        }
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string source, const LexerOptions& options)
      : src_(std::move(source)), options_(options) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  Result<std::vector<Token>> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      const size_t tag = find_tag(pos);
      std::string text = src_.substr(pos, tag == std::string::npos ? std::string::npos : tag - pos);
      if (tag == std::string::npos) {
        emit_text(std::move(text), pos);
        break;
      }
      const char kind = src_[tag + 1];
      const char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      const bool raw = kind == '%' && is_raw_begin(tag);
      if (sign == '-') {
        text.erase(text.find_last_not_of(" \t\n\r\f\v") + 1);
      } else if (sign != '+' && options_.lstrip_blocks && kind != '{') {
        lstrip_line(&text, line_starting);
      }
      emit_text(std::move(text), pos);
      if (kind == '#') {
        KVP_ASSIGN_OR_RETURN(pos, skip_comment(tag));
      } else if (raw) {
        KVP_ASSIGN_OR_RETURN(pos, lex_raw(tag));
      } else {
        KVP_ASSIGN_OR_RETURN(pos, lex_tag(tag, kind));
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    tokens_.push_back(make(Token::Kind::kEnd, "", src_.size()));
    return std::move(tokens_);
  }

 private:
  Token make(Token::Kind kind, std::string text, size_t pos) const {
    Token t;
    t.kind = kind;
    t.text = std::move(text);
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), pos);
    t.line = static_cast<int>(it - line_starts_.begin());
    t.column = static_cast<int>(pos - *(it - 1)) + 1;
    return t;
  }

  Status error(size_t pos, const std::string& what) const {
    const Token t = make(Token::Kind::kEnd, "", pos);
    return Status::invalid_argument("line {}:{}: {}", t.line, t.column, what);
  }

  void emit_text(std::string text, size_t pos) {
    if (!text.empty()) tokens_.push_back(make(Token::Kind::kText, std::move(text), pos));
  }

  size_t find_tag(size_t pos) const {
    while (true) {
      const size_t at = src_.find('{', pos);
      if (at == std::string::npos || at + 1 >= src_.size()) return std::string::npos;
      const char next = src_[at + 1];
      if (next == '{' || next == '%' || next == '#') return at;
      pos = at + 1;
    }
  }

  // lstrip_blocks: drop spaces and tabs between the line start and a block tag.
  static void lstrip_line(std::string* text, bool line_starting) {
    const size_t line_pos = text->rfind('\n') == std::string::npos ? 0 : text->rfind('\n') + 1;
    if (line_pos == 0 && !line_starting) return;
    if (line_pos == text->size()) return;
    for (size_t i = line_pos; i < text->size(); ++i) {
      if (!is_ws((*text)[i])) return;
    }
    text->erase(line_pos);
  }

  // After a tag's end marker at `pos` with sign `sign` ('-', '+' or none): the position where
  // text resumes. `-` eats all whitespace; trim_blocks eats one newline after block tags.
  size_t after_end(size_t pos, char sign, bool block) const {
    if (sign == '-') {
      while (pos < src_.size() && is_ws(src_[pos])) ++pos;
    } else if (sign != '+' && block && options_.trim_blocks && pos < src_.size() &&
               src_[pos] == '\n') {
      ++pos;
    }
    return pos;
  }

  Result<size_t> skip_comment(size_t tag) {
    const size_t end = src_.find("#}", tag + 2);
    if (end == std::string::npos) return error(tag, "unclosed comment (missing '#}')");
    const char sign = end > tag + 2 ? src_[end - 1] : '\0';
    return after_end(end + 2, sign == '-' || sign == '+' ? sign : '\0', true);
  }

  // `{%[-+]? raw [-]?%}` at `tag`.
  bool is_raw_begin(size_t tag) const {
    size_t p = tag + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    while (p < src_.size() && is_ws(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_ws(src_[p])) ++p;
    return src_.compare(p, 2, "%}") == 0 || src_.compare(p, 3, "-%}") == 0;
  }

  Result<size_t> lex_raw(size_t tag) {
    size_t p = src_.find("raw", tag) + 3;
    while (is_ws(src_[p])) ++p;
    const char begin_sign = src_[p] == '-' ? '-' : '\0';
    size_t body = begin_sign == '-' ? p + 3 : p + 2;
    if (begin_sign == '-') body = after_end(body, '-', true);
    // Find `{%[-+]? endraw [-+]?%}`.
    size_t search = body;
    while (true) {
      const size_t at = src_.find("{%", search);
      if (at == std::string::npos) return error(tag, "unclosed raw block (missing 'endraw')");
      size_t q = at + 2;
      const char sign = src_[q] == '-' || src_[q] == '+' ? src_[q++] : '\0';
      while (q < src_.size() && is_ws(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) {
        search = at + 2;
        continue;
      }
      q += 6;
      while (q < src_.size() && is_ws(src_[q])) ++q;
      char end_sign = '\0';
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) end_sign = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) return error(at, "expected '%}' after 'endraw'");
      std::string text = src_.substr(body, at - body);
      if (sign == '-') {
        text.erase(text.find_last_not_of(" \t\n\r\f\v") + 1);
      } else if (sign != '+' && options_.lstrip_blocks) {
        lstrip_line(&text, false);
      }
      emit_text(std::move(text), body);
      return after_end(q + 2, end_sign, true);
    }
  }

  Result<size_t> lex_tag(size_t tag, char kind) {
    const bool block = kind == '%';
    tokens_.push_back(make(block ? Token::Kind::kBlockBegin : Token::Kind::kVariableBegin,
                           block ? "{%" : "{{", tag));
    size_t pos = tag + 2;
    if (pos < src_.size() && (src_[pos] == '-' || src_[pos] == '+')) ++pos;
    std::vector<char> brackets;
    const char close = block ? '%' : '}';
    while (true) {
      while (pos < src_.size() && is_ws(src_[pos])) ++pos;
      if (pos >= src_.size()) {
        return error(tag, block ? "unclosed block tag (missing '%}')"
                                : "unclosed variable tag (missing '}}')");
      }
      if (brackets.empty()) {
        char sign = '\0';
        size_t end = pos;
        if ((src_[pos] == '-' || (block && src_[pos] == '+')) && pos + 1 < src_.size() &&
            src_[pos + 1] == close) {
          sign = src_[pos];
          ++end;
        }
        if (src_.compare(end, 2, std::string{close, '}'}) == 0) {
          tokens_.push_back(make(block ? Token::Kind::kBlockEnd : Token::Kind::kVariableEnd,
                                 block ? "%}" : "}}", pos));
          return after_end(end + 2, sign, block);
        }
      }
      KVP_RETURN_IF_ERROR(lex_token(&pos, &brackets));
    }
  }

  Status lex_token(size_t* pos_inout, std::vector<char>* brackets) {
    size_t pos = *pos_inout;
    const char c = src_[pos];
    if (c == '\'' || c == '"') {
      size_t p = pos + 1;
      while (p < src_.size() && src_[p] != c) p += src_[p] == '\\' ? 2 : 1;
      if (p >= src_.size()) return error(pos, "unterminated string literal");
      tokens_.push_back(make(Token::Kind::kString,
                             unescape(std::string_view(src_).substr(pos + 1, p - pos - 1)), pos));
      *pos_inout = p + 1;
      return Status::ok();
    }
    if (is_digit(c)) {
      size_t p = pos;
      auto digits = [&] {
        while (p < src_.size() && (is_digit(src_[p]) || (src_[p] == '_' && p + 1 < src_.size() &&
                                                         is_digit(src_[p + 1])))) {
          ++p;
        }
      };
      digits();
      bool is_float = false;
      const bool after_dot = pos > 0 && src_[pos - 1] == '.';
      if (!after_dot && p + 1 < src_.size() && src_[p] == '.' && is_digit(src_[p + 1])) {
        ++p;
        digits();
        is_float = true;
      }
      if (!after_dot && p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
        size_t q = p + 1;
        if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
        if (q < src_.size() && is_digit(src_[q])) {
          p = q;
          digits();
          is_float = true;
        }
      }
      std::string text = src_.substr(pos, p - pos);
      text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
      tokens_.push_back(make(is_float ? Token::Kind::kFloat : Token::Kind::kInteger, text, pos));
      *pos_inout = p;
      return Status::ok();
    }
    if (is_name_start(c)) {
      size_t p = pos;
      while (p < src_.size() && is_name_char(src_[p])) ++p;
      tokens_.push_back(make(Token::Kind::kName, src_.substr(pos, p - pos), pos));
      *pos_inout = p;
      return Status::ok();
    }
    static const char* const kTwoChar[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : kTwoChar) {
      if (src_.compare(pos, 2, op) == 0) {
        tokens_.push_back(make(Token::Kind::kOperator, op, pos));
        *pos_inout = pos + 2;
        return Status::ok();
      }
    }
    if (std::string_view("+-*/%~<>=()[]{},.:|;").find(c) == std::string_view::npos) {
      return error(pos, fmt::format("unexpected character '{}'", c));
    }
    if (c == '(' || c == '[' || c == '{') {
      brackets->push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (brackets->empty() || brackets->back() != c) {
        return error(pos, fmt::format("unexpected '{}'", c));
      }
      brackets->pop_back();
    }
    tokens_.push_back(make(Token::Kind::kOperator, std::string(1, c), pos));
    *pos_inout = pos + 1;
    return Status::ok();
  }

  std::string src_;
  LexerOptions options_;
  std::vector<size_t> line_starts_;  // offset of each line's first character
  std::vector<Token> tokens_;
};

}  // namespace

Result<std::vector<Token>> tokenize(const std::string& source, const LexerOptions& options) {
  // jinja2 reads \r\n and \r as \n, and drops one trailing newline unless told to keep it.
  std::string normalized;
  normalized.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      normalized.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      normalized.push_back(source[i]);
    }
  }
  if (!options.keep_trailing_newline && !normalized.empty() && normalized.back() == '\n') {
    normalized.pop_back();
  }
  return Lexer(std::move(normalized), options).run();
}

}  // namespace kvp::jinja

// Template: the public face of the Jinja interpreter. parse() lexes and parses a template once
// (source → tokens → syntax tree, checking every filter and test name as jinja2 does at compile
// time); render() evaluates the tree against a JSON context and returns the text. A parsed
// Template is immutable: render() may run on many threads at once.
//
// The environment is transformers' chat-template environment: trim_blocks, lstrip_blocks,
// loop controls (break/continue), the ImmutableSandboxedEnvironment's rules (no mutating list
// or dict methods, no underscore attributes, range() capped at 100000 items), and the globals
// raise_exception(msg), strftime_now(fmt), namespace(...), dict(...), range(...).
//
// Errors are Status values whose message starts with "line L:C: " where the template is at
// fault; the limits below end runaway templates with kResourceExhausted naming the limit.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "jinja/ast.h"

namespace kvp::jinja {

struct Limits {
  size_t max_nesting_depth = 200;  // blocks, brackets and expression height in the source
  size_t max_call_depth = 64;      // nested macro / caller() calls while rendering
  // loop bodies run, and list items built (range, list + and *), in one render
  uint64_t max_loop_iterations = 1'000'000;
  size_t max_output_bytes = kMaxTextBytes;  // the output, and any string built on the way
  // all the strings expressions build in one render together (a long string rebuilt in a loop)
  uint64_t max_built_bytes = uint64_t{256} << 20;
};

struct TemplateOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
  Limits limits;
};

class Template {
 public:
  // Errors: kInvalidArgument for syntax errors and unknown filters or tests ("line L:C: ...");
  // kResourceExhausted past max_nesting_depth.
  static Result<Template> parse(const std::string& source, const TemplateOptions& options = {});

  // `context` must be a JSON object; its keys become template variables. Errors: a render error
  // ("line L:C: 'x' is undefined", a raise_exception message, a type error) as kInvalidArgument,
  // a limit as kResourceExhausted. Does not modify the template.
  Result<std::string> render(const nlohmann::ordered_json& context) const;

  const TemplateOptions& options() const { return options_; }

 private:
  std::shared_ptr<const Body> body_;
  TemplateOptions options_;
};

}  // namespace kvp::jinja

// Hostile templates end with a clean error naming the limit, never a crash or a hang.
#include <gtest/gtest.h>

#include <string>

#include "jinja/template.h"

namespace kvp::jinja {
namespace {

Status render_status(const std::string& source, const TemplateOptions& options = {}) {
  Result<Template> t = Template::parse(source, options);
  if (!t.is_ok()) return t.status();
  Result<std::string> out = t->render(nlohmann::ordered_json::object());
  return out.is_ok() ? Status::ok() : out.status();
}

void expect_limit(const Status& status, const std::string& limit_name) {
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.to_string();
  EXPECT_NE(status.message().find(limit_name), std::string::npos) << status.to_string();
}

TEST(JinjaLimits, DeeplyNestedParenthesesAreRefused) {
  const std::string source =
      "{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}";
  expect_limit(render_status(source), "nesting depth limit");
}

TEST(JinjaLimits, LongOperatorChainIsRefused) {
  std::string source = "{{ 1";
  for (int i = 0; i < 100000; ++i) source += " + 1";
  expect_limit(render_status(source + " }}"), "nesting depth limit");
}

TEST(JinjaLimits, LongFilterChainIsRefused) {
  std::string source = "{{ 'a'";
  for (int i = 0; i < 50000; ++i) source += "|upper";
  expect_limit(render_status(source + " }}"), "nesting depth limit");
}

TEST(JinjaLimits, DeeplyNestedBlocksAreRefused) {
  std::string source;
  for (int i = 0; i < 20000; ++i) source += "{% if true %}";
  for (int i = 0; i < 20000; ++i) source += "{% endif %}";
  expect_limit(render_status(source), "nesting depth limit");
}

TEST(JinjaLimits, DeeplyNestedListLiteralIsRefused) {
  const std::string source = "{{ " + std::string(50000, '[') + std::string(50000, ']') + " }}";
  expect_limit(render_status(source), "nesting depth limit");
}

TEST(JinjaLimits, HugeNestedLoopsStopAtTheIterationLimit) {
  expect_limit(render_status("{% for i in range(100000) %}{% for j in range(100000) %}"
                             "{% endfor %}{% endfor %}"),
               "loop iteration limit (1000000)");
}

TEST(JinjaLimits, RangeIsCappedLikeTheSandbox) {
  expect_limit(render_status("{{ range(100001) | length }}"), "MAX_RANGE (100000)");
  EXPECT_TRUE(render_status("{{ range(100000) | length }}").is_ok());
}

TEST(JinjaLimits, UnboundedMacroRecursionStops) {
  expect_limit(render_status("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
               "macro call depth limit");
}

TEST(JinjaLimits, OutputSizeIsCapped) {
  TemplateOptions options;
  options.limits.max_output_bytes = 1 << 20;
  expect_limit(render_status("{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}", options),
               "output size limit");
}

TEST(JinjaLimits, StringRepeatAndDoublingAreCapped) {
  expect_limit(render_status("{{ 'x' * 100000000000 }}"), "output size limit");
  expect_limit(render_status("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(64) %}"
                             "{% set ns.s = ns.s ~ ns.s %}{% endfor %}"),
               "output size limit");
}

// Work that a template repeats in a loop counts: list items built, walked or searched, and the
// bytes of strings rebuilt, so no loop body can multiply the work past the limits.
TEST(JinjaLimits, ListDoublingStopsAtTheIterationLimit) {
  expect_limit(render_status("{% set ns = namespace(l=[1]) %}{% for i in range(64) %}"
                             "{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}"),
               "loop iteration limit (1000000)");
  expect_limit(render_status("{% for i in range(1000) %}{% set l = [0] * 100000 %}{% endfor %}"),
               "loop iteration limit (1000000)");
}

TEST(JinjaLimits, RangesListsAndStringsWalkedInALoopCountTheirItems) {
  expect_limit(render_status("{% for i in range(1000) %}{{ range(100000) | length }}{% endfor %}"),
               "loop iteration limit (1000000)");
  expect_limit(render_status("{{ ('x' * 2000000) | list | length }}"),
               "loop iteration limit (1000000)");
  expect_limit(render_status("{% set big = range(100000) | list %}{% for i in range(100) %}"
                             "{{ -1 in big }}{% endfor %}"),
               "loop iteration limit (1000000)");
}

TEST(JinjaLimits, StringsRebuiltInALoopStopAtTheBuiltBytesLimit) {
  expect_limit(render_status("{% set s = 'x' * 1000000 %}{% for i in range(1000) %}"
                             "{% set t = s ~ '' %}{% endfor %}"),
               "limit on the bytes of strings built (268435456)");
}

TEST(JinjaLimits, ALongStringRepeatedInAListIsSharedNotCopied) {
  const std::string source =
      "{% set s = 'x' * 10000000 %}{% set l = [s] * 100000 %}{{ l | length }}";
  Result<Template> t = Template::parse(source);
  ASSERT_TRUE(t.is_ok());
  Result<std::string> out = t->render(nlohmann::ordered_json::object());
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(*out, "100000");
  expect_limit(render_status("{% set s = 'x' * 10000000 %}{{ ([s] * 100000) | tojson | length }}"),
               "output size limit");
  expect_limit(render_status("{% set s = 'x' * 10000000 %}{{ ([s] * 100000) | string }}"),
               "output size limit");
}

TEST(JinjaLimits, ReplaceIsRefusedBeforeItsResultIsBuilt) {
  expect_limit(render_status("{% set s = 'x' * 100000 %}{{ s | replace('x', s) | length }}"),
               "output size limit");
  expect_limit(render_status("{% set s = 'x' * 100000 %}{{ s.replace('x', s) | length }}"),
               "output size limit");
  expect_limit(render_status("{% set s = 'x' * 100000 %}{{ s | replace('', s) | length }}"),
               "output size limit");
}

TEST(JinjaLimits, HugeIndentWidthsAreRefused) {
  expect_limit(render_status("{{ [1, 2] | tojson(indent=1000000000000) }}"), "output size limit");
  expect_limit(render_status("{{ 'a\\nb' | indent(1000000000000) }}"), "output size limit");
}

TEST(JinjaErrors, FormatIndexPast64BitsIsAnErrorNotAnException) {
  const Status status = render_status("{{ '{99999999999999999999999}'.format(1) }}");
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
  EXPECT_NE(status.message().find("out of range"), std::string::npos) << status.to_string();
  EXPECT_EQ(render_status("{{ '{1}{0}'.format('a', 'b') }}").code(), StatusCode::kOk);
}

TEST(JinjaLimits, SelfContainingNamespaceDoesNotRecurseForever) {
  const Status status =
      render_status("{% set ns = namespace(a=1) %}{% set ns.self = ns %}{{ ns }}");
  EXPECT_FALSE(status.is_ok());
  const Status json = render_status(
      "{% set ns = namespace(l=[]) %}{% set l = [ns] %}{% set ns.l = l %}{{ l | tojson }}");
  EXPECT_FALSE(json.is_ok());
}

TEST(JinjaLimits, IntegerOverflowIsAnError) {
  const Status status = render_status("{{ 2 ** 64 }}");
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("integer overflow"), std::string::npos) << status.to_string();
}

TEST(JinjaErrors, SyntaxErrorNamesLineAndColumn) {
  const Status status = render_status("line one\nline {{ two }}\n{% if x %}\n  {{ 1 + }}\n");
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(status.message().starts_with("line 4:")) << status.to_string();
}

TEST(JinjaErrors, SliceInsideATupleSubscriptIsASyntaxError) {
  // chat_template_fuzz: the slice was left without its target, and rendering dereferenced it
  for (const char* source : {"{{ l[3:0:,1] }}", "{{ l[1, :2] }}", "{{ l[::1, ::2] }}"}) {
    const Status status = render_status(source);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << source;
    EXPECT_NE(status.message().find("a slice cannot be part of a tuple subscript"),
              std::string::npos)
        << status.to_string();
  }
  EXPECT_TRUE(render_status("{{ [1, 2, 3][1:] }}{{ {(1, 2): 3}[1, 2] }}").is_ok());
}

TEST(JinjaErrors, RenderErrorNamesLineAndColumn) {
  const Status status = render_status("ok\n  {{ nope.attr }}");
  EXPECT_EQ(status.message(), "line 2:10: 'nope' is undefined") << status.to_string();
}

TEST(JinjaErrors, RaiseExceptionCarriesTheMessage) {
  const Status status = render_status("{{ raise_exception('roles must alternate') }}");
  EXPECT_EQ(status.message(), "line 1:4: roles must alternate") << status.to_string();
}

TEST(JinjaErrors, RenderIsRepeatableAndConst) {
  Result<Template> t = Template::parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}"
      "{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}");
  ASSERT_TRUE(t.is_ok());
  nlohmann::ordered_json context = {{"messages", {1, 2, 3}}};
  for (int i = 0; i < 3; ++i) EXPECT_EQ(*t->render(context), "3");
}

TEST(JinjaErrors, ContextMustBeAnObject) {
  Result<Template> t = Template::parse("x");
  ASSERT_TRUE(t.is_ok());
  EXPECT_FALSE(t->render(nlohmann::ordered_json::array()).is_ok());
}

}  // namespace
}  // namespace kvp::jinja

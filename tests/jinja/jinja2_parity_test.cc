// Every case of tests/jinja/cases.json rendered by our interpreter and by Python jinja2 in
// transformers' environment (tests/jinja/jinja2_reference.py, run once at test time): the
// outputs must match byte for byte, and where jinja2 fails we must fail too, naming line:column
// (and carrying raise_exception's message).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "jinja/template.h"
#include "support/python_reference.h"

namespace kvp::jinja {
namespace {

constexpr const char* kCasesFile = "tests/jinja/cases.json";

struct Case {
  std::string name;
  std::string source;
  nlohmann::ordered_json context;
};

const std::vector<Case>& all_cases() {
  static const std::vector<Case> cases = [] {
    std::vector<Case> out;
    std::ifstream in(kCasesFile);
    if (!in) return out;
    const auto json = nlohmann::ordered_json::parse(in);
    for (const auto& c : json) {
      out.push_back({c.at("name").get<std::string>(), c.at("template").get<std::string>(),
                     c.value("context", nlohmann::ordered_json::object())});
    }
    return out;
  }();
  return cases;
}

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  for (const Case& c : all_cases()) names.push_back(c.name);
  return names;
}

// The reference results, keyed by case name (loaded once per process).
const nlohmann::json* reference(std::string* why_not, bool* missing) {
  static test::PythonReference ref;
  static nlohmann::json results;
  static bool loaded = false;
  if (!loaded) {
    loaded = true;
    ref =
        test::run_python_reference("jinja2_cases", "tests/jinja/jinja2_reference.py", {kCasesFile});
    if (!ref.output.empty()) results = nlohmann::json::parse(test::read_text_file(ref.output));
  }
  *why_not = ref.error;
  *missing = ref.missing;
  return ref.output.empty() ? nullptr : &results;
}

class Jinja2Parity : public ::testing::TestWithParam<std::string> {};

TEST_P(Jinja2Parity, MatchesJinja2) {
  std::string why_not;
  bool missing = false;
  const nlohmann::json* results = reference(&why_not, &missing);
  if (results == nullptr && missing) GTEST_SKIP() << why_not;
  ASSERT_NE(results, nullptr) << why_not;
  const Case* found = nullptr;
  for (const Case& c : all_cases()) {
    if (c.name == GetParam()) found = &c;
  }
  ASSERT_NE(found, nullptr);
  const Case& c = *found;
  ASSERT_TRUE(results->contains(c.name)) << "no reference result for " << c.name;
  const nlohmann::json& expected = results->at(c.name);

  Result<std::string> ours = Status::invalid_argument("not run");
  Result<Template> parsed = Template::parse(c.source);
  if (parsed.is_ok()) {
    ours = parsed->render(c.context);
  } else {
    ours = parsed.status();
  }
  const std::string where = "template:\n" + c.source + "\ncontext: " + c.context.dump();
  if (expected.contains("error")) {
    const std::string message = expected.at("error").get<std::string>();
    ASSERT_FALSE(ours.is_ok()) << where << "\njinja2 failed (" << expected.at("type") << ": "
                               << message << ") but we rendered:\n[" << *ours << "]";
    EXPECT_TRUE(ours.status().message().starts_with("line "))
        << where << "\nour error does not name line:column: " << ours.status().to_string();
    if (expected.at("type") == "TemplateError") {
      EXPECT_NE(ours.status().message().find(message), std::string::npos)
          << where << "\nraise_exception message lost: " << ours.status().to_string();
    }
    return;
  }
  const std::string want = expected.at("output").get<std::string>();
  ASSERT_TRUE(ours.is_ok()) << where << "\njinja2 rendered:\n[" << want
                            << "]\nbut we failed: " << ours.status().to_string();
  EXPECT_EQ(*ours, want) << where << "\njinja2:\n[" << want << "]\nours:\n[" << *ours << "]";
}

INSTANTIATE_TEST_SUITE_P(Cases, Jinja2Parity, ::testing::ValuesIn(case_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

TEST(Jinja2Parity, HasEnoughCases) { EXPECT_GE(all_cases().size(), 150u); }

}  // namespace
}  // namespace kvp::jinja

// Chat templates against Hugging Face transformers: every fixture template (tests/server/
// fixtures/templates/, see its README) and the templates of the two GGUF models in models/ render
// every conversation of tests/server/fixtures/chat_conversations.json, with and without the
// generation prompt; tests/server/chat_template_reference.py renders the same with transformers
// at test time (run once, cached) and the outputs must match byte for byte. Where transformers
// fails (a template's raise_exception, a list where it wants a string) we must fail too.
#include "server/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "model/model_loader.h"
#include "support/python_reference.h"

namespace kvp {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFixtures = "tests/server/fixtures";
constexpr const char* kConversations = "tests/server/fixtures/chat_conversations.json";
constexpr const char* kTokens = "tests/server/fixtures/templates/tokens.json";
constexpr const char* kSmolLm = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr const char* kGemma = "models/gemma-3-270m-q4_k_m.gguf";

std::vector<std::string> template_files() {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(fs::path(kFixtures) / "templates", ec)) {
    if (entry.path().extension() == ".jinja") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

nlohmann::ordered_json conversations() {
  static const nlohmann::ordered_json all = [] {
    std::ifstream in(kConversations);
    return in ? nlohmann::ordered_json::parse(in) : nlohmann::ordered_json::array();
  }();
  return all;
}

struct RenderCase {
  std::string template_path;  // a fixture .jinja or a GGUF model
  std::string conversation;
  bool add_generation_prompt = true;
};

std::vector<RenderCase> all_cases() {
  std::vector<RenderCase> cases;
  std::vector<std::string> sources = template_files();
  sources.push_back(kSmolLm);
  for (const std::string& source : sources) {
    for (const auto& conv : conversations()) {
      for (bool agp : {true, false}) cases.push_back({source, conv["name"], agp});
    }
  }
  return cases;
}

const nlohmann::json* reference(std::string* why_not, bool* missing) {
  static test::PythonReference ref;
  static nlohmann::json results;
  static bool loaded = false;
  if (!loaded) {
    loaded = true;
    std::vector<std::string> inputs = {kConversations, kTokens};
    for (const std::string& file : template_files()) inputs.push_back(file);
    ref = test::run_python_reference("chat_templates", "tests/server/chat_template_reference.py",
                                     inputs, {kSmolLm, kGemma});
    if (!ref.output.empty()) results = nlohmann::json::parse(test::read_text_file(ref.output));
  }
  *why_not = ref.error;
  *missing = ref.missing;
  return ref.output.empty() ? nullptr : &results;
}

// The template for `path`: a fixture file with its tokens.json bos/eos, or a model's own
// template through load_chat_template (its tokenizer read from the GGUF).
Result<ChatTemplate> open_template(const std::string& path) {
  if (path.ends_with(".gguf")) {
    KVP_ASSIGN_OR_RETURN(Tokenizer tokenizer, load_tokenizer(path));
    return load_chat_template(path, tokenizer, "");
  }
  std::ifstream tokens_in(kTokens);
  const auto tokens = nlohmann::json::parse(tokens_in);
  const auto& entry = tokens.at(fs::path(path).filename().string());
  return ChatTemplate::parse(test::read_text_file(path), path, entry.at("bos_token"),
                             entry.at("eos_token"));
}

class TransformersParity : public ::testing::TestWithParam<RenderCase> {};

TEST_P(TransformersParity, RendersAsApplyChatTemplate) {
  const RenderCase& c = GetParam();
  std::string why_not;
  bool missing = false;
  const nlohmann::json* results = reference(&why_not, &missing);
  if (results == nullptr && missing) GTEST_SKIP() << why_not;
  ASSERT_NE(results, nullptr) << why_not;
  if (c.template_path.ends_with(".gguf") && !fs::exists(c.template_path)) {
    GTEST_SKIP() << c.template_path << " not present";
  }
  const nlohmann::json& entry = results->at(c.template_path);
  const std::string key = c.conversation + (c.add_generation_prompt ? "/gen" : "/nogen");
  const nlohmann::json& expected = entry.at("results").at(key);

  Result<ChatTemplate> chat = open_template(c.template_path);
  ASSERT_TRUE(chat.is_ok()) << chat.status().to_string();
  EXPECT_EQ(chat->bos_token(), entry.at("bos_token").get<std::string>());
  EXPECT_EQ(chat->eos_token(), entry.at("eos_token").get<std::string>());

  ChatTemplateInputs inputs;
  for (const auto& conv : conversations()) {
    if (conv["name"] != c.conversation) continue;
    inputs.messages = conv["messages"];
    if (conv.contains("tools")) inputs.tools = conv["tools"];
    if (conv.contains("extra")) inputs.extra = conv["extra"];
  }
  inputs.add_generation_prompt = c.add_generation_prompt;
  const Result<std::string> ours = chat->render(inputs);
  const std::string where = c.template_path + " on " + key;
  if (expected.contains("error")) {
    ASSERT_FALSE(ours.is_ok()) << where << ": transformers failed (" << expected.at("error")
                               << ") but we rendered:\n[" << *ours << "]";
    EXPECT_NE(ours.status().message().find(chat->origin()), std::string::npos)
        << ours.status().to_string();
    if (expected.at("type") == "TemplateError") {
      EXPECT_NE(ours.status().message().find(expected.at("error").get<std::string>()),
                std::string::npos)
          << ours.status().to_string();
    }
    return;
  }
  const std::string want = expected.at("output").get<std::string>();
  ASSERT_TRUE(ours.is_ok()) << where << ": we failed: " << ours.status().to_string()
                            << "\ntransformers rendered:\n[" << want << "]";
  EXPECT_EQ(*ours, want) << where << "\ntransformers:\n[" << want << "]\nours:\n[" << *ours << "]";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TransformersParity, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<RenderCase>& info) {
                           std::string name = fs::path(info.param.template_path).stem().string() +
                                              "__" + info.param.conversation +
                                              (info.param.add_generation_prompt ? "__gen" : "");
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

TEST(ChatTemplate, GgufWithoutTemplateIsNotFound) {
  if (!fs::exists(kGemma)) GTEST_SKIP() << kGemma << " not present";
  Result<Tokenizer> tokenizer = load_tokenizer(kGemma);
  ASSERT_TRUE(tokenizer.is_ok()) << tokenizer.status().to_string();
  const Result<ChatTemplate> chat = load_chat_template(kGemma, *tokenizer, "");
  ASSERT_FALSE(chat.is_ok());
  EXPECT_EQ(chat.status().code(), StatusCode::kNotFound);
  EXPECT_NE(chat.status().message().find(kGemma), std::string::npos) << chat.status().to_string();
}

TEST(ChatTemplate, OverrideFileReplacesTheModelsTemplate) {
  if (!fs::exists(kGemma)) GTEST_SKIP() << kGemma << " not present";
  Result<Tokenizer> tokenizer = load_tokenizer(kGemma);
  ASSERT_TRUE(tokenizer.is_ok());
  const std::string file = std::string(kFixtures) + "/templates/gemma-3-it.jinja";
  Result<ChatTemplate> chat = load_chat_template(kGemma, *tokenizer, file);
  ASSERT_TRUE(chat.is_ok()) << chat.status().to_string();
  EXPECT_EQ(chat->origin(), file);
  ChatTemplateInputs inputs;
  inputs.messages = {{{"role", "user"}, {"content", "Hi"}}};
  EXPECT_EQ(*chat->render(inputs),
            "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(load_chat_template(kGemma, *tokenizer, "no/such/file.jinja").status().code(),
            StatusCode::kNotFound);
}

TEST(ChatTemplate, HfDirectoryNamedTemplatesPickToolUseWhenToolsAreGiven) {
  if (!fs::exists(kSmolLm)) GTEST_SKIP() << kSmolLm << " not present";
  Result<Tokenizer> tokenizer = load_tokenizer(kSmolLm);
  ASSERT_TRUE(tokenizer.is_ok());
  const fs::path dir = fs::temp_directory_path() / fmt::format("kvp_chat_dir_{}", ::getpid());
  fs::create_directories(dir);
  nlohmann::json config = {
      {"bos_token", {{"content", "<B>"}, {"lstrip", false}}},
      {"eos_token", "<E>"},
      {"chat_template",
       {{{"name", "default"},
         {"template", "D{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}},
        {{"name", "tool_use"}, {"template", "T{{ tools | length }}"}}}}};
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  Result<ChatTemplate> chat = load_chat_template(dir.string(), *tokenizer, "");
  ASSERT_TRUE(chat.is_ok()) << chat.status().to_string();
  EXPECT_TRUE(chat->has_tool_use_template());
  ChatTemplateInputs inputs;
  inputs.messages = {{{"role", "user"}, {"content", "x"}}};
  EXPECT_EQ(*chat->render(inputs), "D<B>x<E>");
  inputs.tools = nlohmann::ordered_json::array({{{"type", "function"}}});
  EXPECT_EQ(*chat->render(inputs), "T1");

  // chat_template.jinja wins over tokenizer_config.json.
  std::ofstream(dir / "chat_template.jinja") << "J{{ messages | length }}\n";
  chat = load_chat_template(dir.string(), *tokenizer, "");
  ASSERT_TRUE(chat.is_ok());
  EXPECT_EQ(*chat->render(inputs), "J1");
  fs::remove_all(dir);
}

TEST(ChatTemplate, ErrorsNameTheOriginAndPosition) {
  EXPECT_EQ(ChatTemplate::parse("{% if %}", "my.jinja", "", "").status().message(),
            "chat template (my.jinja): line 1:7: unexpected '%}', expected an expression");
  Result<ChatTemplate> chat = ChatTemplate::parse(
      "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}"
      "{% endif %}ok",
      "gemma", "", "");
  ASSERT_TRUE(chat.is_ok());
  ChatTemplateInputs inputs;
  inputs.messages = {{{"role", "system"}, {"content", "s"}}};
  const Status status = chat->render(inputs).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "chat template (gemma): line 1:41: System role not supported");
}

TEST(ChatTemplate, RejectsMalformedInputs) {
  Result<ChatTemplate> chat = ChatTemplate::parse("{{ messages | length }}", "t", "", "");
  ASSERT_TRUE(chat.is_ok());
  ChatTemplateInputs inputs;
  EXPECT_FALSE(chat->render(inputs).is_ok());  // empty conversation
  inputs.messages = {"not an object"};
  EXPECT_FALSE(chat->render(inputs).is_ok());
  inputs.messages = {{{"role", "user"}, {"content", "x"}}};
  inputs.extra = {{"messages", 1}};
  EXPECT_FALSE(chat->render(inputs).is_ok());
  inputs.extra = {{"enable_thinking", false}};
  EXPECT_EQ(*chat->render(inputs), "1");
}

TEST(ChatTemplate, NullValuedKeysAreDroppedAndReasoningAliased) {
  Result<ChatTemplate> chat =
      ChatTemplate::parse("{% for m in messages %}{{ m | tojson }}{% endfor %}", "t", "", "");
  ASSERT_TRUE(chat.is_ok());
  ChatTemplateInputs inputs;
  inputs.messages = {{{"role", "assistant"}, {"content", nullptr}, {"reasoning", "r"}}};
  EXPECT_EQ(
      *chat->render(inputs),
      R"({"thinking": "r", "role": "assistant", "reasoning": "r", "reasoning_content": "r"})");
}

TEST(ChatTemplate, RendersConcurrently) {
  const std::string path = std::string(kFixtures) + "/templates/qwen2.5-instruct.jinja";
  Result<ChatTemplate> chat =
      ChatTemplate::parse(test::read_text_file(path), path, "", "<|im_end|>");
  ASSERT_TRUE(chat.is_ok()) << chat.status().to_string();
  ChatTemplateInputs inputs;
  inputs.messages = conversations()[1]["messages"];
  const std::string expected = *chat->render(inputs);
  std::vector<std::thread> threads;
  std::vector<int> num_mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        if (*chat->render(inputs) != expected) ++num_mismatches[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int n : num_mismatches) EXPECT_EQ(n, 0);
}

}  // namespace
}  // namespace kvp

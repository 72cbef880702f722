#include "server/metrics.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

namespace kvp {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPython = ".venv/bin/python";
constexpr const char* kParseScript = "tests/server/prometheus_parse.py";
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0.0;
};

struct Family {
  std::string name;  // as prometheus_client names it: counters without "_total"
  std::string type;
  std::string help;
  std::vector<Sample> samples;
};

// Parses exposition text with Python prometheus_client (tests/server/prometheus_parse.py).
// nullopt and `*why_not` when the reference cannot run.
std::optional<std::vector<Family>> parse_with_prometheus_client(const std::string& text,
                                                                std::string* why_not) {
  if (!fs::exists(kPython) || !fs::exists(kParseScript)) {
    *why_not = std::string(kPython) + " or " + kParseScript + " not found (run from the repo root)";
    return std::nullopt;
  }
  std::string dir_template = (fs::temp_directory_path() / "kvp_metrics_XXXXXX").string();
  if (mkdtemp(dir_template.data()) == nullptr) {
    *why_not = "mkdtemp failed";
    return std::nullopt;
  }
  const fs::path dir = dir_template;
  std::ofstream(dir / "metrics.txt", std::ios::binary) << text;
  const std::string command = std::string(kPython) + " " + kParseScript + " " +
                              (dir / "metrics.txt").string() + " > " +
                              (dir / "families.json").string();
  const int rc = std::system(command.c_str());
  std::ifstream in(dir / "families.json", std::ios::binary);
  std::stringstream json_text;
  json_text << in.rdbuf();
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (rc != 0) {
    ADD_FAILURE() << "the reference parser failed on:\n" << text;
    *why_not = "reference parser failed";
    return std::nullopt;
  }
  std::vector<Family> families;
  for (const auto& f : nlohmann::json::parse(json_text.str())) {
    Family family{f.at("name"), f.at("type"), f.at("help"), {}};
    for (const auto& s : f.at("samples")) {
      family.samples.push_back({s.at("name"),
                                s.at("labels").get<std::map<std::string, std::string>>(),
                                std::strtod(s.at("value").get<std::string>().c_str(), nullptr)});
    }
    families.push_back(std::move(family));
  }
  return families;
}

bool same_value(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

void expect_families(const std::vector<Family>& expected, const std::vector<Family>& actual) {
  ASSERT_EQ(expected.size(), actual.size());
  for (size_t f = 0; f < expected.size(); ++f) {
    EXPECT_EQ(expected[f].name, actual[f].name);
    EXPECT_EQ(expected[f].type, actual[f].type) << expected[f].name;
    EXPECT_EQ(expected[f].help, actual[f].help) << expected[f].name;
    ASSERT_EQ(expected[f].samples.size(), actual[f].samples.size()) << expected[f].name;
    for (size_t s = 0; s < expected[f].samples.size(); ++s) {
      const Sample& e = expected[f].samples[s];
      const Sample& a = actual[f].samples[s];
      EXPECT_EQ(e.name, a.name);
      EXPECT_EQ(e.labels, a.labels) << e.name;
      EXPECT_TRUE(same_value(e.value, a.value)) << e.name << ": " << e.value << " vs " << a.value;
    }
  }
}

TEST(FormatMetricValueTest, WritesLikePythonFloats) {
  EXPECT_EQ(format_metric_value(0.0), "0.0");
  EXPECT_EQ(format_metric_value(-0.0), "-0.0");
  EXPECT_EQ(format_metric_value(5.0), "5.0");
  EXPECT_EQ(format_metric_value(123456789.0), "123456789.0");
  EXPECT_EQ(format_metric_value(0.1), "0.1");
  EXPECT_EQ(format_metric_value(2.5), "2.5");
  EXPECT_EQ(format_metric_value(1e20), "1e+20");
  EXPECT_EQ(format_metric_value(1e-05), "1e-05");
  EXPECT_EQ(format_metric_value(kInf), "+Inf");
  EXPECT_EQ(format_metric_value(-kInf), "-Inf");
  EXPECT_EQ(format_metric_value(std::nan("")), "NaN");
}

TEST(FormatMetricValueTest, RandomDoublesRoundTrip) {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 100000; ++i) {
    const uint64_t bits = rng();
    double value;
    std::memcpy(&value, &bits, sizeof(value));
    if (!std::isfinite(value)) continue;
    const std::string text = format_metric_value(value);
    EXPECT_EQ(std::strtod(text.c_str(), nullptr), value) << text;
  }
}

TEST(MetricsRegistryTest, RendersExactText) {
  MetricsRegistry registry;
  registry.add_counter("vllm:prompt_tokens", "Prompt tokens.", {"model_name"})
      .labels({"m"})
      .inc(12);
  registry.add_gauge("vllm:num_requests_running", "Running requests.").set(3);
  Histogram& ttft =
      registry
          .add_histogram("vllm:time_to_first_token_seconds", "TTFT.\\s", {0.1, 1.0}, {"model_name"})
          .labels({"a\"b\\c\nd"});
  ttft.observe(0.05);
  ttft.observe(0.1);
  ttft.observe(7);
  EXPECT_EQ(
      registry.render(),
      "# HELP vllm:prompt_tokens_total Prompt tokens.\n"
      "# TYPE vllm:prompt_tokens_total counter\n"
      "vllm:prompt_tokens_total{model_name=\"m\"} 12.0\n"
      "# HELP vllm:num_requests_running Running requests.\n"
      "# TYPE vllm:num_requests_running gauge\n"
      "vllm:num_requests_running 3.0\n"
      "# HELP vllm:time_to_first_token_seconds TTFT.\\\\s\n"
      "# TYPE vllm:time_to_first_token_seconds histogram\n"
      "vllm:time_to_first_token_seconds_bucket{model_name=\"a\\\"b\\\\c\\nd\",le=\"0.1\"} 2.0\n"
      "vllm:time_to_first_token_seconds_bucket{model_name=\"a\\\"b\\\\c\\nd\",le=\"1.0\"} 2.0\n"
      "vllm:time_to_first_token_seconds_bucket{model_name=\"a\\\"b\\\\c\\nd\",le=\"+Inf\"} 3.0\n"
      "vllm:time_to_first_token_seconds_count{model_name=\"a\\\"b\\\\c\\nd\"} 3.0\n"
      "vllm:time_to_first_token_seconds_sum{model_name=\"a\\\"b\\\\c\\nd\"} 7.15\n");
}

TEST(MetricsRegistryTest, EmptyRegistryRendersNothing) {
  MetricsRegistry registry;
  EXPECT_EQ(registry.render(), "");
  registry.add_counter("kvp:unused", "No children yet.", {"model_name"});
  EXPECT_EQ(registry.render(),
            "# HELP kvp:unused_total No children yet.\n# TYPE kvp:unused_total counter\n");
}

TEST(MetricsRegistryTest, PrometheusClientParsesEveryKindAsRecorded) {
  MetricsRegistry registry;
  const std::string help_with_escapes = "Number of prefill tokens processed.\nA \\ backslash.";
  const std::string odd_label = "a\"b\\c\nd \xC3\xA9";
  CounterFamily& prompt_tokens =
      registry.add_counter("vllm:prompt_tokens", help_with_escapes, {"model_name"});
  prompt_tokens.labels({"m1"}).inc(5);
  prompt_tokens.labels({odd_label}).inc(2.5);
  registry.add_counter("kvp:requests_total", "Requests finished.").inc(3);
  GaugeFamily& running =
      registry.add_gauge("vllm:num_requests_running", "Running.", {"model_name", "engine"});
  running.labels({"m1", "0"}).set(4);
  running.labels({"m1", "1"}).dec(2);
  registry.add_gauge("kvp:nan_gauge", "NaN.").set(std::nan(""));
  registry.add_gauge("kvp:inf_gauge", "Inf.").set(kInf);
  Histogram& ttft = registry
                        .add_histogram("vllm:time_to_first_token_seconds", "TTFT.",
                                       {0.001, 0.5, 1.0, 2.5, 1e20, kInf}, {"model_name"})
                        .labels({"m1"});
  for (double seconds : {0.0005, 0.7, 1.0, 3.0, 1e21}) ttft.observe(seconds);
  registry.add_histogram("kvp:step_seconds", "Step time.", default_histogram_buckets())
      .observe(0.02);
  registry.add_callback(MetricType::kGauge, "vllm:kv_cache_usage_perc", "KV cache usage.",
                        [] { return 0.25; });
  registry.add_callback(MetricType::kCounter, "kvp:prefix_cache_hits", "Hits.", {"group"}, [] {
    return std::vector<LabelledValue>{{{"0"}, 7}, {{"1"}, 9}};
  });

  std::vector<Family> expected = {
      {"vllm:prompt_tokens",
       "counter",
       help_with_escapes,
       {{"vllm:prompt_tokens_total", {{"model_name", odd_label}}, 2.5},
        {"vllm:prompt_tokens_total", {{"model_name", "m1"}}, 5}}},
      {"kvp:requests", "counter", "Requests finished.", {{"kvp:requests_total", {}, 3}}},
      {"vllm:num_requests_running",
       "gauge",
       "Running.",
       {{"vllm:num_requests_running", {{"model_name", "m1"}, {"engine", "0"}}, 4},
        {"vllm:num_requests_running", {{"model_name", "m1"}, {"engine", "1"}}, -2}}},
      {"kvp:nan_gauge", "gauge", "NaN.", {{"kvp:nan_gauge", {}, std::nan("")}}},
      {"kvp:inf_gauge", "gauge", "Inf.", {{"kvp:inf_gauge", {}, kInf}}},
  };
  Family ttft_family{"vllm:time_to_first_token_seconds", "histogram", "TTFT.", {}};
  const std::vector<std::pair<std::string, double>> ttft_buckets = {
      {"0.001", 1}, {"0.5", 1}, {"1.0", 3}, {"2.5", 3}, {"1e+20", 4}, {"+Inf", 5}};
  for (const auto& [le, count] : ttft_buckets) {
    ttft_family.samples.push_back(
        {"vllm:time_to_first_token_seconds_bucket", {{"model_name", "m1"}, {"le", le}}, count});
  }
  ttft_family.samples.push_back(
      {"vllm:time_to_first_token_seconds_count", {{"model_name", "m1"}}, 5});
  ttft_family.samples.push_back({"vllm:time_to_first_token_seconds_sum",
                                 {{"model_name", "m1"}},
                                 0.0005 + 0.7 + 1.0 + 3.0 + 1e21});
  expected.push_back(ttft_family);
  Family step_family{"kvp:step_seconds", "histogram", "Step time.", {}};
  for (double bound : default_histogram_buckets()) {
    step_family.samples.push_back(
        {"kvp:step_seconds_bucket", {{"le", format_metric_value(bound)}}, bound >= 0.02 ? 1.0 : 0});
  }
  step_family.samples.push_back({"kvp:step_seconds_bucket", {{"le", "+Inf"}}, 1});
  step_family.samples.push_back({"kvp:step_seconds_count", {}, 1});
  step_family.samples.push_back({"kvp:step_seconds_sum", {}, 0.02});
  expected.push_back(step_family);
  expected.push_back({"vllm:kv_cache_usage_perc",
                      "gauge",
                      "KV cache usage.",
                      {{"vllm:kv_cache_usage_perc", {}, 0.25}}});
  expected.push_back({"kvp:prefix_cache_hits",
                      "counter",
                      "Hits.",
                      {{"kvp:prefix_cache_hits_total", {{"group", "0"}}, 7},
                       {"kvp:prefix_cache_hits_total", {{"group", "1"}}, 9}}});

  std::string why_not;
  const std::optional<std::vector<Family>> parsed =
      parse_with_prometheus_client(registry.render(), &why_not);
  if (!parsed) GTEST_SKIP() << why_not;
  expect_families(expected, *parsed);
}

TEST(MetricsRegistryTest, CallbacksAreReadAtEveryRender) {
  MetricsRegistry registry;
  double usage = 0.5;
  registry.add_callback(MetricType::kGauge, "kvp:usage", "Usage.", [&usage] { return usage; });
  EXPECT_NE(registry.render().find("kvp:usage 0.5\n"), std::string::npos);
  usage = 0.75;
  EXPECT_NE(registry.render().find("kvp:usage 0.75\n"), std::string::npos);
}

TEST(MetricsRegistryTest, ManyThreadsUpdatingGiveExactTotals) {
  constexpr int kNumThreads = 8;
  constexpr int kNumIncrements = 50000;
  MetricsRegistry registry;
  CounterFamily& tokens = registry.add_counter("kvp:tokens", "Tokens.", {"model_name"});
  Gauge& running = registry.add_gauge("kvp:running", "Running.");
  Histogram& latency = registry.add_histogram("kvp:latency_seconds", "Latency.", {0.5, 1.5});
  std::atomic<bool> stop_rendering{false};
  std::thread renderer([&] {
    while (!stop_rendering.load()) EXPECT_FALSE(registry.render().empty());
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kNumThreads; ++t) {
    threads.emplace_back([&, t] {
      Counter& own = tokens.labels({"thread" + std::to_string(t)});
      for (int i = 0; i < kNumIncrements; ++i) {
        tokens.labels({"shared"}).inc();  // the lookup races with other threads' creation
        own.inc(2);
        running.inc();
        latency.observe(i % 3);  // 0, 1, 2: one value per bucket
        running.dec();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  stop_rendering.store(true);
  renderer.join();

  EXPECT_EQ(tokens.labels({"shared"}).value(), kNumThreads * kNumIncrements);
  for (int t = 0; t < kNumThreads; ++t) {
    EXPECT_EQ(tokens.labels({"thread" + std::to_string(t)}).value(), 2.0 * kNumIncrements);
  }
  EXPECT_EQ(running.value(), 0.0);
  const Histogram::Snapshot snapshot = latency.snapshot();
  const uint64_t total = uint64_t{kNumThreads} * kNumIncrements;
  uint64_t zeros = 0;
  uint64_t ones = 0;
  for (int i = 0; i < kNumIncrements; ++i) {
    if (i % 3 == 0) ++zeros;
    if (i % 3 == 1) ++ones;
  }
  ASSERT_EQ(snapshot.cumulative_counts.size(), 3u);
  EXPECT_EQ(snapshot.cumulative_counts[0], kNumThreads * zeros);
  EXPECT_EQ(snapshot.cumulative_counts[1], kNumThreads * (zeros + ones));
  EXPECT_EQ(snapshot.cumulative_counts[2], total);
  const uint64_t twos = kNumIncrements - zeros - ones;
  EXPECT_EQ(snapshot.sum, static_cast<double>(kNumThreads * (ones + 2 * twos)));
}

TEST(MetricsRegistryDeathTest, ProgrammingErrorsAreChecked) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        MetricsRegistry registry;
        registry.add_counter("kvp:x", "X.");
        registry.add_gauge("kvp:x", "X again.");
      },
      "already taken");
  EXPECT_DEATH(
      {
        MetricsRegistry registry;
        registry.add_counter("kvp:x", "X.");
        registry.add_gauge("kvp:x_total", "Collides with the counter's sample.");
      },
      "already taken");
  EXPECT_DEATH({ MetricsRegistry().add_gauge("1bad", "Bad name."); }, "is not");
  EXPECT_DEATH({ MetricsRegistry().add_gauge("kvp:g", "G.", {"__reserved"}); }, "not valid");
  EXPECT_DEATH({ MetricsRegistry().add_histogram("kvp:h", "H.", {1.0}, {"le"}); }, "reserved");
  EXPECT_DEATH({ MetricsRegistry().add_histogram("kvp:h", "H.", {2.0, 1.0}); }, "increasing");
  EXPECT_DEATH(
      {
        MetricsRegistry().add_counter("kvp:c", "C.", {"a"}).labels({"x", "y"});
      },
      "2 label values for 1 labels");
  EXPECT_DEATH({ MetricsRegistry().add_counter("kvp:c", "C.").inc(-1); }, "negative");
}

}  // namespace
}  // namespace kvp

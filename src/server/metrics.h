// Prometheus metrics for the server's /metrics endpoint, in the text exposition format 0.0.4
// (no C++ client is packaged for Debian 12, so this writes the format itself).
//
// A MetricsRegistry owns metric families: counters, gauges, histograms, each with a name, help
// text and label names, holding one child per distinct label values. Request threads update
// children (lock-free atomics; the family lock is taken only to find or create a child, so hot
// paths keep the reference), and render() walks the families in registration order, each
// family's children in label-value order, and writes:
//
//   # HELP vllm:prompt_tokens_total Number of prefill tokens processed.
//   # TYPE vllm:prompt_tokens_total counter
//   vllm:prompt_tokens_total{model_name="m"} 1234.0
//   # HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
//   # TYPE vllm:time_to_first_token_seconds histogram
//   vllm:time_to_first_token_seconds_bucket{model_name="m",le="0.5"} 3.0
//   vllm:time_to_first_token_seconds_bucket{model_name="m",le="+Inf"} 4.0
//   vllm:time_to_first_token_seconds_count{model_name="m"} 4.0
//   vllm:time_to_first_token_seconds_sum{model_name="m"} 2.25
//
// as Python's prometheus_client (which vLLM uses) writes it: a counter registered as "x" or
// "x_total" is exposed as "x_total", values print like Python floats ("5.0", "+Inf", "NaN"), no
// `_created` samples. Callback metrics read a function at render time (engine statistics kept
// elsewhere). Names and label names are the program's own: a bad or repeated one is a KVP_CHECK.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/check.h"

namespace kvp {

inline constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

enum class MetricType { kCounter, kGauge, kHistogram };

const char* metric_type_name(MetricType type);  // "counter", "gauge", "histogram"

// A value as the exposition format writes it: shortest text that reads back as the same double,
// with ".0" on integral values (as Python's repr), "+Inf", "-Inf", "NaN".
std::string format_metric_value(double value);

// A monotonically increasing value.
class Counter {
 public:
  // requires: amount >= 0
  void inc(double amount = 1.0);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down.
class Gauge {
 public:
  void set(double value) { value_.store(value, std::memory_order_relaxed); }
  void inc(double amount = 1.0) { value_.fetch_add(amount, std::memory_order_relaxed); }
  void dec(double amount = 1.0) { value_.fetch_sub(amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Observations counted into buckets by upper bound (le: value <= bound), plus their sum.
class Histogram {
 public:
  // requires: upper_bounds strictly increasing, finite but for a last +Inf (which is implied
  // anyway and dropped).
  explicit Histogram(std::vector<double> upper_bounds);

  // NaN lands in the +Inf bucket only.
  void observe(double value);

  struct Snapshot {
    std::vector<uint64_t> cumulative_counts;  // [num upper bounds + 1], the last is +Inf (count)
    double sum = 0.0;
  };
  // Reads the buckets; concurrent observations may be half seen (the sum lags or leads by them).
  Snapshot snapshot() const;
  const std::vector<double>& upper_bounds() const { return upper_bounds_; }

 private:
  std::vector<double> upper_bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> bucket_counts_;  // [upper_bounds_.size() + 1]
  std::atomic<double> sum_{0.0};
};

// The default buckets of prometheus_client (seconds).
std::vector<double> default_histogram_buckets();

// One metric family: name, help, label names, and a child per label values.
class MetricFamilyBase {
 public:
  MetricFamilyBase(std::string name, std::string help, MetricType type,
                   std::vector<std::string> label_names);
  virtual ~MetricFamilyBase() = default;

  const std::string& name() const { return name_; }  // as registered ("x" for "x_total" counters)
  const std::string& help() const { return help_; }
  MetricType type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }

  // Appends the family's # HELP, # TYPE and sample lines to `out`. Does not modify the family.
  void render(std::string& out) const;

 protected:
  // The samples, one line each.
  virtual void render_samples(std::string& out) const = 0;
  // `base{a="x",b="y"<extra>} value\n`
  void write_sample(std::string& out, const std::string& sample_name,
                    const std::vector<std::string>& label_values, const std::string& extra_label,
                    double value) const;
  std::string exposed_name() const;  // counters get "_total"

 private:
  std::string name_;
  std::string help_;
  MetricType type_;
  std::vector<std::string> label_names_;
};

template <typename Metric>
class MetricFamily final : public MetricFamilyBase {
 public:
  MetricFamily(std::string name, std::string help, MetricType type,
               std::vector<std::string> label_names, std::function<std::unique_ptr<Metric>()> make)
      : MetricFamilyBase(std::move(name), std::move(help), type, std::move(label_names)),
        make_(std::move(make)) {}

  // The child for these label values (one per label name, in order), created on first use. The
  // reference lives as long as the registry: hot paths look it up once and keep it.
  Metric& labels(const std::vector<std::string>& label_values);

 private:
  void render_samples(std::string& out) const override;

  std::function<std::unique_ptr<Metric>()> make_;
  mutable std::mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<Metric>> children_;  // guarded by mu_
};

extern template class MetricFamily<Counter>;
extern template class MetricFamily<Gauge>;
extern template class MetricFamily<Histogram>;
using CounterFamily = MetricFamily<Counter>;
using GaugeFamily = MetricFamily<Gauge>;
using HistogramFamily = MetricFamily<Histogram>;

// What a labelled callback metric reads: one value per label values.
struct LabelledValue {
  std::vector<std::string> label_values;
  double value = 0.0;
};

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Registration (at startup, any thread). Without label names the metric itself comes back.
  // requires: a name not registered before, matching [a-zA-Z_:][a-zA-Z0-9_:]*; label names
  // matching [a-zA-Z_][a-zA-Z0-9_]*, not starting "__", not "le" for histograms.
  Counter& add_counter(const std::string& name, const std::string& help);
  CounterFamily& add_counter(const std::string& name, const std::string& help,
                             std::vector<std::string> label_names);
  Gauge& add_gauge(const std::string& name, const std::string& help);
  GaugeFamily& add_gauge(const std::string& name, const std::string& help,
                         std::vector<std::string> label_names);
  Histogram& add_histogram(const std::string& name, const std::string& help,
                           std::vector<double> upper_bounds);
  HistogramFamily& add_histogram(const std::string& name, const std::string& help,
                                 std::vector<double> upper_bounds,
                                 std::vector<std::string> label_names);

  // Metrics read at render time. `read` runs on the rendering thread without the registry's
  // lock held, so it may take the engine's locks; it must not register metrics.
  // requires: type is kCounter or kGauge
  void add_callback(MetricType type, const std::string& name, const std::string& help,
                    std::function<double()> read);
  // requires: every LabelledValue has one value per label name
  void add_callback(MetricType type, const std::string& name, const std::string& help,
                    std::vector<std::string> label_names,
                    std::function<std::vector<LabelledValue>()> read);

  // The exposition text of every family. Thread-safe; does not modify the registry.
  std::string render() const;

 private:
  // Checks the names and takes ownership; returns the family.
  MetricFamilyBase& add_family(std::unique_ptr<MetricFamilyBase> family);

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<MetricFamilyBase>> families_;  // guarded by mu_; never shrinks
  std::vector<std::string> exposed_names_;                   // guarded by mu_; every sample name
};

template <typename Metric>
Metric& MetricFamily<Metric>::labels(const std::vector<std::string>& label_values) {
  KVP_CHECK(label_values.size() == label_names().size(), "metric {}: {} label values for {} labels",
            name(), label_values.size(), label_names().size());
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<Metric>& child = children_[label_values];
  if (!child) child = make_();
  return *child;
}

}  // namespace kvp

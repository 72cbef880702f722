#include "server/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>

namespace kvp {
namespace {

constexpr std::string_view kTotalSuffix = "_total";

bool is_metric_name(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!letter && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool is_label_name(const std::string& name) {
  if (name.empty() || name.starts_with("__")) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!letter && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// HELP text escapes backslash and newline; label values also the double quote.
void append_escaped(std::string& out, const std::string& text, bool escape_quote) {
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && escape_quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

std::string strip_total(const std::string& name, MetricType type) {
  if (type == MetricType::kCounter && name.ends_with(kTotalSuffix) &&
      name.size() > kTotalSuffix.size()) {
    return name.substr(0, name.size() - kTotalSuffix.size());
  }
  return name;
}

// The sample names a family writes: they must not meet another family's.
std::vector<std::string> sample_names(const MetricFamilyBase& family) {
  const std::string& name = family.name();
  switch (family.type()) {
    case MetricType::kCounter:
      return {name, name + "_total"};
    case MetricType::kGauge:
      return {name};
    case MetricType::kHistogram:
      return {name, name + "_bucket", name + "_count", name + "_sum"};
  }
  return {name};
}

std::string le_label(double upper_bound) {
  return "le=\"" + format_metric_value(upper_bound) + "\"";
}

// A counter or gauge read from a function at render time.
class CallbackFamily final : public MetricFamilyBase {
 public:
  CallbackFamily(std::string name, std::string help, MetricType type,
                 std::vector<std::string> label_names,
                 std::function<std::vector<LabelledValue>()> read)
      : MetricFamilyBase(std::move(name), std::move(help), type, std::move(label_names)),
        read_(std::move(read)) {}

 private:
  void render_samples(std::string& out) const override {
    const std::string sample_name = exposed_name();
    for (const LabelledValue& sample : read_()) {
      KVP_CHECK(sample.label_values.size() == label_names().size(),
                "callback metric {}: {} label values for {} labels", name(),
                sample.label_values.size(), label_names().size());
      write_sample(out, sample_name, sample.label_values, "", sample.value);
    }
  }

  std::function<std::vector<LabelledValue>()> read_;
};

}  // namespace

const char* metric_type_name(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

std::string format_metric_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char text[64];
  const auto [end, error] = std::to_chars(text, text + sizeof(text), value);
  KVP_CHECK(error == std::errc(), "to_chars of a double");
  std::string formatted(text, end);
  if (formatted.find_first_of(".e") == std::string::npos) formatted += ".0";
  return formatted;
}

void Counter::inc(double amount) {
  KVP_CHECK(amount >= 0.0, "counter increment {} is negative", amount);
  value_.fetch_add(amount, std::memory_order_relaxed);
}

Histogram::Histogram(std::vector<double> upper_bounds) : upper_bounds_(std::move(upper_bounds)) {
  if (!upper_bounds_.empty() && upper_bounds_.back() == std::numeric_limits<double>::infinity()) {
    upper_bounds_.pop_back();
  }
  for (size_t i = 0; i < upper_bounds_.size(); ++i) {
    KVP_CHECK(std::isfinite(upper_bounds_[i]), "histogram bound {} is not finite",
              upper_bounds_[i]);
    KVP_CHECK(i == 0 || upper_bounds_[i - 1] < upper_bounds_[i],
              "histogram bounds not strictly increasing at {}", upper_bounds_[i]);
  }
  bucket_counts_ = std::make_unique<std::atomic<uint64_t>[]>(upper_bounds_.size() + 1);
}

void Histogram::observe(double value) {
  // lower_bound: the first bound >= value, the bucket whose `le` the value meets. NaN compares
  // false with everything, so it is sent to +Inf explicitly.
  const size_t bucket = std::isnan(value)
                            ? upper_bounds_.size()
                            : static_cast<size_t>(std::lower_bound(upper_bounds_.begin(),
                                                                   upper_bounds_.end(), value) -
                                                  upper_bounds_.begin());
  bucket_counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot snapshot;
  snapshot.cumulative_counts.resize(upper_bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) {
    running += bucket_counts_[i].load(std::memory_order_relaxed);
    snapshot.cumulative_counts[i] = running;
  }
  snapshot.sum = sum_.load(std::memory_order_relaxed);
  return snapshot;
}

std::vector<double> default_histogram_buckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0};
}

MetricFamilyBase::MetricFamilyBase(std::string name, std::string help, MetricType type,
                                   std::vector<std::string> label_names)
    : name_(strip_total(name, type)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)) {
  KVP_CHECK(is_metric_name(name_), "metric name '{}' is not [a-zA-Z_:][a-zA-Z0-9_:]*", name_);
  for (size_t i = 0; i < label_names_.size(); ++i) {
    KVP_CHECK(is_label_name(label_names_[i]), "metric {}: label name '{}' is not valid", name_,
              label_names_[i]);
    KVP_CHECK(type_ != MetricType::kHistogram || label_names_[i] != "le",
              "histogram {}: label 'le' is reserved", name_);
    KVP_CHECK(std::find(label_names_.begin(), label_names_.begin() + i, label_names_[i]) ==
                  label_names_.begin() + i,
              "metric {}: label '{}' given twice", name_, label_names_[i]);
  }
}

std::string MetricFamilyBase::exposed_name() const {
  return type_ == MetricType::kCounter ? name_ + std::string(kTotalSuffix) : name_;
}

void MetricFamilyBase::render(std::string& out) const {
  const std::string exposed = exposed_name();
  out += "# HELP ";
  out += exposed;
  out += ' ';
  append_escaped(out, help_, /*escape_quote=*/false);
  out += "\n# TYPE ";
  out += exposed;
  out += ' ';
  out += metric_type_name(type_);
  out += '\n';
  render_samples(out);
}

void MetricFamilyBase::write_sample(std::string& out, const std::string& sample_name,
                                    const std::vector<std::string>& label_values,
                                    const std::string& extra_label, double value) const {
  out += sample_name;
  if (!label_names_.empty() || !extra_label.empty()) {
    out += '{';
    for (size_t i = 0; i < label_names_.size(); ++i) {
      if (i > 0) out += ',';
      out += label_names_[i];
      out += "=\"";
      append_escaped(out, label_values[i], /*escape_quote=*/true);
      out += '"';
    }
    if (!extra_label.empty()) {
      if (!label_names_.empty()) out += ',';
      out += extra_label;
    }
    out += '}';
  }
  out += ' ';
  out += format_metric_value(value);
  out += '\n';
}

template <typename Metric>
void MetricFamily<Metric>::render_samples(std::string& out) const {
  // Children are never removed, so their addresses outlive the lock.
  std::vector<std::pair<const std::vector<std::string>*, const Metric*>> children;
  {
    std::lock_guard<std::mutex> lock(mu_);
    children.reserve(children_.size());
    for (const auto& [label_values, child] : children_) {
      children.emplace_back(&label_values, child.get());
    }
  }
  const std::string sample_name = exposed_name();
  for (const auto& [label_values, child] : children) {
    if constexpr (std::is_same_v<Metric, Histogram>) {
      const Histogram::Snapshot snapshot = child->snapshot();
      const std::vector<double>& bounds = child->upper_bounds();
      for (size_t i = 0; i < bounds.size(); ++i) {
        write_sample(out, sample_name + "_bucket", *label_values, le_label(bounds[i]),
                     static_cast<double>(snapshot.cumulative_counts[i]));
      }
      const double count = static_cast<double>(snapshot.cumulative_counts.back());
      write_sample(out, sample_name + "_bucket", *label_values, "le=\"+Inf\"", count);
      write_sample(out, sample_name + "_count", *label_values, "", count);
      write_sample(out, sample_name + "_sum", *label_values, "", snapshot.sum);
    } else {
      write_sample(out, sample_name, *label_values, "", child->value());
    }
  }
}

template class MetricFamily<Counter>;
template class MetricFamily<Gauge>;
template class MetricFamily<Histogram>;

Counter& MetricsRegistry::add_counter(const std::string& name, const std::string& help) {
  return add_counter(name, help, {}).labels({});
}

CounterFamily& MetricsRegistry::add_counter(const std::string& name, const std::string& help,
                                            std::vector<std::string> label_names) {
  return static_cast<CounterFamily&>(add_family(
      std::make_unique<CounterFamily>(name, help, MetricType::kCounter, std::move(label_names),
                                      [] { return std::make_unique<Counter>(); })));
}

Gauge& MetricsRegistry::add_gauge(const std::string& name, const std::string& help) {
  return add_gauge(name, help, {}).labels({});
}

GaugeFamily& MetricsRegistry::add_gauge(const std::string& name, const std::string& help,
                                        std::vector<std::string> label_names) {
  return static_cast<GaugeFamily&>(add_family(
      std::make_unique<GaugeFamily>(name, help, MetricType::kGauge, std::move(label_names),
                                    [] { return std::make_unique<Gauge>(); })));
}

Histogram& MetricsRegistry::add_histogram(const std::string& name, const std::string& help,
                                          std::vector<double> upper_bounds) {
  return add_histogram(name, help, std::move(upper_bounds), {}).labels({});
}

HistogramFamily& MetricsRegistry::add_histogram(const std::string& name, const std::string& help,
                                                std::vector<double> upper_bounds,
                                                std::vector<std::string> label_names) {
  Histogram check_bounds(upper_bounds);  // a bad bound fails here, at registration
  return static_cast<HistogramFamily&>(add_family(std::make_unique<HistogramFamily>(
      name, help, MetricType::kHistogram, std::move(label_names),
      [bounds = std::move(upper_bounds)] { return std::make_unique<Histogram>(bounds); })));
}

void MetricsRegistry::add_callback(MetricType type, const std::string& name,
                                   const std::string& help, std::function<double()> read) {
  add_callback(type, name, help, {}, [read = std::move(read)] {
    return std::vector<LabelledValue>{{{}, read()}};
  });
}

void MetricsRegistry::add_callback(MetricType type, const std::string& name,
                                   const std::string& help, std::vector<std::string> label_names,
                                   std::function<std::vector<LabelledValue>()> read) {
  KVP_CHECK(type == MetricType::kCounter || type == MetricType::kGauge,
            "callback metric {}: a {} cannot be read from a function", name,
            metric_type_name(type));
  add_family(
      std::make_unique<CallbackFamily>(name, help, type, std::move(label_names), std::move(read)));
}

MetricFamilyBase& MetricsRegistry::add_family(std::unique_ptr<MetricFamilyBase> family) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names = sample_names(*family);
  for (const std::string& name : names) {
    KVP_CHECK(std::find(exposed_names_.begin(), exposed_names_.end(), name) == exposed_names_.end(),
              "metric {}: the name {} is already taken", family->name(), name);
  }
  exposed_names_.insert(exposed_names_.end(), names.begin(), names.end());
  families_.push_back(std::move(family));
  return *families_.back();
}

std::string MetricsRegistry::render() const {
  std::vector<const MetricFamilyBase*> families;
  {
    std::lock_guard<std::mutex> lock(mu_);
    families.reserve(families_.size());
    for (const auto& family : families_) families.push_back(family.get());
  }
  std::string out;
  for (const MetricFamilyBase* family : families) family->render(out);
  return out;
}

}  // namespace kvp

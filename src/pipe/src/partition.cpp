// Stage partitioning (ds/pipe/partition.h): DeepSpeed's ds_utils.partition_uniform and
// partition_balanced (runtime/utils.py) and PipelineModule's partition_method values.
#include "ds/pipe/partition.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <regex>

#include "ds/core/error.h"

namespace ds::pipe {

StageBounds partition_uniform(int num_items, int num_parts) {
  DS_CHECK(num_items >= 0 && num_parts >= 1,
           "partition_uniform: " << num_items << " items into " << num_parts << " parts");
  StageBounds parts(num_parts + 1);
  if (num_items <= num_parts) {
    for (int p = 0; p <= num_parts; ++p) parts[p] = std::min(p, num_items);
    return parts;
  }
  const int chunk = num_items / num_parts, residual = num_items % num_parts;
  for (int p = 0; p <= num_parts; ++p) parts[p] = p * chunk + std::min(p, residual);
  return parts;
}

// DeepSpeed's dynamic program, kept exactly: the cost of splitting the first i items into j
// parts is the spread (max - min part weight) along the chosen splits; dp_min[0][0] stays
// infinite as in DeepSpeed, and a cost equal to the best so far wins (`>=`), so among equal
// spreads the last split point k is kept. Doubles and infinities as numpy's.
StageBounds partition_balanced(const std::vector<std::int64_t>& weights, int num_parts) {
  DS_CHECK(num_parts >= 1, "partition_balanced: " << num_parts << " parts");
  const int n = static_cast<int>(weights.size()), m = num_parts;
  if (n <= m) return partition_uniform(n, m);
  constexpr double inf = std::numeric_limits<double>::infinity();
  auto table = [&](double v) { return std::vector<std::vector<double>>(n + 1, std::vector<double>(m + 1, v)); };
  auto dp_max = table(inf), dp_min = table(inf), dp_cost = table(inf);
  std::vector<std::vector<int>> position(n + 1, std::vector<int>(m + 1, 0));
  std::vector<double> prefix(n + 1, 0.0);
  std::int64_t sum = 0;
  for (int i = 0; i < n; ++i) {
    DS_CHECK(weights[i] >= 0, "partition_balanced: weight " << i << " is " << weights[i] << ", must be >= 0");
    DS_CHECK(!__builtin_add_overflow(sum, weights[i], &sum), "partition_balanced: the weights' sum overflows");
    prefix[i + 1] = static_cast<double>(sum);
  }
  dp_max[0][0] = 0;
  dp_cost[0][0] = 0;
  for (int i = 1; i <= n; ++i) {
    for (int j = 1; j <= std::min(i, m); ++j) {
      for (int k = 0; k < i; ++k) {
        const double part = prefix[i] - prefix[k];
        const double max_sum = std::max(dp_max[k][j - 1], part), min_sum = std::min(dp_min[k][j - 1], part);
        const double cost = max_sum - min_sum;
        if (dp_cost[i][j] >= cost) {
          dp_cost[i][j] = cost;
          dp_max[i][j] = max_sum;
          dp_min[i][j] = min_sum;
          position[i][j] = k;
        }
      }
    }
  }
  StageBounds parts(m + 1);
  parts[m] = n;
  for (int j = m; j >= 1; --j) parts[j - 1] = position[parts[j]][j];
  return parts;
}

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::regex type_pattern(const std::string& pattern) {
  try {
    return std::regex(pattern, std::regex::ECMAScript | std::regex::icase);
  } catch (const std::regex_error& e) {
    DS_THROW("partition method \"type:" << pattern << "\": not a valid regular expression (" << e.what() << ")");
  }
}

}  // namespace

PartitionMethod PartitionMethod::parse(const std::string& text) {
  const std::string l = lower(text);
  if (l == "parameters") return {Kind::Parameters, {}};
  if (l == "uniform") return {Kind::Uniform, {}};
  if (l.starts_with("type:")) {
    PartitionMethod m{Kind::Type, text.substr(5)};
    DS_CHECK(!m.type_regex.empty(), "partition method \"" << text << "\": the pattern after \"type:\" is empty");
    type_pattern(m.type_regex);  // a bad pattern fails here, where the value is read
    return m;
  }
  DS_THROW("partition method \"" << text << "\" is not supported; use \"parameters\" (balanced by parameter count), "
                                 "\"uniform\" (by layer count) or \"type:REGEX\" (by the layers whose name matches)");
}

std::string PartitionMethod::text() const {
  switch (kind) {
    case Kind::Parameters: return "parameters";
    case Kind::Uniform: return "uniform";
    case Kind::Type: return "type:" + type_regex;
  }
  return "?";
}

StageBounds partition_layers(const std::vector<LayerInfo>& layers, int stages, const PartitionMethod& method) {
  const int n = static_cast<int>(layers.size());
  DS_CHECK(stages >= 1, "pipeline partition: stages must be >= 1, got " << stages);
  DS_CHECK(stages <= n, "pipeline partition: " << stages << " stages but the model has " << n
                                               << " layers; each stage needs at least one layer");
  std::vector<std::int64_t> weights(n);
  switch (method.kind) {
    case PartitionMethod::Kind::Uniform: return partition_uniform(n, stages);
    case PartitionMethod::Kind::Parameters:
      for (int i = 0; i < n; ++i) weights[i] = layers[i].parameters;
      return partition_balanced(weights, stages);
    case PartitionMethod::Kind::Type: {
      const std::regex re = type_pattern(method.type_regex);
      for (int i = 0; i < n; ++i) weights[i] = std::regex_search(layers[i].name, re) ? 1 : 0;
      DS_CHECK(std::count(weights.begin(), weights.end(), 1) > 0,
               "pipeline partition: \"type:" << method.type_regex << "\" matches none of the model's " << n
                                             << " layer names; nothing to balance the stages by");
      return partition_balanced(weights, stages);
    }
  }
  DS_THROW("pipeline partition: unknown method");
}

}  // namespace ds::pipe

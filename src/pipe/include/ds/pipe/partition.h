// Splitting a model's ordered layers into pipeline stages, as DeepSpeed's
// PipelineModule._partition_layers does with its partition_method values:
//   "parameters"  balanced by each layer's parameter count (DeepSpeed's default),
//   "uniform"     balanced by layer count,
//   "type:REGEX"  balanced by the layers whose name matches REGEX (case-insensitive search).
// The balancing is DeepSpeed's ds_utils.partition_uniform / partition_balanced, so the same
// weights give the same stage boundaries.
//
// Where dstrain differs: more stages than layers is an error (DeepSpeed leaves stages
// empty); REGEX is the whole text after "type:" as written, in ECMAScript syntax (DeepSpeed
// lower-cases the method and cuts the pattern at a second ':').
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ds::pipe {

// Stage boundaries: parts.size() == stages + 1, parts.front() == 0, parts.back() == layers;
// stage s holds layers [parts[s], parts[s + 1]).
using StageBounds = std::vector<int>;

// DeepSpeed's partition_uniform: num_items / num_parts items per part, the first
// num_items % num_parts parts one more; with num_items <= num_parts, one item per part and
// empty parts at the end. num_items >= 0, num_parts >= 1.
StageBounds partition_uniform(int num_items, int num_parts);

// DeepSpeed's partition_balanced: its dynamic program over contiguous parts that keeps the
// spread (largest part's weight minus smallest's) small, ties going to the later split; with
// weights.size() <= num_parts, partition_uniform. Weights >= 0; summed exactly up to 2^53.
StageBounds partition_balanced(const std::vector<std::int64_t>& weights, int num_parts);

struct PartitionMethod {
  enum class Kind { Parameters, Uniform, Type };
  Kind kind = Kind::Parameters;
  std::string type_regex;  // Kind::Type only
  // "parameters", "uniform" (any case) or "type:REGEX"; throws ds::Error naming the value and
  // the choices, or the regex's error.
  static PartitionMethod parse(const std::string& text);
  std::string text() const;  // as parse() takes it
};

struct LayerInfo {
  std::string name;               // matched by type:REGEX (DeepSpeed: the layer's class name)
  std::int64_t parameters = 0;    // trainable parameters (elements)
};

// The stage boundaries of `layers` over `stages` stages. Throws ds::Error when there are more
// stages than layers, or (type:) when no layer name matches, naming the pattern.
StageBounds partition_layers(const std::vector<LayerInfo>& layers, int stages, const PartitionMethod& method);

}  // namespace ds::pipe

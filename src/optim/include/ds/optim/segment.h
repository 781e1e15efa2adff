// A parameter tensor's place within a flat range of elements (used by Lamb's per-tensor
// trust ratio). Light header: the kernels (CPU and CUDA) include only this.
#pragma once

#include <cstddef>

namespace ds::optim {

// One parameter tensor's elements within the flat range passed to a step. Only Lamb uses
// segments (its trust ratio is per segment); an empty list means one segment [0, n).
// Lamb leaves elements outside every segment untouched; segments must be sorted and disjoint.
struct Segment {
  std::size_t offset, count;
};

}  // namespace ds::optim

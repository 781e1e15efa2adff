// The checkpoint tests' Module: the shared test MLP (tests/common/test_mlp.h) with tanh,
// layers named l1 / l2 (the names the checkpoint scripts look for) and initial values on a
// 1/128 grid. The `extra` single-element tensors make parameters smaller than a ZeRO
// partition (straddling cases).
#pragma once

#include "../common/test_mlp.h"

namespace ds::io::test {

class CkptMlp : public ds::test::TestMlp {
 public:
  CkptMlp(int d, int h, int extra)
      : TestMlp(d, h, extra, {ds::test::MlpStyle::Act::Tanh, "l1", "l2", 128, 3}) {}
};

}  // namespace ds::io::test

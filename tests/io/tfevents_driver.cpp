// Writes a TensorBoard event file with ds::io::EventWriter for tfevents_check.py to read back
// with its own TFRecord/protobuf reader: tfevents_driver DIR STEPS.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "ds/io/tfevents.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: tfevents_driver DIR STEPS\n");
    return 2;
  }
  try {
    ds::io::EventWriter w(argv[1]);
    const int steps = std::atoi(argv[2]);
    for (int s = 1; s <= steps; ++s) {
      // Exactly representable values, so the reader can compare them for equality.
      w.add_scalars(s * 8, {{"Train/Samples/train_loss", 4.0f - 0.25f * float(s)},
                            {"Train/Samples/lr", 0.001953125f * float(s)}});
    }
    std::printf("%s\n", w.path().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tfevents_driver: %s\n", e.what());
    return 1;
  }
  return 0;
}

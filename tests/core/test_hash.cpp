// fnv1a64: FNV-1a's published 64-bit values, and chaining equals hashing the concatenation.
#include <gtest/gtest.h>

#include <string>

#include "ds/core/hash.h"

TEST(Hash, Fnv1a64KnownValues) {
  EXPECT_EQ(ds::fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(ds::fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(ds::fnv1a64("foobar"), 0x85944171f73967e8ull);
}

TEST(Hash, Fnv1a64ChainsLikeOneStream) {
  const std::string a = "layer.0.weight:", b = "768,768;";
  EXPECT_EQ(ds::fnv1a64(b, ds::fnv1a64(a)), ds::fnv1a64(a + b));
  EXPECT_NE(ds::fnv1a64(a), ds::fnv1a64(b));
}

// The helpers of the config parser's unit tests (test_parse.cpp, test_offload.cpp,
// test_extension_keys.cpp): a config text parsed as the file "ds.json", the message a text is
// refused with, and EXPECT_HAS for a message that must contain a piece.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ds/config/parse.h"
#include "ds/core/error.h"

#define EXPECT_HAS(hay, needle) EXPECT_NE(std::string(hay).find(needle), std::string::npos) << "in: " << (hay)

namespace config_test {

inline ds::config::DsConfig parse(const std::string& text, std::vector<std::string>* warnings = nullptr) {
  return ds::config::parse_config_text(text, "ds.json", warnings);
}

// The parser's message for text, or "<no error>" when it is accepted.
inline std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace config_test

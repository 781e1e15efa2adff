// Helpers the unit tests of file readers share: a temporary directory removed with its
// contents at scope exit, the text of the ds::Error a call throws, and a substring check.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <functional>
#include <string>
#include <system_error>

#include "ds/core/error.h"

// EXPECT_HAS(text, part): `part` occurs in `text` (printed when it does not).
#define EXPECT_HAS(hay, needle) EXPECT_NE(std::string(hay).find(needle), std::string::npos) << "in: " << (hay)

// A fresh directory under the system's temp directory, named PREFIX.XXXXXX.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix) {
    std::string t = (std::filesystem::temp_directory_path() / (prefix + ".XXXXXX")).string();
    if (::mkdtemp(t.data()) == nullptr) throw std::system_error(errno, std::generic_category(), "mkdtemp " + t);
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// What f throws as ds::Error, or "(no error)" when it returns.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Temporary file names unique to this process, so that concurrent test runs (ctest -j, a release
// and a sanitizer build at once) never share a file.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

namespace kvattn {

inline std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/" + std::to_string(getpid()) + "_" + name;
}

}  // namespace kvattn

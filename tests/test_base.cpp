#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "strata/base/error.h"
#include "strata/base/mapped_file.h"

using namespace strata;

TEST(MappedFile, MapsContentsExactly) {
  std::string path = testing::TempDir() + "/strata_mapped_file.bin";
  {
    std::ofstream out(path, std::ios::binary);
    out << "hello strata";
  }
  MappedFile mf = MappedFile::open(path);
  ASSERT_EQ(mf.size(), 12u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(mf.data()), mf.size()), "hello strata");
  std::remove(path.c_str());
}

TEST(MappedFile, MissingFileNamesThePath) {
  try {
    MappedFile::open("/nonexistent/strata/file.gguf");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/strata/file.gguf"), std::string::npos);
  }
}

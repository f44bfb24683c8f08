// Linked into every test binary: points testing::TempDir() at this build tree's scratch folder
// (FT_TEST_TMPDIR, tests/CMakeLists.txt says why) when it exists and the caller set no
// TEST_TMPDIR; a binary moved elsewhere (scripts/gpu_bundle.sh) keeps gtest's default. A static
// initialiser, so it runs before any test asks for TempDir(). (ctest's ENVIRONMENT cannot carry
// it: gtest_discover_tests splits a two-variable ENVIRONMENT into two properties.)
#include <sys/stat.h>

#include <cstdlib>

namespace {

const bool kTestTmpdirSet = [] {
  struct stat folder {};
  const bool usable = stat(FT_TEST_TMPDIR, &folder) == 0 && S_ISDIR(folder.st_mode);
  if (usable) setenv("TEST_TMPDIR", FT_TEST_TMPDIR, /*overwrite=*/0);
  return usable;
}();

}  // namespace

// The launch-count convention of core/cuda/cuda_check.h, checked on the source text (CPU only):
// every `<<<...>>>` kernel launch in a .cu/.cuh file of core, kernels, model, fusion, comm and
// app is followed by its own FT_CUDA_CHECK_LAUNCH() before the next launch or the end of the file.
// The macro counts one kernel per call (core/launch_counter.h), so a launch in an if/else whose
// branches share one check would make `fusiontrain bench` under-count launches per step.
// The scanner itself is tested on snippets first, so a tree that passes is not a scanner that
// sees nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace ft {
namespace {

constexpr const char* kLaunch = "<<<";
constexpr const char* kCheck = "FT_CUDA_CHECK_LAUNCH()";

// `text` with // and /* */ comments blanked (newlines kept, so line numbers stay), so a launch
// syntax quoted in a comment neither counts as a launch nor as its check.
std::string without_comments(const std::string& text) {
  std::string out = text;
  for (size_t i = 0; i + 1 < out.size(); ++i) {
    if (out[i] == '/' && out[i + 1] == '/') {
      for (; i < out.size() && out[i] != '\n'; ++i) out[i] = ' ';
    } else if (out[i] == '/' && out[i + 1] == '*') {
      const size_t end = out.find("*/", i + 2);
      const size_t stop = end == std::string::npos ? out.size() : end + 2;
      for (; i < stop; ++i)
        if (out[i] != '\n') out[i] = ' ';
      --i;
    }
  }
  return out;
}

size_t line_of(const std::string& text, size_t offset) {
  return 1 + static_cast<size_t>(std::count(text.begin(), text.begin() + offset, '\n'));
}

// "name:line" for every launch in `text` that has no check of its own before the next launch.
std::vector<std::string> unchecked_launches(const std::string& name, const std::string& text,
                                            size_t* launches = nullptr) {
  const std::string code = without_comments(text);
  std::vector<std::string> unchecked;
  size_t count = 0;
  for (size_t at = code.find(kLaunch); at != std::string::npos; ++count) {
    const size_t next = code.find(kLaunch, at + 3);
    const size_t check = code.find(kCheck, at + 3);
    if (check == std::string::npos || (next != std::string::npos && check > next))
      unchecked.push_back(name + ":" + std::to_string(line_of(code, at)));
    at = next;
  }
  if (launches != nullptr) *launches = count;
  return unchecked;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

TEST(LaunchCountScanner, AcceptsOneCheckPerLaunch) {
  const std::string text =
      "a_kernel<<<1, 2, 0, s>>>(x);\n"
      "FT_CUDA_CHECK_LAUNCH();\n"
      "if (f) {\n"
      "  b_kernel<true><<<1, 2, 0, s>>>(x);\n"
      "  FT_CUDA_CHECK_LAUNCH();\n"
      "} else {\n"
      "  b_kernel<false><<<1, 2, 0, s>>>(x);\n"
      "  FT_CUDA_CHECK_LAUNCH();\n"
      "}\n";
  size_t launches = 0;
  EXPECT_TRUE(unchecked_launches("ok.cu", text, &launches).empty());
  EXPECT_EQ(launches, 3u);
}

TEST(LaunchCountScanner, NamesLaunchesThatShareACheckOrHaveNone) {
  const std::string text =
      "if (f)\n"
      "  k<true><<<1, 2>>>(x);\n"
      "else\n"
      "  k<false><<<1, 2>>>(x);\n"
      "FT_CUDA_CHECK_LAUNCH();\n"
      "last<<<1, 2>>>(x);\n";
  EXPECT_EQ(unchecked_launches("bad.cu", text), (std::vector<std::string>{"bad.cu:2", "bad.cu:6"}));
}

TEST(LaunchCountScanner, IgnoresCommentsOnBothSides) {
  // A check that is only commented out does not count, nor does a launch quoted in a comment.
  const std::string text =
      "// k<<<blocks, threads>>>(x) is how a launch reads\n"
      "k<<<1, 2>>>(x);\n"
      "/* FT_CUDA_CHECK_LAUNCH(); */\n"
      "other<<<1, 2>>>(x);  // FT_CUDA_CHECK_LAUNCH();\n"
      "FT_CUDA_CHECK_LAUNCH();\n";
  EXPECT_EQ(unchecked_launches("c.cu", text), (std::vector<std::string>{"c.cu:2"}));
}

TEST(LaunchCountConvention, EveryLaunchInTheTreeHasItsOwnCheck) {
  const std::filesystem::path root = FT_SOURCE_DIR;
  std::vector<std::string> unchecked;
  size_t files = 0, launches = 0;
  for (const char* folder : {"core", "kernels", "model", "fusion", "comm", "app"}) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root / folder)) {
      const std::string extension = entry.path().extension().string();
      if (!entry.is_regular_file() || (extension != ".cu" && extension != ".cuh")) continue;
      size_t in_file = 0;
      const std::string name = std::filesystem::relative(entry.path(), root).string();
      for (std::string& where : unchecked_launches(name, read_file(entry.path()), &in_file))
        unchecked.push_back(std::move(where));
      ++files;
      launches += in_file;
    }
  }
  // The tree has dozens of launches in about twenty .cu files; far fewer means a wrong root.
  EXPECT_GE(files, 15u) << "under " << root;
  EXPECT_GE(launches, 50u) << "under " << root;
  std::string listed;
  for (const std::string& where : unchecked) listed += "\n  " + where;
  EXPECT_TRUE(unchecked.empty())
      << unchecked.size() << " kernel launch(es) lack their own " << kCheck
      << " before the next launch, so `fusiontrain bench` would not count them:" << listed;
}

}  // namespace
}  // namespace ft

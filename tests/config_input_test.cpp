// Config input that once hung or exhausted memory: texts on which yaml-cpp 0.7's LoadAll never
// ends (a stray ',', '!' or '&a ' where a value should start, alone or after a first document,
// with a NUL before it), a FIFO as --config, and a device file. Each must be refused at once with
// the file, the line and what to do; the texts run on a thread, so a hang fails the test after
// 10 s instead of stalling the suite (a parse that grows without bound is the fuzzer's to catch).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <string>
#include <thread>

#include "app/config/config.h"
#include "app/config/yaml_documents.h"
#include "config_test_util.h"
#include "fifo_test_util.h"
#include "tests/run_command.h"

namespace ft {
namespace {

using config_test::parse_error;

// parse_error on a thread, bounded: "<hung>" when it does not return within 10 s.
std::string bounded_parse_error(const std::string& text) {
  auto result = std::async(std::launch::async, [text] { return parse_error(text); });
  if (result.wait_for(std::chrono::seconds(10)) == std::future_status::timeout) {
    ADD_FAILURE() << "parsing hung";
    std::_Exit(1);  // the thread cannot be stopped; leaving it would hang the suite
  }
  return result.get();
}

TEST(ConfigInput, TokensThatBeginNoValueAreRefusedWithTheirLine) {
  struct Case {
    std::string text;
    std::string where;
  };
  const Case cases[] = {{",", "test.yaml:1:1"},
                        {std::string("\0,", 2), "test.yaml:1:"},
                        {"!,", "test.yaml:1:"},
                        {"&a ,", "test.yaml:1:"},
                        {"a: 1\n---\n,", "test.yaml:3:1"},
                        {"train:\n  steps: 3\n---\n!,", "test.yaml:4:"}};
  for (const Case& c : cases) {
    const std::string message = bounded_parse_error(c.text);
    EXPECT_EQ(message.rfind(c.where, 0), 0u) << message;
    EXPECT_NE(message.find("YAML syntax error: this token begins no value"), std::string::npos)
        << message;
  }
}

TEST(ConfigInput, ManyDocumentsAreCountedUpToABound) {
  EXPECT_EQ(scan_yaml_documents("a: 1\n---\nb: 2\n").count, 2);
  std::string many;
  for (int i = 0; i < 100; ++i) many += "a: 1\n---\n";
  const YamlDocuments capped = scan_yaml_documents(many, 64);
  EXPECT_EQ(capped.count, 64);
  EXPECT_TRUE(capped.capped);
  EXPECT_FALSE(capped.stuck);
  const std::string message = bounded_parse_error(many);
  EXPECT_NE(message.find("test.yaml:2:1: expected one YAML document, found more than 64"),
            std::string::npos)
      << message;
  EXPECT_FALSE(scan_yaml_documents("train:\n  steps: 3\n").stuck);
}

// A NUL byte would cut every path at it: refused in YAML escapes and in --set alike.
TEST(ConfigInput, StringsWithANulByteAreRefused) {
  EXPECT_NE(parse_error("train:\n  run_dir: \"runs/a\\0b\"\n").find("holding a NUL byte"),
            std::string::npos);
  EXPECT_NE(parse_error("data:\n  path: \"data/moby_dick.txt\\x00.ignored\"\n").find("NUL byte"),
            std::string::npos);
  EXPECT_NE(
      parse_error("model: {arch: gpt}\n", {std::string("train.run_dir=a\0b", 17)}).find("NUL byte"),
      std::string::npos);
}

TEST(ConfigInput, AFifoIsRefusedAtOnce) {
  const std::string fifo = testing::TempDir() + "/config_fifo_" + std::to_string(::getpid());
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string message = fifo_test::error_reading_fifo(fifo, [&] { load_config(fifo, {}); });
  ::unlink(fifo.c_str());
  EXPECT_NE(message.find(fifo + ": is a pipe, not a config file"), std::string::npos) << message;
}

TEST(ConfigInput, ADeviceIsRefused) {
  const std::string message = config_test::error_of([] { load_config("/dev/zero", {}); });
  EXPECT_NE(message.find("/dev/zero: is a character device, not a config file"), std::string::npos)
      << message;
}

// A corpus too small for any data.val_fraction says so, instead of asking for a fraction above
// the key's maximum of 0.5.
TEST(ConfigInput, ACorpusTooSmallForAnyValidationSplitSaysSo) {
  const std::string corpus = testing::TempDir() + "/tiny_corpus_" + std::to_string(::getpid());
  {
    std::FILE* file = std::fopen(corpus.c_str(), "w");
    ASSERT_NE(file, nullptr);
    for (int i = 0; i < 100; ++i) std::fputc('a' + i % 26, file);
    std::fclose(file);
  }
  const test::RunResult result = test::run_fusiontrain(
      "train --set data.path=" + corpus + " --set train.run_dir=" + corpus + "_run", 60);
  ::unlink(corpus.c_str());
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find(corpus + " holds 100 bytes, too few for model.seq_len = 64"),
            std::string::npos)
      << result.output;
  EXPECT_EQ(result.output.find("raise data.val_fraction"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace ft

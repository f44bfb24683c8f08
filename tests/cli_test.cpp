// The binary's handling of bad input: every case exits non-zero with a message that names the
// file, line, key or allowed values — never a crash, a hang or a silent default.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "run_command.h"

namespace {

using ft::test::RunResult;

// Runs `prefix fusiontrain args` from the source directory, with a hard timeout so a hang fails.
RunResult run_command(const std::string& prefix, const std::string& args) {
  return ft::test::run_fusiontrain(args, 60, prefix);
}

RunResult run(const std::string& args) {
  return run_command("", args);
}

std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Two steps of a one-layer GPT: a checkpoint in well under a second.
const std::string kTinyTrain =
    "train --set model.n_layer=1 --set model.d_model=16 --set model.n_head=2 --set train.steps=2 "
    "--set train.eval_every=0 --set train.batch_size=2 --set train.overwrite=true ";

void expect_error(const RunResult& result, const std::string& needle) {
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.exit_code, 124) << "timed out: " << result.output;
  EXPECT_LT(result.exit_code, 128) << "crashed: " << result.output;
  EXPECT_NE(result.output.find(needle), std::string::npos)
      << "expected '" << needle << "' in: " << result.output;
}

TEST(Cli, UnknownConfigKeyNamesFileLineAndSuggestion) {
  const std::string path = temp_file("bad_key.yaml", "model:\n  arch: gpt\n  n_layr: 4\n");
  const RunResult result = run("train --config " + path);
  expect_error(result, path + ":3:3: unknown key 'n_layr'");
  expect_error(result, "did you mean 'n_layer'");
}

TEST(Cli, BadValueNamesAllowedRange) {
  expect_error(run("train --set model.n_layer=0"), "model.n_layer");
  expect_error(run("train --set optim.name=adam"), "adamw, sgd");
  expect_error(run("train --set model.n_head=3"), "divisible");
}

TEST(Cli, MissingAndEmptyConfigFiles) {
  expect_error(run("train --config /nonexistent/x.yaml"), "/nonexistent/x.yaml");
  expect_error(run("train --config " + temp_file("empty.yaml", "# nothing\n")), "empty");
}

TEST(Cli, UnknownFlagAndMissingJob) {
  expect_error(run("train --bogus"), "--bogus");
  expect_error(run(""), "subcommand");
}

TEST(Cli, CorruptCheckpointIsAClearError) {
  const std::string path = temp_file("corrupt.safetensors",
                                     std::string("\x10\x00\x00\x00\x00\x00\x00\x00{not json}", 18));
  expect_error(run("eval --checkpoint " + path), path);
  expect_error(run("eval --checkpoint /nonexistent.safetensors"), "/nonexistent.safetensors");
}

// Two ranks launched MPMD-style with different batch sizes: every rank must stop with an error
// that names the differing key, quickly, instead of hanging in a collective.
TEST(Cli, MismatchedConfigAcrossRanksFailsFast) {
  const std::string mpirun =
      "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 1 ";
  const RunResult result =
      run_command(mpirun, "train --set train.steps=30 : -np 1 " + std::string(FT_BINARY) +
                              " train --set train.steps=30 --set train.batch_size=16");
  expect_error(result, "train.batch_size");
  expect_error(result, "differs across ranks");
}

// A process that no MPI launcher started never initialises MPI, so a machine with the library
// but no working runtime (Open MPI's singleton start cannot fork its daemon: here, no rsh agent)
// still trains, plans and infers; bandwidth, which measures MPI, still needs it.
TEST(Cli, JobsRunWithoutAnMpiRuntimeWhenNotLaunchedByMpirun) {
  const std::string no_runtime = "env OMPI_MCA_plm_rsh_agent=/nonexistent/ssh ";
  const RunResult train = ft::test::run_fusiontrain(
      "train --set model.n_layer=1 --set model.d_model=16 --set model.n_head=2 "
      "--set train.steps=2 --set train.eval_every=0 --set train.batch_size=2 "
      "--set train.run_dir=" +
          ::testing::TempDir() + "/no_mpi_run --set train.overwrite=true",
      120, no_runtime);
  EXPECT_EQ(train.exit_code, 0) << train.output;
  EXPECT_NE(train.output.find("done: 2 steps"), std::string::npos) << train.output;
  const RunResult bandwidth =
      ft::test::run_fusiontrain("bandwidth --max-bytes 1024", 60, no_runtime);
  EXPECT_NE(bandwidth.exit_code, 0) << "bandwidth initialises MPI, which cannot start here:\n"
                                    << bandwidth.output;
}

// A usage error: CLI11's own or ours, in the project's "error: ..." form, exit 2.
void expect_usage_error(const RunResult& result, const std::string& needle) {
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_EQ(result.output.rfind("error: ", 0), 0u) << result.output;
  EXPECT_NE(result.output.find(needle), std::string::npos)
      << "expected '" << needle << "' in: " << result.output;
}

TEST(Cli, ParseErrorsAreUsageErrorsNamingTheFlagAndTheJobHelp) {
  const std::pair<const char*, const char*> cases[] = {
      {"plan --batch abc",
       "error: --batch: 'abc' is not an integer (run 'fusiontrain plan --help')"},
      {"plan --batch 99999999999", "--batch: '99999999999' is out of range"},
      {"plan --batch 010", "--batch: '010' is not a decimal integer"},  // base 0 would read 8
      {"plan --batch 0x10", "--batch: '0x10' is not a decimal integer"},
      {"sample --checkpoint x --max-new-tokens 1e3", "'1e3' is not a decimal integer"},
      {"simulate --compute-scale fast", "--compute-scale: 'fast' is not a number"},
      {"eval", "error: --checkpoint is required (run 'fusiontrain eval --help')"},
      {"bench --steps 0", "--steps: expected an integer in [1, 100000], got '0'"},
      {"bench --steps 2147483647", "--steps: expected an integer in [1, 100000], got '2147483647'"},
      {"bench --warmup 99999", "--warmup: expected an integer in [0, 10000], got '99999'"},
      {"bandwidth --iters 2147483647", "--iters: expected an integer in [1, 100000]"},
      {"bench --peak-tflops 1e-300", "--peak-tflops: expected 0 (off) or a number in [0.001, "},
      {"bandwidth --peak-gbps 1e-300", "--peak-gbps: expected 0 (off) or a number in [0.001, "},
      {"sample --checkpoint x --top-k -1", "--top-k: must be non-negative (>= 0), got '-1'"},
      {"bandwidth --peak-gbps inf",
       "--peak-gbps: expected 0 (off) or a number in [0.001, 1e+06], "
       "got 'inf'"},
      {"train --bogus", "(run 'fusiontrain train --help')"},
      {"", "(run 'fusiontrain --help')"}};
  for (const auto& [args, needle] : cases) expect_usage_error(run(args), needle);
  const RunResult help = run("plan --help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_NE(help.output.find("--batch"), std::string::npos) << help.output;
}

// A config key given as a flag, or to --set with its value as a word of its own, is a usage
// error that spells out the --set key=value to write.
TEST(Cli, ConfigKeysOutsideSetSpellTheirSet) {
  const std::pair<const char*, const char*> cases[] = {
      {"train --set train.steps 10",
       "error: --set 'train.steps' has no value: --set takes one word, key=value; write --set "
       "train.steps=10 (run 'fusiontrain train --help')"},
      {"train --set model.n_layer=2 --set train.steps", "write --set train.steps=VALUE"},
      {"train --steps 10",
       "error: unknown flag '--steps' for train; config keys take --set: --set train.steps=10; "
       "its flags: "},
      {"train --steps=7", "--set train.steps=7;"},
      {"eval --checkpoint x.safetensors --lr 0.5", "--set optim.lr=0.5;"},
      {"train --batch_size --json x", "--set train.batch_size=VALUE;"}};
  for (const auto& [args, needle] : cases) expect_usage_error(run(args), needle);
  // Not a key's last part: the closest flag, and no --set.
  const RunResult typo = run("train --jsn x");
  expect_usage_error(typo, "unknown flag '--jsn' for train (did you mean '--json'?)");
  EXPECT_EQ(typo.output.find("--set train"), std::string::npos) << typo.output;
}

// An empty path or list is refused instead of falling back to the default (or to nothing).
TEST(Cli, EmptyFlagValuesAreRefused) {
  for (const char* args :
       {"bench --variants ''", "bench --sweep ''", "bench --trace ''", "plan --json ''",
        "simulate --ranks ''", "simulate --link ''", "tune --out ''", "eval --checkpoint ''",
        "eval --checkpoint c --data ''", "infer --model ''", "infer --model m --labels ''",
        "infer --model m --compare-unfolded ''", "export --checkpoint c --out ''",
        "sample --checkpoint ''", "train --config ''", "train --set ''"}) {
    const RunResult result = run(args);
    const std::string flag = std::string(args).substr(std::string(args).rfind(" --") + 1);
    expect_usage_error(result, flag.substr(0, flag.find(' ')) + ": must not be empty (");
  }
}

// libgomp crashed (or printed its own error) on a huge --threads; it takes train.threads' range,
// checked before the model is read (so a missing one shows the order).
TEST(Cli, InferThreadsTakeTheRangeOfTrainThreads) {
  for (const char* threads : {"100000", "50000", "257", "-1"}) {
    const RunResult result =
        run("infer --model /nonexistent.safetensors --limit 8 --threads " + std::string(threads));
    expect_error(result, "--threads");
  }
  expect_error(run("infer --model /nonexistent.safetensors --threads 100000"),
               "--threads: expected an integer in [0, 256], got 100000 (the range of "
               "train.threads)");
  // 256 passes: the error is the missing model's.
  expect_error(run("infer --model /nonexistent.safetensors --threads 256"),
               "/nonexistent.safetensors");
}

// A bad flag exits 2 whether CLI11 refuses it or the job does (once 1 for `--mode infer` and 2
// for `--mode ''`); every other error exits 1.
TEST(Cli, EveryUsageErrorExitsTwo) {
  for (const char* args :
       {"plan --mode infer", "plan --mode ''", "plan --batch 0", "bench --variants turbo",
        "bench --sweep fusion.max_ops", "simulate --ranks 8,8"}) {
    const RunResult result = run(args);
    EXPECT_EQ(result.exit_code, 2) << args << ": " << result.output;
  }
  EXPECT_EQ(run("plan --config /nonexistent.yaml").exit_code, 1);
}

TEST(Cli, FlagsTakeTheRangesOfTheirConfigKeys) {
  expect_error(run("plan --batch 2147483647"),
               "--batch: expected an integer in [1, 65536], got 2147483647 (the range of "
               "train.batch_size)");
  // infer's --batch has its own range, not train.batch_size's.
  const RunResult infer_batch = run("infer --model /nonexistent.safetensors --batch 70000");
  expect_error(infer_batch, "--batch: expected an integer in [1, 65536], got '70000'");
  EXPECT_EQ(infer_batch.output.find("train.batch_size"), std::string::npos) << infer_batch.output;
  // With --config the flags are checked before the checkpoint is read.
  const std::string sample =
      "sample --checkpoint /nonexistent.safetensors --config configs/gpt_tiny.yaml ";
  // The ranges themselves are the schema's (app/config/config_fields.cpp).
  const RunResult hot = run(sample + "--temperature 1e30");
  expect_error(hot, "--temperature: expected a number in ");
  expect_error(hot, "got 1e+30 (the range of inference.temperature)");
  expect_error(run(sample + "--temperature 1e-50"), "1e-50 rounds to 0 as a float");
  expect_error(run(sample + "--max-new-tokens 2000000"),
               "got 2000000 (the range of inference.max_new_tokens)");
  // Greedy sampling is the flag's own 0; the checkpoint is then the next thing to fail.
  expect_error(run(sample + "--temperature 0"), "/nonexistent.safetensors");
}

TEST(Cli, SimulateRefusesNonFiniteAndAbsurdValues) {
  const std::pair<const char*, const char*> cases[] = {
      {"simulate --link 5,inf", "beta (GB/s) 'inf' must be a number in [0.001, 10000]"},
      {"simulate --link 1e9,5", "alpha (us) '1e9' must be a number in [0, 1000000]"},
      {"simulate --compute-scale inf",
       "--compute-scale must be a number in [0.001, 1000], got inf"},
      {"simulate --compute-scale 1e-300", "got 1e-300"},
      {"simulate --ranks 8,64,8", "--ranks '8,64,8': 8 is given twice"},
      {"simulate --ranks 8,2000000", "rank counts in [1, 1000000]"},
      {"bench --peak-tflops inf", "--peak-tflops: expected 0 (off) or a number in [0.001, "}};
  for (const auto& [args, needle] : cases) expect_error(run(args), needle);
}

// The export must not replace the checkpoint it reads, however the two paths are spelled.
TEST(Cli, ExportRefusesToWriteOverItsCheckpoint) {
  const std::string dir = ::testing::TempDir() + "/export_self";
  const RunResult train = run(kTinyTrain + "--set train.run_dir=" + dir);
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const std::string checkpoint = dir + "/checkpoints/step_000002.safetensors";
  const std::string before = read_text(checkpoint);
  const std::string link = dir + "/link.safetensors";
  std::remove(link.c_str());
  ASSERT_EQ(symlink(checkpoint.c_str(), link.c_str()), 0);
  for (const std::string& out : {checkpoint, dir + "/./checkpoints/step_000002.safetensors", link})
    expect_error(run("export --checkpoint " + checkpoint + " --out " + out),
                 "--out '" + out + "' is the --checkpoint file");
  EXPECT_EQ(read_text(checkpoint), before);
}

// Each job checks its outputs before any work, instead of failing to write them at the end.
TEST(Cli, UnwritableOutputsAreRefusedBeforeAnyWork) {
  for (const char* job :
       {"plan", "eval --checkpoint /nonexistent.safetensors",
        "sample --checkpoint /nonexistent.safetensors", "infer --model /nonexistent.safetensors",
        "simulate", "tune", "bench", "train", "bandwidth"})
    expect_error(run(std::string(job) + " --json /proc/x.json"),
                 "--json '/proc/x.json': cannot create files in directory '/proc'");
  expect_error(run("bench --trace /proc/x/trace.json"), "--trace '/proc/x/trace.json'");
  expect_error(run("tune --out /proc/x/tuned.yaml"), "--out '/proc/x/tuned.yaml'");
  expect_error(run("export --checkpoint /nonexistent.safetensors --out /proc/x.safetensors"),
               "--out '/proc/x.safetensors'");
  expect_error(run("plan --json " + ::testing::TempDir()), "is a directory");
  // One rule for every job's outputs: missing folders are created (plan, train, eval, sample and
  // infer once refused them while bench, tune and export created them).
  const std::string folder = ::testing::TempDir() + "/missing_" + std::to_string(::getpid());
  std::filesystem::remove_all(folder);
  // infer gets past the output check and fails on its model, the first thing it reads.
  expect_error(run("infer --model /nonexistent.safetensors --json " + folder + "/a/b.json"),
               "/nonexistent.safetensors");
  const RunResult planned = run("plan --json " + folder + "/a/plan.json");
  EXPECT_EQ(planned.exit_code, 0) << planned.output;
  EXPECT_TRUE(std::filesystem::exists(folder + "/a/plan.json"));
  std::filesystem::remove_all(folder);
  const std::string file = temp_file("not_a_dir", "");
  expect_error(run("bench --trace " + file + "/trace.json"), "'" + file + "' is not a directory");
}

TEST(Cli, TrainChecksItsDirectoriesAndTraceBeforeTheFirstStep) {
  const std::string train =
      kTinyTrain + "--set train.run_dir=" + ::testing::TempDir() + "/checked_run ";
  const std::string file = temp_file("checkpoint_dir_file", "");
  const std::pair<std::string, std::string> cases[] = {
      {"train.checkpoint_dir=" + file,
       "train.checkpoint_dir '" + file + "' exists and is not a directory"},
      {"train.run_dir=" + file, "train.run_dir '" + file + "' exists and is not a directory"},
      {"train.trace=/proc/nope.json", "train.trace '/proc/nope.json': cannot create files"}};
  for (const auto& [setting, needle] : cases) {
    const RunResult result = run(train + "--set " + setting);
    expect_error(result, needle);
    EXPECT_EQ(result.output.find("step 1/2"), std::string::npos) << result.output;
  }
}

// eval runs in the config's train.precision, and a bf16 evaluation says so (with what this CPU
// runs it on) in its line and its JSON, as train's start line does; fp32 stays quiet.
TEST(Cli, EvalSaysWhenItRunsInBf16) {
  const std::string dir = ::testing::TempDir() + "/eval_precision";
  const RunResult trained = run(kTinyTrain + "--set train.run_dir=" + dir);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::string eval = "eval --config " + dir + "/config.yaml --checkpoint " + dir +
                           "/checkpoints/step_000002.safetensors --json " + dir + "/eval.json ";
  const RunResult bf16 = run(eval + "--set train.precision=bf16");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  EXPECT_NE(bf16.output.find(" windows) | precision bf16, "), std::string::npos) << bf16.output;
  EXPECT_NE(read_text(dir + "/eval.json").find("\"precision\":\"bf16\""), std::string::npos);
  const RunResult fp32 = run(eval + "--set train.precision=fp32");
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  EXPECT_EQ(fp32.output.find("| precision"), std::string::npos) << fp32.output;
  EXPECT_NE(read_text(dir + "/eval.json").find("\"precision\":\"fp32\""), std::string::npos);
}

// FT_CPU_ISA (model/ops/winograd.h) picks the Winograd kernels' width; a value the kernels do
// not have stops the first convolution with an error naming the variable and the choices. One
// ResNet step, whose convolutions run on Winograd; avx2 exists everywhere and trains.
TEST(Cli, UnknownCpuIsaIsAnErrorNamingTheVariable) {
  const std::string resnet_train =
      "train --config configs/resnet8.yaml --set train.steps=1 --set optim.warmup_steps=0 "
      "--set train.batch_size=2 "
      "--set train.eval_every=0 --set train.overwrite=true --set train.run_dir=" +
      ::testing::TempDir() + "/isa_run";
  expect_error(run_command("env FT_CPU_ISA=sse4 ", resnet_train),
               "environment variable FT_CPU_ISA=sse4 is not one of: avx2, avx512");
  const RunResult avx2 = run_command("env FT_CPU_ISA=avx2 ", resnet_train);
  EXPECT_EQ(avx2.exit_code, 0) << avx2.output;
}

}  // namespace

// How busy the machine was around a `bench` or `tune` run, so a table measured on a loaded
// machine says so. Two readings, one before the timed work and one after:
//   - the 1-minute load average (/proc/loadavg), and
//   - the CPU time every process used (/proc/stat's busy jiffies) minus this process's own
//     (utime + stime of /proc/self/stat, every thread), the difference being other processes'.
// The rule (machine_load_between): the machine is busy when
//   - the load average at the start, before this run adds its own threads, exceeds the CPUs this
//     process may use (sched_getaffinity) minus 0.5 (kMachineBusyLoadMargin), or
//   - other processes used more than 10% (kMachineBusyOtherShare) of the machine's CPU time
//     between the two readings.
// The load at the end counts this run's own threads, so it is reported but not judged. Under
// mpirun the other ranks on the same machine count as other processes.
// The files come from /proc, or from the directory $FT_MACHINE_LOAD_DIR names (files loadavg,
// stat and self_stat, laid out as in /proc), so a test can fake a busy machine.
// Thread safety: pure functions apart from the file reads, which touch no shared state.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace ft {

constexpr double kMachineBusyLoadMargin = 0.5;
constexpr double kMachineBusyOtherShare = 0.10;

// Where the readings come from.
struct MachineLoadPaths {
  std::string loadavg = "/proc/loadavg";
  std::string stat = "/proc/stat";
  std::string self_stat = "/proc/self/stat";
};
// /proc, or $FT_MACHINE_LOAD_DIR/{loadavg,stat,self_stat} when that variable is set.
MachineLoadPaths machine_load_paths();

// One reading. ok is false when a file was missing or unreadable (not Linux): no judgement then.
struct MachineLoadSample {
  bool ok = false;
  double load1 = 0;          // 1-minute load average
  double total_jiffies = 0;  // every CPU, every state
  double busy_jiffies = 0;   // every CPU, all but idle and iowait
  double self_jiffies = 0;   // this process: utime + stime
};
MachineLoadSample read_machine_load(const MachineLoadPaths& paths);

// CPUs this process may run on (its affinity mask); at least 1.
int machine_load_usable_cpus();

// The two readings judged by the rule above.
struct MachineLoad {
  bool measured = false;  // both readings ok
  double load_start = 0, load_end = 0;
  int cpus = 1;
  double other_share = 0;  // of the machine's CPU time between the readings, 0..1
  bool busy = false;
};
MachineLoad machine_load_between(const MachineLoadSample& start, const MachineLoadSample& end,
                                 int cpus);

// "warning: machine busy: load average X at start, Y at end on N CPUs; other processes used Z%
// of the CPUs: spreads widen, compare only within this run" (no newline); empty when not busy.
std::string machine_load_warning(const MachineLoad& load);
// {measured, busy, load_average_start, load_average_end, cpus, other_cpu_share, rule}.
nlohmann::json machine_load_json(const MachineLoad& load);

// Takes the start reading on construction; finish() takes the end reading and judges.
class MachineLoadWatch {
 public:
  MachineLoadWatch() : paths_(machine_load_paths()), start_(read_machine_load(paths_)) {}
  MachineLoad finish() const {
    return machine_load_between(start_, read_machine_load(paths_), machine_load_usable_cpus());
  }

 private:
  MachineLoadPaths paths_;
  MachineLoadSample start_;
};

}  // namespace ft

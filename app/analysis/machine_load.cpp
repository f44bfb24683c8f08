#include "app/analysis/machine_load.h"

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace ft {

MachineLoadPaths machine_load_paths() {
  MachineLoadPaths paths;
  const char* dir = std::getenv("FT_MACHINE_LOAD_DIR");
  if (dir == nullptr || *dir == '\0') return paths;
  const std::string base(dir);
  paths.loadavg = base + "/loadavg";
  paths.stat = base + "/stat";
  paths.self_stat = base + "/self_stat";
  return paths;
}

MachineLoadSample read_machine_load(const MachineLoadPaths& paths) {
  MachineLoadSample sample;
  std::ifstream loadavg(paths.loadavg);
  if (!(loadavg >> sample.load1)) return sample;

  // "cpu  user nice system idle iowait irq softirq steal guest guest_nice"; guest time is
  // already inside user and nice.
  std::ifstream stat(paths.stat);
  std::string label;
  double fields[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (!(stat >> label) || label != "cpu") return sample;
  for (int i = 0; i < 8; ++i)
    if (!(stat >> fields[i])) {
      if (i < 4) return sample;
      break;
    }
  const double idle = fields[3] + fields[4];
  sample.busy_jiffies = fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7];
  sample.total_jiffies = sample.busy_jiffies + idle;

  // "pid (comm) state ppid ...": utime and stime are fields 14 and 15, the 12th and 13th after
  // the ')' that ends comm (which may itself hold spaces and parentheses).
  std::ifstream self(paths.self_stat);
  std::stringstream text;
  text << self.rdbuf();
  const std::string line = text.str();
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return sample;
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15; ++i) {
    if (!(rest >> field)) return sample;
    if (i == 14) utime = std::atof(field.c_str());
    if (i == 15) stime = std::atof(field.c_str());
  }
  sample.self_jiffies = utime + stime;
  sample.ok = true;
  return sample;
}

int machine_load_usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

MachineLoad machine_load_between(const MachineLoadSample& start, const MachineLoadSample& end,
                                 int cpus) {
  MachineLoad load;
  load.cpus = std::max(1, cpus);
  if (!start.ok || !end.ok) return load;
  load.measured = true;
  load.load_start = start.load1;
  load.load_end = end.load1;
  const double total = end.total_jiffies - start.total_jiffies;
  const double others =
      (end.busy_jiffies - start.busy_jiffies) - (end.self_jiffies - start.self_jiffies);
  load.other_share = total > 0 ? std::clamp(others / total, 0.0, 1.0) : 0.0;
  load.busy = load.load_start > load.cpus - kMachineBusyLoadMargin ||
              load.other_share > kMachineBusyOtherShare;
  return load;
}

std::string machine_load_warning(const MachineLoad& load) {
  if (!load.busy) return "";
  char text[256];
  std::snprintf(text, sizeof(text),
                "warning: machine busy: load average %.2f at start, %.2f at end on %d CPUs; "
                "other processes used %.0f%% of the CPUs: spreads widen, compare only within "
                "this run",
                load.load_start, load.load_end, load.cpus, 100 * load.other_share);
  return text;
}

nlohmann::json machine_load_json(const MachineLoad& load) {
  char rule[160];
  std::snprintf(rule, sizeof(rule),
                "busy when the load average at start > cpus - %.1f or other processes used > "
                "%.0f%% of the CPUs",
                kMachineBusyLoadMargin, 100 * kMachineBusyOtherShare);
  return {{"measured", load.measured},
          {"busy", load.busy},
          {"load_average_start", load.load_start},
          {"load_average_end", load.load_end},
          {"cpus", load.cpus},
          {"other_cpu_share", load.other_share},
          {"rule", rule}};
}

}  // namespace ft

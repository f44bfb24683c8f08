#include "app/jobs/bandwidth.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "app/training/device_setup.h"
#include "comm/backend_choice.h"
#include "core/atomic_file.h"
#include "core/check.h"
#include "core/timer.h"

namespace ft {
namespace {

constexpr int64_t kMiB = 1 << 20;
constexpr int64_t kFullItersUpTo = 16 * kMiB;  // bigger messages get fewer iterations
constexpr int kFusedMessages = 4;
constexpr int64_t kFusedSizes[] = {1 * kMiB, 8 * kMiB, 128 * kMiB};

struct Repeats {
  int warmup = 0;
  int iters = 0;
};

// Keeps the default sweep near a minute on two ranks of a small machine: large messages are
// already stable after a few repetitions.
Repeats repeats_for(const BandwidthArgs& args, int64_t bytes) {
  if (bytes <= kFullItersUpTo) return {args.warmup, args.iters};
  const int64_t scaled = args.iters * kFullItersUpTo / bytes;
  return {std::min(args.warmup, 1), static_cast<int>(std::max<int64_t>(2, scaled))};
}

// Mean over ranks of a per-rank time, so one rank's scheduling hiccup does not dominate.
double mean_over_ranks(Communicator& comm, double value) {
  float mean = static_cast<float>(value);
  comm.allreduce(&mean, 1, ReduceOp::kAverage);
  return mean;
}

// nccl-tests' definition. One rank moves nothing between ranks (NCCL's allreduce is then a local
// copy), so its busbw would be 0: utilization uses algbw there, and the header says so.
double bus_factor(int ranks) {
  return ranks == 1 ? 1.0 : 2.0 * (ranks - 1) / ranks;
}

// 64 MiB is past any last-level cache, so this is DRAM bandwidth whatever the sweep's sizes.
double measure_peak_gbps(Communicator& comm) {
  const size_t bytes = static_cast<size_t>(64 * kMiB);
  std::vector<char> source(bytes, 1), target(bytes, 0);
  std::memcpy(target.data(), source.data(), bytes);  // touch every page before timing
  double best_ms = 1e30;
  for (int repeat = 0; repeat < 3; ++repeat) {
    comm.barrier();
    const double start = now_ms();
    std::memcpy(target.data(), source.data(), bytes);
    best_ms = std::min(best_ms, now_ms() - start);
  }
  FT_CHECK(target[bytes - 1] == 1, "memcpy check failed");
  return mean_over_ranks(comm, bytes / (best_ms * 1e-3) / 1e9);
}

// The elements the timed collectives reduce, where the backend reads them: host memory (mpi),
// device memory (nccl), or device memory staged through pinned host memory around each MPI
// allreduce (mpi with --device cuda), which is what GradSync does for ranks sharing a GPU. bf16
// elements live two to a float of the same tensors: the backends only move and add their bits.
class SweepBuffer {
 public:
  SweepBuffer(Communicator& comm, Device device, CommDtype dtype, int64_t floats)
      : comm_(comm), dtype_(dtype) {
    data_ = Tensor::zeros({floats}, device);
    if (device == Device::kCuda && comm.buffer_device() == Device::kCpu)
      staging_ = Tensor::empty_pinned({floats});
  }
  // Elements [offset, offset + count), in the buffer's dtype.
  void allreduce(int64_t offset, int64_t count, Summation summation) {
    const bool bf16 = dtype_ == CommDtype::kBf16;
    // The floats that hold those elements (bf16: the halves next to them ride along unchanged).
    const int64_t lo = bf16 ? offset / 2 : offset,
                  hi = bf16 ? (offset + count + 1) / 2 : lo + count;
    Tensor slice = data_.rows(lo, hi);
    const bool staged = staging_.defined() && staging_.numel() > 0;
    Tensor target = staged ? staging_.rows(lo, hi) : slice;
    if (staged) target.copy_from(slice);
    const AllreduceOptions options{ReduceOp::kSum, summation};
    if (bf16) {
      bf16_bits* elements = reinterpret_cast<bf16_bits*>(target.data()) + offset % 2;
      comm_.allreduce_bf16(elements, static_cast<size_t>(count), options);
    } else {
      comm_.allreduce(target.data(), static_cast<size_t>(count), options);
    }
    if (staged) slice.copy_from(target);
  }
  // Fills with rank + 1, reduces once and checks a few elements: each is n(n+1)/2 (exact in bf16
  // too up to 22 ranks, whose partial sums are integers up to 256).
  void check(int rank, int ranks, int64_t count, Summation summation) {
    const bool bf16 = dtype_ == CommDtype::kBf16;
    const float value = static_cast<float>(rank + 1);
    const uint32_t half = float_to_bf16(value);
    const int64_t floats = bf16 ? (count + 1) / 2 : count;
    data_.rows(0, floats).fill(bf16 ? float_from_bits(half << 16 | half) : value);
    allreduce(0, count, summation);
    const std::vector<float> host = data_.rows(0, floats).to_host_vector();
    const float expected = ranks * (ranks + 1) / 2.0f;
    for (int64_t i : {int64_t{0}, count / 2, count - 1}) {
      bf16_bits element = 0;
      if (bf16) std::memcpy(&element, reinterpret_cast<const char*>(host.data()) + 2 * i, 2);
      const float got = bf16 ? bf16_to_float(element) : host[i];
      const float tolerance = bf16 && ranks > 22 ? expected / 64 : 0.0f;
      FT_CHECK(std::fabs(got - expected) <= tolerance, "allreduce of ", count, " ",
               comm_dtype_name(dtype_), " elements gave ", got, " at index ", i, ", expected ",
               expected);
    }
  }

 private:
  Communicator& comm_;
  CommDtype dtype_;
  Tensor data_, staging_;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

struct PairUs {
  double first = 0, second = 0;
};

// Microseconds per iteration of two bodies run interleaved (first, second, first, ...), so both
// see the same load on a shared machine: the median over iterations, averaged over ranks.
template <typename First, typename Second>
PairUs time_pair_us(Communicator& comm, const Repeats& repeats, First first, Second second) {
  for (int i = 0; i < repeats.warmup; ++i) {
    first();
    second();
  }
  std::vector<double> first_us, second_us;
  comm.barrier();
  for (int i = 0; i < repeats.iters; ++i) {
    double start = now_ms();
    first();
    first_us.push_back((now_ms() - start) * 1e3);
    start = now_ms();
    second();
    second_us.push_back((now_ms() - start) * 1e3);
  }
  return {mean_over_ranks(comm, median(first_us)), mean_over_ranks(comm, median(second_us))};
}

// User-facing: names the flag and what is allowed, without source locations.
void check_args(const BandwidthArgs& args) {
  if (args.min_bytes < 4)
    FT_USAGE_FAIL("--min-bytes must be >= 4 (one float), got ", args.min_bytes);
  for (const auto& [flag, bytes] :
       {std::pair{"--min-bytes", args.min_bytes}, std::pair{"--max-bytes", args.max_bytes}}) {
    if (bytes > kBandwidthMaxMessageBytes)
      FT_FAIL(flag, " must be at most ", kBandwidthMaxMessageBytes, " (8 GiB), got ", bytes);
  }
  if (args.max_bytes < args.min_bytes) {
    FT_USAGE_FAIL("--max-bytes (", args.max_bytes, ") must be >= --min-bytes (", args.min_bytes,
                  ")");
  }
  if (args.warmup < 0) FT_USAGE_FAIL("--warmup must be >= 0, got ", args.warmup);
  if (args.iters < 1) FT_USAGE_FAIL("--iters must be >= 1, got ", args.iters);
  if (args.peak_gbps < 0) {
    FT_USAGE_FAIL("--peak-gbps must be >= 0 (0 = measure), got ", args.peak_gbps);
  }
  if (args.backend != "mpi" && args.backend != "nccl")
    FT_USAGE_FAIL("--backend must be one of: mpi, nccl; got '", args.backend, "'");
  if (args.dtype != "fp32" && args.dtype != "bf16")
    FT_USAGE_FAIL("--dtype must be one of: fp32, bf16 (as comm.grad_dtype); got '", args.dtype,
                  "'");
  if (args.device != "cpu" && args.device != "cuda")
    FT_USAGE_FAIL("--device must be one of: cpu, cuda; got '", args.device, "'");
}

// Device memory bandwidth: one device-to-device copy of 256 MiB, best of 3.
double measure_device_peak_gbps(Communicator& comm) {
  const int64_t floats = 64 * kMiB;
  Tensor source = Tensor::zeros({floats}, Device::kCuda),
         target = Tensor::zeros({floats}, Device::kCuda);
  double best_ms = 1e30;
  for (int repeat = 0; repeat < 4; ++repeat) {
    target.to_host_vector();  // waits for everything before, so the copy is timed alone
    comm.barrier();
    const double start = now_ms();
    target.copy_from(source);
    target.rows(0, 1).to_host_vector();  // waits for the copy
    if (repeat > 0) best_ms = std::min(best_ms, now_ms() - start);
  }
  return mean_over_ranks(comm, 2.0 * floats * 4 / (best_ms * 1e-3) / 1e9);  // read + write
}

}  // namespace

int run_bandwidth(Communicator& host_comm, const BandwidthArgs& args_in) {
  BandwidthArgs args = args_in;
  if (args.backend == "nccl") args.device = "cuda";
  check_args(args);
  const bool root = host_comm.rank() == 0;
  const int ranks = host_comm.size();
  const bool nccl = args.backend == "nccl";
  // One MPI rank moves nothing: busbw would be 0 and algbw a memory-speed figure. NCCL with one
  // rank is allowed: on a one-GPU machine it is the only NCCL run there is.
  if (ranks < 2 && !nccl) {
    FT_FAIL("bandwidth needs at least 2 ranks for allreduce numbers, got ", ranks,
            "; run it under mpirun -np N with N >= 2 (or --backend nccl on a GPU)");
  }
  // Selects this rank's GPU before anything is allocated on one (else every rank takes device 0).
  const Device device = setup_device(args.device, "bandwidth --device",
                                     "--device cpu (and --backend mpi)", host_comm.local_rank());
  std::unique_ptr<Communicator> device_comm = nccl ? make_device_communicator() : nullptr;
  Communicator& comm = nccl ? *device_comm : host_comm;
  // NCCL has no rank-order sum: its rows leave the det columns empty.
  const bool has_rank_order = !nccl;
  const bool measured = args.peak_gbps == 0;
  const double peak = !measured                 ? args.peak_gbps
                      : device == Device::kCuda ? measure_device_peak_gbps(host_comm)
                                                : measure_peak_gbps(host_comm);
  const std::string peak_source = !measured ? "given (--peak-gbps)"
                                  : device == Device::kCuda
                                      ? "measured: device-to-device copy, read + write"
                                      : "measured: per-rank memcpy with all ranks copying";

  std::vector<int64_t> fused_sizes;
  for (int64_t size : kFusedSizes) {
    if (kFusedMessages * size <= args.max_bytes) fused_sizes.push_back(size);
  }
  if (fused_sizes.empty()) fused_sizes.push_back(std::max<int64_t>(4, args.max_bytes / 4 / 4 * 4));

  const int64_t max_floats =
      std::max(args.max_bytes, kFusedMessages * fused_sizes.back()) / static_cast<int64_t>(4);
  const CommDtype dtype = comm_dtype_from_name(args.dtype);
  const int64_t element_bytes = comm_dtype_bytes(dtype);
  const char* type_name = dtype == CommDtype::kBf16 ? "bf16" : "float32";
  SweepBuffer buffer(comm, device, dtype, max_floats);

  nlohmann::json report = {{"job", "bandwidth"},
                           {"backend", comm.backend_name()},
                           {"device", args.device},
                           {"staged_through_host", device == Device::kCuda && !nccl},
                           {"ranks", ranks},
                           {"op", std::string("allreduce sum ") + type_name},
                           {"dtype", args.dtype},
                           {"deterministic_same_call_as_native", ranks == 2},
                           {"peak_gbps", peak},
                           {"peak_source", peak_source},
                           {"bus_factor", bus_factor(ranks)}};
  if (root) {
    std::printf("# fusiontrain bandwidth: allreduce (sum, %s), %d ranks, backend %s, %s%s\n",
                type_name, ranks, comm.backend_name(), args.device.c_str(),
                device == Device::kCuda && !nccl ? " buffers staged through pinned host memory"
                                                 : " buffers");
    if (ranks == 1)
      std::printf("# 1 rank: busbw is defined as algbw here (nothing crosses ranks)\n");
    std::printf("# peak %.2f GB/s (%s); busbw = algbw * 2(n-1)/n; util = busbw / peak\n", peak,
                peak_source.c_str());
    if (has_rank_order)
      std::printf(
          "# native = the MPI library's allreduce (comm.deterministic: false); det = rank-order "
          "sums (comm.deterministic: true)%s; det/nat = time ratio\n",
          ranks == 2 ? ", which with 2 ranks is the same MPI_Allreduce call" : "");
    else
      std::printf(
          "# native = ncclAllReduce; NCCL has no rank-order sum, so the det columns time "
          "native a second time (interleaved): their ratio is the run's noise\n");
    std::printf("%14s %12s %6s %12s %11s %11s %7s %12s %11s %8s\n", "size(B)", "count", "iters",
                "time(us)", "algbw(GB/s)", "busbw(GB/s)", "util(%)", "det(us)", "det busbw",
                "det/nat");
  }
  nlohmann::json sweep = nlohmann::json::array();
  for (int64_t bytes = args.min_bytes; bytes <= args.max_bytes; bytes *= 2) {
    const int64_t count = bytes / element_bytes;
    const Repeats repeats = repeats_for(args, bytes);
    buffer.check(host_comm.rank(), ranks, count, Summation::kNative);
    if (has_rank_order) buffer.check(host_comm.rank(), ranks, count, Summation::kRankOrder);
    const Summation second = has_rank_order ? Summation::kRankOrder : Summation::kNative;
    const PairUs times = time_pair_us(
        host_comm, repeats, [&] { buffer.allreduce(0, count, Summation::kNative); },
        [&] { buffer.allreduce(0, count, second); });
    const double us = times.first, det_us = times.second;
    const double algbw = count * element_bytes / (us * 1e-6) / 1e9;
    const double busbw = algbw * bus_factor(ranks);
    const double det_busbw = count * element_bytes / (det_us * 1e-6) / 1e9 * bus_factor(ranks);
    sweep.push_back(
        {{"bytes", count * element_bytes},
         {"count", count},
         {"iters", repeats.iters},
         {"time_us", us},
         {"algbw_gbps", algbw},
         {"busbw_gbps", busbw},
         {"utilization", busbw / peak},
         {"deterministic_time_us", has_rank_order ? nlohmann::json(det_us) : nullptr},
         {"deterministic_busbw_gbps", has_rank_order ? nlohmann::json(det_busbw) : nullptr},
         {"deterministic_over_native", has_rank_order ? nlohmann::json(det_us / us) : nullptr}});
    if (root) {
      std::printf("%14" PRId64 " %12" PRId64
                  " %6d %12.1f %11.3f %11.3f %7.1f %12.1f %11.3f %8.2f\n",
                  count * element_bytes, count, repeats.iters, us, algbw, busbw,
                  100.0 * busbw / peak, det_us, det_busbw, det_us / us);
      std::fflush(stdout);
    }
  }
  report["sweep"] = sweep;

  if (root) {
    std::printf(
        "\n# fusion (native): %d separate allreduces of s bytes vs one fused allreduce of %d*s\n",
        kFusedMessages, kFusedMessages);
    std::printf("%12s %6s %14s %10s %14s %10s %8s\n", "s(B)", "iters", "separate(us)", "util(%)",
                "fused(us)", "util(%)", "ratio");
  }
  nlohmann::json fused_rows = nlohmann::json::array();
  for (int64_t size : fused_sizes) {
    const int64_t count = size / element_bytes;
    const int64_t total_bytes = kFusedMessages * count * element_bytes;
    buffer.check(host_comm.rank(), ranks, kFusedMessages * count, Summation::kNative);
    const Repeats repeats = repeats_for(args, total_bytes);
    const PairUs times = time_pair_us(
        host_comm, repeats,
        [&] {
          for (int m = 0; m < kFusedMessages; ++m)
            buffer.allreduce(m * count, count, Summation::kNative);
        },
        [&] { buffer.allreduce(0, kFusedMessages * count, Summation::kNative); });
    const double separate_us = times.first, fused_us = times.second;
    auto utilization = [&](double us) {
      return total_bytes / (us * 1e-6) / 1e9 * bus_factor(ranks) / peak;
    };
    const double ratio = separate_us / fused_us;
    fused_rows.push_back({{"message_bytes", count * element_bytes},
                          {"messages", kFusedMessages},
                          {"iters", repeats.iters},
                          {"separate_time_us", separate_us},
                          {"separate_utilization", utilization(separate_us)},
                          {"fused_time_us", fused_us},
                          {"fused_utilization", utilization(fused_us)},
                          {"separate_over_fused", ratio}});
    if (root) {
      std::printf("%12" PRId64 " %6d %14.1f %10.1f %14.1f %10.1f %8.2f\n", count * element_bytes,
                  repeats.iters, separate_us, 100.0 * utilization(separate_us), fused_us,
                  100.0 * utilization(fused_us), ratio);
      std::fflush(stdout);
    }
  }
  report["fused"] = fused_rows;

  if (root && !args.json_path.empty()) {
    write_output_file(args.json_path, report.dump(2) + "\n");
  }
  return 0;
}

}  // namespace ft

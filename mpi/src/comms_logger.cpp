// The comms_logger's records, bandwidths and DeepSpeed's summary layout (comms_logger.h).
#include "ds/mpi/comms_logger.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "ds/core/error.h"
#include "ds/core/log.h"

namespace ds {

namespace {

// nccl-tests' bus bandwidth factors (doc/PERFORMANCE.md): what each rank's links carry
// relative to S / time.
double all_reduce_factor(int n) { return 2.0 * (n - 1) / n; }
double gather_scatter_factor(int n) { return double(n - 1) / n; }
double one(int /*n*/) { return 1.0; }

constexpr CommOpRow kRows[] = {
    {CommOp::AllReduce, "all_reduce", all_reduce_factor},
    {CommOp::ReduceScatter, "reduce_scatter", gather_scatter_factor},
    {CommOp::AllGather, "all_gather", gather_scatter_factor},
    {CommOp::Broadcast, "broadcast", one},
    {CommOp::Barrier, "barrier", one},
};
static_assert(std::size(kRows) == kCommOpCount);

// DeepSpeed's names of the same collectives (torch.distributed's tensor forms).
struct Alias {
  std::string_view name;
  CommOp op;
};
constexpr Alias kAliases[] = {
    {"all_gather_into_tensor", CommOp::AllGather},
    {"all_gather_base", CommOp::AllGather},
    {"reduce_scatter_tensor", CommOp::ReduceScatter},
    {"reduce_scatter_base", CommOp::ReduceScatter},
};

std::string fixed2(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

}  // namespace

std::span<const CommOpRow> comm_op_rows() { return kRows; }

std::string_view comm_op_name(CommOp op) { return kRows[static_cast<int>(op)].name; }

const CommOpRow* find_comm_op(std::string_view name) {
  for (const CommOpRow& r : kRows)
    if (r.name == name) return &r;
  for (const Alias& a : kAliases)
    if (a.name == name) return &kRows[static_cast<int>(a.op)];
  return nullptr;
}

std::string comm_op_choices() {
  std::string out;
  for (std::size_t i = 0; i < std::size(kRows); ++i) {
    if (i > 0) out += i + 1 == std::size(kRows) ? " or " : ", ";
    out += kRows[i].name;
  }
  return out;
}

Bandwidth comm_bandwidth(CommOp op, std::size_t bytes, double seconds, int n) {
  if (seconds <= 0 || n <= 0) return {};
  const double algbw = double(bytes) * 8 / seconds / 1e9;
  return {algbw, algbw * kRows[static_cast<int>(op)].bus_factor(n)};
}

std::string comm_size_text(std::size_t bytes) {
  if (bytes == 0) return "0B";
  static const char* kUnits[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
  int unit = 0;
  double scaled = double(bytes);
  while (scaled >= 1024 && unit + 1 < int(std::size(kUnits))) {
    scaled /= 1024;
    ++unit;
  }
  // Python's str(round(x, 2)): two decimals at most, one at least ("2.0", "1.5", "678.86").
  std::string text = fixed2(scaled);
  while (text.back() == '0' && text[text.size() - 2] != '.') text.pop_back();
  return text + " " + kUnits[unit];
}

double trimmed_mean(std::vector<double> values, double trim_fraction) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  // Python's round(): halves to even, as nearbyint in the default rounding mode.
  const auto k = static_cast<std::size_t>(std::nearbyint(double(n) * trim_fraction));
  if (2 * k >= n) return 0;
  double sum = 0;
  for (std::size_t i = k; i < n - k; ++i) sum += values[i];
  return sum / double(n - 2 * k);
}

CommsLog::CommsLog(CommsLoggerOptions options, int rank, int world_size, std::string_view key)
    : options_(std::move(options)), rank_(rank), world_size_(world_size) {
  for (const std::string& name : options_.prof_ops) {
    const CommOpRow* row = find_comm_op(name);
    if (!row) DS_THROW(key << ": unknown collective \"" << name << "\"; expected " << comm_op_choices());
    wanted_[static_cast<int>(row->op)] = true;
  }
  if (options_.prof_all) std::fill(std::begin(wanted_), std::end(wanted_), true);
}

void CommsLog::record(CommOp op, std::size_t bytes, double seconds, const char* caller) {
  std::string name(comm_op_name(op));
  if (options_.debug && caller) name += std::string(" | [Caller Func: ") + caller + "]";
  const Bandwidth bw = comm_bandwidth(op, bytes, seconds, world_size_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto [it, added] = records_.try_emplace(name);
    if (added) names_.push_back(name);
    Entry& e = it->second[bytes];
    e.latencies_s.push_back(seconds);
    e.bandwidths.push_back(bw);
  }
  if (options_.verbose && rank_ == 0) DS_INFO(op_line(name, bytes, seconds, bw));
}

std::string CommsLog::op_line(std::string_view record_name, std::size_t bytes, double seconds, Bandwidth bw) {
  return "comm op: " + std::string(record_name) + " | time (ms): " + fixed2(seconds * 1e3) +
         " | msg size: " + comm_size_text(bytes) + " | algbw (Gbps): " + fixed2(bw.algbw_gbps) +
         " | busbw (Gbps): " + fixed2(bw.busbw_gbps);
}

const std::map<std::size_t, CommsLog::Entry>* CommsLog::sizes(const std::string& record_name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = records_.find(record_name);
  return it == records_.end() ? nullptr : &it->second;
}

std::string CommsLog::summary() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (names_.empty()) return {};
  auto cell = [](const std::string& s) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%-20s", s.c_str());
    return std::string(buf);
  };
  std::string out = cell("Comm. Op") + cell("Message Size") + cell("Count") + cell("Total Latency(ms)") +
                    cell("Avg Latency(ms)") + cell("algbw_avg (Gbps)") + "busbw_avg (Gbps)\n";
  for (const std::string& name : names_) {
    out += name + "\n";
    for (const auto& [bytes, e] : records_.at(name)) {
      std::vector<double> lat_ms, alg, bus;
      for (double s : e.latencies_s) lat_ms.push_back(s * 1e3);
      for (const Bandwidth& b : e.bandwidths) {
        alg.push_back(b.algbw_gbps);
        bus.push_back(b.busbw_gbps);
      }
      double total_ms = 0;
      for (double v : lat_ms) total_ms += v;
      // Trimmed means, as DeepSpeed: one slow first call (page faults, a late peer) does not
      // set the average.
      out += cell("") + cell(comm_size_text(bytes)) + cell(std::to_string(lat_ms.size())) + cell(fixed2(total_ms)) +
             cell(fixed2(trimmed_mean(lat_ms))) + cell(fixed2(trimmed_mean(alg))) + fixed2(trimmed_mean(bus)) + "\n";
    }
  }
  return out;
}

namespace {
thread_local const char* t_caller = nullptr;
}  // namespace

CommCallerScope::CommCallerScope(const char* caller) : previous_(t_caller) { t_caller = caller; }
CommCallerScope::~CommCallerScope() { t_caller = previous_; }
const char* CommCallerScope::current() { return t_caller; }

}  // namespace ds

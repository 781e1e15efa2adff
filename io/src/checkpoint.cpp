#include "ds/io/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "ds/core/hash.h"
#include "ds/core/error.h"
#include "ds/core/file_read.h"
#include "ds/core/half.h"
#include "ds/core/log.h"
#include "ds/io/checksum.h"
#include "raw_io.h"
#include "save_claim.h"

namespace fs = std::filesystem;

namespace ds::io {

namespace {

std::string hex32(std::uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", v);
  return b;
}

// Exact integers through float collectives: a 48-bit value as three 16-bit chunks
// (every chunk is an exactly representable float, and max/sum over one contributor is exact).
void put48(float* dst, std::uint64_t v) {
  for (int i = 0; i < 3; ++i) dst[i] = float((v >> (16 * i)) & 0xffffu);
}
std::uint64_t get48(const float* src) {
  std::uint64_t v = 0;
  for (int i = 0; i < 3; ++i) v |= std::uint64_t(src[i]) << (16 * i);
  return v;
}
// 64-bit values as four 16-bit chunks (for all_gather).
void put64(float* dst, std::uint64_t v) {
  for (int i = 0; i < 4; ++i) dst[i] = float((v >> (16 * i)) & 0xffffu);
}
std::uint64_t get64(const float* src) {
  std::uint64_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint64_t(src[i]) << (16 * i);
  return v;
}

TensorView f32_view(float* p, std::size_t n) { return TensorView{p, n, DType::F32}; }

double collective_timeout(const SaveOptions& o) {
  if (const char* e = std::getenv("DS_CKPT_COLLECTIVE_TIMEOUT_S"); e && *e) {
    char* end = nullptr;
    double v = std::strtod(e, &end);
    DS_CHECK(end && *end == '\0' && v > 0, "DS_CKPT_COLLECTIVE_TIMEOUT_S='" << e << "' is not a positive number");
    return v;
  }
  return o.collective_timeout_s;
}

void write_text_file_synced(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DS_CHECK(fd >= 0, "cannot create " << path << ": " << std::strerror(errno));
  const char* p = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      DS_THROW("writing " << path << " failed: " << std::strerror(err));
    }
    p += n;
    left -= std::size_t(n);
  }
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  DS_CHECK(rc == 0, "fsync of " << path << " failed: " << std::strerror(err));
}

// A name read from a checkpoint (or given for one) must name an entry directly inside the
// checkpoint directory: `latest` holding "../x" or "/abs", or a manifest naming "../../f",
// would otherwise make the reader open files anywhere.
bool is_plain_name(std::string_view s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string_view::npos &&
         s.find('\0') == std::string_view::npos;
}

void check_tag(const std::string& tag) {
  DS_CHECK(!tag.empty(), "checkpoint tag is empty");
  DS_CHECK(tag != "." && tag != ".." && tag.find('/') == std::string::npos && tag.find('\0') == std::string::npos,
           "checkpoint tag '" << tag << "' is not a valid directory name");
  DS_CHECK(tag.find(".tmp-") == std::string::npos && tag != kLatestFile,
           "checkpoint tag '" << tag << "' is reserved (contains '.tmp-' or is 'latest')");
}

// Disk space a state tree takes in HDF5 (generous: object headers, attributes, heaps).
std::size_t state_bytes(const StateValue& v) {
  std::size_t n = 4096;
  switch (v.kind()) {
    case StateValue::Kind::String: n += v.as_string().size(); break;
    case StateValue::Kind::Tensor: n += v.as_tensor().data.size() * sizeof(float); break;
    case StateValue::Kind::List: for (const auto& e : v.as_list()) n += state_bytes(e); break;
    case StateValue::Kind::Map: for (const auto& [k, e] : v.as_map()) n += k.size() + state_bytes(e); break;
    default: break;
  }
  return n;
}

// With less than twice `bytes` + 1 GiB free, claims `bytes` of disk beside `path` (fallocate on
// a scratch file, removed again) so that a full disk fails here, cleanly, before HDF5 holds dirty data for the file: HDF5 1.10 cannot
// close a file whose flush failed, and crashes at exit on it. Filesystems without fallocate
// get a statvfs check instead.
void ensure_space(const std::string& path, std::size_t bytes) {
  {
    std::error_code ec;
    auto sp = fs::space(fs::path(path).parent_path(), ec);
    if (!ec && sp.available / 2 > bytes + (std::size_t(1) << 30)) return;  // plenty: skip the reservation
  }
  std::string scratch = path + ".reserve";
  int fd = ::open(scratch.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DS_CHECK(fd >= 0, "cannot create " << scratch << ": " << std::strerror(errno));
  int rc = ::fallocate(fd, 0, 0, off_t(bytes));
  int err = errno;
  ::close(fd);
  ::unlink(scratch.c_str());
  if (rc == 0) return;
  if (err == EOPNOTSUPP || err == ENOSYS) {
    std::error_code ec;
    auto sp = fs::space(fs::path(path).parent_path(), ec);
    DS_CHECK(ec || sp.available >= bytes, "not enough disk space for " << path << ": needs about " << bytes
                                                                       << " bytes, " << sp.available << " available");
    return;
  }
  DS_THROW("not enough disk space for " << path << " (about " << bytes << " bytes): " << std::strerror(err));
}

bool exchange_dirs(const std::string& a, const std::string& b) {
  return ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0;
}

}  // namespace

std::string shard_file_name(int rank) { return "zero_rank_" + std::to_string(rank) + ".h5"; }

TagValidation parse_tag_validation(std::string_view s) {
  std::string l(s);
  for (auto& c : l) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (l == "ignore") return TagValidation::Ignore;
  if (l == "warn") return TagValidation::Warn;
  if (l == "fail") return TagValidation::Fail;
  DS_THROW("checkpoint.tag_validation = '" << s << "': expected Ignore, Warn or Fail");
}

std::size_t ParamRecord::numel() const {
  std::size_t n = 1;
  for (auto d : shape) n *= std::size_t(d);
  return n;
}

std::string layout_signature(const CheckpointContent& c) {
  std::ostringstream os;
  os << "stage=" << c.zero_stage << ";flat=" << c.flat_numel << ";dtype=" << c.working_dtype << ";shard=";
  for (const auto& s : c.shard) os << s.name << ",";
  return os.str();
}

void test_kill_point(std::string_view phase, int rank) {
  const char* e = std::getenv("DS_CKPT_TEST_KILL_AT");
  if (!e || !*e) return;
  std::string spec(e);
  std::string want_phase = spec;
  int want_rank = -1;
  if (auto at = spec.find('@'); at != std::string::npos) {
    want_phase = spec.substr(0, at);
    want_rank = std::atoi(spec.c_str() + at + 1);
  }
  if (want_phase == phase && (want_rank < 0 || want_rank == rank)) std::raise(SIGKILL);
}

int clean_stale_tmp_dirs(const std::string& save_dir) { return detail::remove_abandoned_tmp_dirs(save_dir); }

// ---------------------------------------------------------------------------------------
// Save
// ---------------------------------------------------------------------------------------

PendingSave begin_save(Communicator& comm, const std::string& save_dir, const std::string& tag_in,
                       const SaveOptions& options, const CheckpointContent& content) {
  DS_CHECK(!save_dir.empty(), "save_checkpoint: save_dir is empty");
  check_tag(tag_in);
  const int rank = comm.rank(), size = comm.size();
  std::string tag = tag_in;

  // First collective, under a deadline: tag hash (max and -min), layout hash (max and -min)
  // and rank 0's random save id (max). A rank that is alone in save_checkpoint times out here.
  std::uint64_t tag_h = fnv1a64(tag) & 0xffffffffffffull;
  std::uint64_t lay_h = fnv1a64(layout_signature(content)) & 0xffffffffffffull;
  std::uint64_t id = 0;
  if (rank == 0) {
    std::random_device rd;
    id = ((std::uint64_t(rd()) << 32) ^ rd() ^ std::uint64_t(::getpid()) ^
          std::uint64_t(std::chrono::steady_clock::now().time_since_epoch().count())) & 0xffffffffffffull;
  }
  auto* first = new std::vector<float>(15, 0.0f);  // leaked if the deadline passes (MPI owns it)
  float* b = first->data();
  put48(b + 0, tag_h);
  for (int i = 0; i < 3; ++i) b[3 + i] = -b[i];
  put48(b + 6, lay_h);
  for (int i = 0; i < 3; ++i) b[9 + i] = -b[6 + i];
  put48(b + 12, id);
  if (size > 1) {
    double timeout = collective_timeout(options);
    CommWork work = comm.iall_reduce(f32_view(b, first->size()), ReduceOp::Max);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
    while (!work->test()) {
      if (std::chrono::steady_clock::now() > deadline) {
        (void)work.release();  // the operation may still complete; its buffer stays alive
        DS_THROW("save_checkpoint('" << save_dir << "', tag '" << tag << "'): rank " << rank << " waited " << timeout
                 << " s for the other ranks at the first collective of the save. save_checkpoint is collective: "
                    "every rank must call it (the communicator is now unusable; end the job)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  std::vector<float> r(*first);
  delete first;
  auto neg3 = [](const float* p) { float t[3] = {-p[0], -p[1], -p[2]}; return get48(t); };
  DS_CHECK(get48(r.data() + 6) == neg3(r.data() + 9),
           "save_checkpoint: ranks disagree on what they save (ZeRO stage, flat length, dtype or optimizer state); "
           "this rank: " << layout_signature(content));
  if (get48(r.data()) != neg3(r.data() + 3)) {
    DS_CHECK(options.tag_validation != TagValidation::Fail,
             "[rank=" << rank << "] The checkpoint tag name '" << tag
                      << "' is not consistent across all ranks (checkpoint.tag_validation = Fail)");
    // Warn / Ignore: every rank adopts rank 0's tag so the shards land in one directory.
    std::vector<float> tb(256, 0.0f);
    if (rank == 0) {
      DS_CHECK(tag.size() < tb.size(), "checkpoint tag longer than " << tb.size() - 1 << " bytes");
      for (std::size_t i = 0; i < tag.size(); ++i) tb[i] = float(static_cast<unsigned char>(tag[i]));
    }
    comm.broadcast(f32_view(tb.data(), tb.size()), 0);
    std::string t0;
    for (float f : tb) { if (f == 0.0f) break; t0 += char(static_cast<unsigned char>(f)); }
    if (options.tag_validation == TagValidation::Warn) {
      DS_WARN("[rank=" << rank << "] The checkpoint tag name '" << tag
                       << "' is not consistent across all ranks; saving under rank 0's tag '" << t0 << "'");
    }
    tag = t0;
  }

  PendingSave p;
  p.save_dir = save_dir;
  p.tag = tag;
  p.options = options;
  p.id = get48(r.data() + 12);
  p.world_size = size;
  p.num_shard_datasets = content.shard.size();
  p.final_dir = (fs::path(save_dir) / tag).string();
  char idhex[32];
  std::snprintf(idhex, sizeof idhex, "%012llx", static_cast<unsigned long long>(p.id));
  p.tmp_dir = (fs::path(save_dir) / (tag + ".tmp-" + idhex)).string();

  // Rank 0 prepares the directory; the status all-reduce orders it before any rank writes.
  float status = 0.0f;  // 1: tag exists, 2: rank 0 could not prepare the directory
  std::string rank0_error;
  if (rank == 0) {
    try {
      std::error_code ec;
      fs::create_directories(save_dir, ec);
      DS_CHECK(!ec && fs::is_directory(save_dir), "cannot create checkpoint directory " << save_dir << ": " << ec.message());
      if (fs::exists(p.final_dir) && !options.overwrite) {
        status = 1.0f;
      } else {
        clean_stale_tmp_dirs(save_dir);
        try {
          p.claim = detail::create_claimed_dir(p.tmp_dir);  // the marker goes in first, locked
          fsync_path(save_dir);
        } catch (...) {
          p.claim.reset();
          fs::remove_all(p.tmp_dir, ec);
          throw;
        }
      }
    } catch (const std::exception& e) {
      status = 2.0f;
      rank0_error = e.what();
    }
  }
  if (size > 1) comm.all_reduce(f32_view(&status, 1), ReduceOp::Max);
  DS_CHECK(status != 1.0f, "checkpoint tag '" << tag << "' already exists in " << save_dir << " (" << p.final_dir
                                              << "); an existing tag is never overwritten unless overwrite is set");
  if (status == 2.0f) {
    if (rank == 0) throw Error(rank0_error);
    DS_THROW("save_checkpoint: rank 0 could not prepare " << p.tmp_dir << " (see rank 0's message)");
  }
  p.active = true;
  test_kill_point("begin", rank);
  return p;
}

LocalWriteResult write_local(const PendingSave& pending, int rank, const CheckpointContent& c) {
  LocalWriteResult res;
  res.working_dtype = c.working_dtype;
  res.zero_stage = c.zero_stage;
  res.flat_numel = c.flat_numel;
  res.has_shard = c.has_shard;
  res.shard_offset = c.shard_offset;
  res.shard_count = c.shard_count;
  for (const auto& s : c.shard) res.shard_names.push_back(s.name);
  // HDF5 lays out both files (metadata, attributes, state trees, and storage for every
  // tensor dataset, allocated but not written) and closes them; then the tensors' bytes go
  // to their extents through detail::write_raw (parallel chunks, CRC per chunk, writeback
  // started per chunk), and every file is fsynced once, after all writes were issued.
  struct Out {
    std::string path;
    int fd = -1;
  };
  std::vector<Out> files;
  std::vector<detail::RawWrite> jobs;
  struct JobInfo {
    std::size_t file;                               // index into files
    std::map<std::string, std::uint32_t>* crc_map;  // where the job's CRC goes
    std::string name;
  };
  std::vector<JobInfo> job_info;
  std::size_t first_shard_job = std::size_t(-1);
  auto close_fds = [&] {
    for (auto& f : files)
      if (f.fd >= 0) { ::close(f.fd); f.fd = -1; }
  };
  try {
    DS_CHECK(pending.active, "write_local: no save in progress");
    if (rank == 0) {
      std::size_t need = 65536 + state_bytes(c.engine_state) + state_bytes(c.client_state) + c.config_json.size();
      for (const auto& pr : c.params) need += 4096 + pr.numel() * dtype_size(pr.dtype);
      const std::string path = (fs::path(pending.tmp_dir) / kModelFile).string();
      ensure_space(path, need);
      H5File f(path, H5File::Mode::Create);
      f.set_attr("/", "format", "dstrain-checkpoint");
      f.set_attr("/", "format_version", std::int64_t(kFormatVersion));
      f.set_attr("/", "tag", pending.tag);
      f.set_attr("/", "world_size", std::int64_t(pending.world_size));
      f.set_attr("/", "zero_stage", std::int64_t(c.zero_stage));
      f.set_attr("/", "working_dtype", c.working_dtype);
      f.set_attr("/", "config", c.config_json);
      for (const auto& pr : c.params) {
        DS_CHECK(!pr.name.empty() && pr.name.find('/') == std::string::npos,
                 "parameter name '" << pr.name << "' cannot be a checkpoint dataset name (empty or contains '/')");
        std::string ds = "params/" + pr.name;
        std::size_t bytes = pr.numel() * dtype_size(pr.dtype);
        auto ext = f.create_raw(ds, pr.dtype, pr.shape);
        f.set_attr(ds, "flat_offset", std::int64_t(pr.flat_offset));
        if (ext) {
          DS_CHECK(ext->bytes == bytes, "HDF5 allocated " << ext->bytes << " bytes for " << path << " dataset " << ds << ", expected " << bytes);
          jobs.push_back({-1, ext->offset, pr.data, bytes, path + " dataset " + ds});
          job_info.push_back({files.size(), &res.model_crc, ds});
        } else {
          res.model_crc[ds] = crc32c(pr.data, bytes);
        }
        ParamRecord meta = pr;
        meta.data = nullptr;
        res.params_meta.push_back(std::move(meta));
      }
      f.write_state("engine", c.engine_state);
      f.write_state("client_state", c.client_state);
      f.close(/*sync=*/false);
      files.push_back({path});
    }
    if (c.has_shard) {
      const std::string path = (fs::path(pending.tmp_dir) / shard_file_name(rank)).string();
      ensure_space(path, 65536 + c.shard.size() * (4096 + c.shard_count * sizeof(float)));
      H5File s(path, H5File::Mode::Create);
      s.set_attr("/", "format", "dstrain-checkpoint-shard");
      s.set_attr("/", "format_version", std::int64_t(kFormatVersion));
      s.set_attr("/", "rank", std::int64_t(rank));
      s.set_attr("/", "world_size", std::int64_t(pending.world_size));
      s.set_attr("/", "zero_stage", std::int64_t(c.zero_stage));
      s.set_attr("/", "offset", std::int64_t(c.shard_offset));
      s.set_attr("/", "count", std::int64_t(c.shard_count));
      s.set_attr("/", "flat_numel", std::int64_t(c.flat_numel));
      const std::size_t bytes = c.shard_count * sizeof(float);
      const std::int64_t n = std::int64_t(c.shard_count);
      for (const auto& t : c.shard) {
        auto ext = s.create_raw(t.name, DType::F32, std::span<const std::int64_t>(&n, 1));
        if (ext) {
          if (first_shard_job == std::size_t(-1)) first_shard_job = jobs.size();
          jobs.push_back({-1, ext->offset, t.data, bytes, path + " dataset " + t.name});
          job_info.push_back({files.size(), &res.shard_crc, t.name});
        } else {
          res.shard_crc[t.name] = crc32c(t.data, bytes);
        }
      }
      s.close(/*sync=*/false);
      files.push_back({path});
    }
    for (auto& f : files) {
      f.fd = ::open(f.path.c_str(), O_WRONLY | O_CLOEXEC);
      DS_CHECK(f.fd >= 0, "cannot open " << f.path << " for writing: " << std::strerror(errno));
    }
    for (std::size_t i = 0; i < jobs.size(); ++i) jobs[i].fd = files[job_info[i].file].fd;
    if (first_shard_job == std::size_t(-1) && c.has_shard) test_kill_point("shard_write", rank);
    std::vector<std::uint32_t> crcs = detail::write_raw(jobs, [&](std::size_t job) {
      if (job == first_shard_job) test_kill_point("shard_write", rank);
    });
    for (std::size_t i = 0; i < jobs.size(); ++i) (*job_info[i].crc_map)[job_info[i].name] = crcs[i];
    for (auto& f : files) {
      int rc = ::fsync(f.fd);
      int err = errno;
      DS_CHECK(rc == 0, "fsync of " << f.path << " failed: " << std::strerror(err));
    }
    close_fds();
    res.ok = true;
  } catch (const std::exception& e) {
    close_fds();
    res.ok = false;
    res.error = e.what();
  }
  return res;
}

std::string commit_save(Communicator& comm, PendingSave& pending, const LocalWriteResult& local) {
  DS_CHECK(pending.active, "commit_save: no save in progress");
  pending.active = false;
  const int rank = comm.rank(), size = comm.size();
  const std::size_t k = pending.num_shard_datasets;
  const std::size_t L = 4 + k;  // ok, has_shard, offset, count, crc...
  std::vector<float> send(4 * L, 0.0f), recv(4 * L * std::size_t(size), 0.0f);
  bool shard_ok = local.ok && local.shard_names.size() == k;
  put64(&send[0], shard_ok ? 1 : 0);
  put64(&send[4], local.has_shard ? 1 : 0);
  put64(&send[8], local.shard_offset);
  put64(&send[12], local.shard_count);
  for (std::size_t i = 0; i < k && shard_ok && local.has_shard; ++i) {
    auto it = local.shard_crc.find(local.shard_names[i]);
    put64(&send[4 * (4 + i)], it == local.shard_crc.end() ? 0 : it->second);
  }
  if (size > 1) comm.all_gather(f32_view(send.data(), send.size()), f32_view(recv.data(), recv.size()));
  else recv = send;

  std::vector<int> failed;
  for (int r = 0; r < size; ++r)
    if (get64(&recv[std::size_t(r) * 4 * L]) != 1) failed.push_back(r);
  if (!failed.empty()) {
    if (rank == 0) {
      std::error_code ec;
      fs::remove_all(pending.tmp_dir, ec);
      pending.claim.reset();
    }
    if (!local.ok) DS_THROW("save_checkpoint to " << pending.final_dir << " failed (nothing committed; the previous "
                            "checkpoint and 'latest' are untouched): " << local.error);
    std::ostringstream ranks;
    for (int r : failed) ranks << (ranks.tellp() ? "," : "") << r;
    DS_THROW("save_checkpoint to " << pending.final_dir << " failed on rank(s) " << ranks.str()
                                   << " (see their messages); nothing committed, the previous checkpoint and 'latest' are untouched");
  }
  test_kill_point("before_manifest", rank);

  float commit_status = 0.0f;
  std::string commit_error;
  if (rank == 0) {
    try {
      nlohmann::json m;
      m["format"] = "dstrain-checkpoint";
      m["format_version"] = kFormatVersion;
      m["tag"] = pending.tag;
      m["world_size"] = size;
      m["zero_stage"] = local.zero_stage;
      m["working_dtype"] = local.working_dtype;
      m["flat_numel"] = local.flat_numel;
      m["model_file"] = kModelFile;
      nlohmann::json params = nlohmann::json::array();
      for (const auto& pr : local.params_meta) {
        params.push_back({{"name", pr.name}, {"shape", pr.shape}, {"dtype", std::string(dtype_name(pr.dtype))},
                          {"flat_offset", pr.flat_offset}, {"numel", pr.numel()}});
      }
      m["params"] = params;
      m["shard_datasets"] = local.shard_names;
      nlohmann::json parts = nlohmann::json::array();
      nlohmann::json sums = nlohmann::json::object();
      nlohmann::json model_sums = nlohmann::json::object();
      for (const auto& [ds, crc] : local.model_crc) model_sums[ds] = "crc32c:" + hex32(crc);
      sums[kModelFile] = model_sums;
      for (int r = 0; r < size; ++r) {
        const float* rr = &recv[std::size_t(r) * 4 * L];
        if (get64(rr + 4) != 1) continue;
        std::string file = shard_file_name(r);
        parts.push_back({{"rank", r}, {"file", file}, {"offset", get64(rr + 8)}, {"count", get64(rr + 12)}});
        nlohmann::json fsums = nlohmann::json::object();
        for (std::size_t i = 0; i < k; ++i) fsums[local.shard_names[i]] = "crc32c:" + hex32(std::uint32_t(get64(rr + 4 * (4 + i))));
        sums[file] = fsums;
      }
      m["partitions"] = parts;
      m["checksums"] = sums;
      write_text_file_synced((fs::path(pending.tmp_dir) / kManifestFile).string(), m.dump(1) + "\n");
      fsync_path(pending.tmp_dir);
      test_kill_point("before_rename", rank);
      if (fs::exists(pending.final_dir)) {
        // overwrite (begin_save refused otherwise): swap atomically, then drop the old copy,
        // which now sits under the tmp name; marked and locked first, so that it is cleaned
        // as an abandoned tmp dir if we die before removing it.
        detail::SaveClaim old_copy = detail::claim_existing_dir(pending.final_dir);
        DS_CHECK(exchange_dirs(pending.tmp_dir, pending.final_dir),
                 "cannot replace " << pending.final_dir << " (renameat2 RENAME_EXCHANGE): " << std::strerror(errno));
        fsync_path(pending.save_dir);
        std::error_code ec;
        fs::remove_all(pending.tmp_dir, ec);
      } else {
        DS_CHECK(::rename(pending.tmp_dir.c_str(), pending.final_dir.c_str()) == 0,
                 "cannot rename " << pending.tmp_dir << " to " << pending.final_dir << ": " << std::strerror(errno));
      }
      fsync_path(pending.save_dir);
      // The committed tag needs no marker (only tmp names are ever cleaned); best effort.
      ::unlink((fs::path(pending.final_dir) / detail::kSaveMarker).c_str());
      test_kill_point("before_latest", rank);
      if (pending.options.save_latest) {
        std::string latest = (fs::path(pending.save_dir) / kLatestFile).string();
        // Written inside the committed tag, then renamed over `latest`: a crash in between
        // leaves a stray file there, never a file in the save directory that a cleaner
        // would have to recognise.
        std::string tmp = (fs::path(pending.final_dir) / "latest.new").string();
        write_text_file_synced(tmp, pending.tag);  // no newline, as DeepSpeed
        DS_CHECK(::rename(tmp.c_str(), latest.c_str()) == 0,
                 "cannot rename " << tmp << " to " << latest << ": " << std::strerror(errno));
        fsync_path(pending.save_dir);
      }
      test_kill_point("after_latest", rank);
    } catch (const std::exception& e) {
      commit_status = 1.0f;
      commit_error = e.what();
      std::error_code ec;
      if (fs::exists(pending.tmp_dir)) fs::remove_all(pending.tmp_dir, ec);
    }
    pending.claim.reset();  // the save is over: committed, or its tmp dir removed
  }
  if (size > 1) comm.all_reduce(f32_view(&commit_status, 1), ReduceOp::Max);
  if (commit_status != 0.0f) {
    if (rank == 0) DS_THROW("save_checkpoint: commit of " << pending.final_dir << " failed: " << commit_error);
    DS_THROW("save_checkpoint: rank 0 failed to commit " << pending.final_dir << " (see rank 0's message)");
  }
  return pending.final_dir;
}

std::string save_checkpoint(Communicator& comm, const std::string& save_dir, const std::string& tag,
                            const CheckpointContent& content, const SaveOptions& options) {
  PendingSave p = begin_save(comm, save_dir, tag, options, content);
  LocalWriteResult local = write_local(p, comm.rank(), content);
  return commit_save(comm, p, local);
}

// ---------------------------------------------------------------------------------------
// Load
// ---------------------------------------------------------------------------------------

std::optional<std::string> read_latest(const std::string& load_dir) {
  DS_CHECK(fs::is_directory(load_dir), "checkpoint directory '" << load_dir << "' does not exist");
  fs::path latest = fs::path(load_dir) / kLatestFile;
  if (!fs::exists(latest)) return std::nullopt;
  std::string t = read_regular_file(latest.string(), "checkpoint file");
  auto b = t.find_first_not_of(" \t\r\n");
  auto e = t.find_last_not_of(" \t\r\n");
  DS_CHECK(b != std::string::npos, latest.string() << " is empty");
  t = t.substr(b, e - b + 1);
  DS_CHECK(is_plain_name(t), latest.string() << " names tag '" << t << "', which is not a plain directory name inside "
                                             << load_dir << " (a tag has no '/' and is not '.' or '..')");
  return t;
}

namespace {

std::uint32_t parse_crc(const nlohmann::json& v, const std::string& where) {
  DS_CHECK(v.is_string(), where << ": checksum is not a string");
  std::string s = v.get<std::string>();
  DS_CHECK(s.rfind("crc32c:", 0) == 0 && s.size() == 15, where << ": checksum '" << s << "' is not crc32c:<8 hex digits>");
  return std::uint32_t(std::stoul(s.substr(7), nullptr, 16));
}

// A manifest grows with parameters x ranks (about 200 bytes per parameter, 200 per rank):
// 64 MiB holds hundreds of thousands of either and still bounds memory when the path is
// something like a FIFO or a huge file.
constexpr std::uint64_t kMaxManifestBytes = std::uint64_t(64) << 20;

Manifest parse_manifest(const std::string& path) {
  const std::string text = read_regular_file(path, "checkpoint manifest", kMaxManifestBytes);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    DS_THROW(path << " is not valid JSON (truncated or corrupt?): " << e.what());
  }
  Manifest m;
  try {
    DS_CHECK(j.is_object() && j.contains("format_version"), path << " has no format_version (not a dstrain checkpoint manifest)");
    m.format_version = j.at("format_version").get<int>();
    DS_CHECK(m.format_version == kFormatVersion, path << " has format_version " << m.format_version
                                                      << "; this dstrain reads format_version " << kFormatVersion);
    m.tag = j.at("tag").get<std::string>();
    m.world_size = j.at("world_size").get<int>();
    m.zero_stage = j.at("zero_stage").get<int>();
    m.working_dtype = j.at("working_dtype").get<std::string>();
    m.flat_numel = j.at("flat_numel").get<std::size_t>();
    for (const auto& p : j.at("params")) {
      m.params.push_back({p.at("name").get<std::string>(), p.at("shape").get<std::vector<std::int64_t>>(),
                          p.at("dtype").get<std::string>(), p.at("flat_offset").get<std::size_t>(),
                          p.at("numel").get<std::size_t>()});
    }
    m.shard_datasets = j.at("shard_datasets").get<std::vector<std::string>>();
    for (const auto& p : j.at("partitions")) {
      m.partitions.push_back({p.at("rank").get<int>(), p.at("file").get<std::string>(), p.at("offset").get<std::size_t>(),
                              p.at("count").get<std::size_t>()});
      const std::string& f = m.partitions.back().file;
      DS_CHECK(is_plain_name(f), path << ": partitions[" << m.partitions.size() - 1 << "].file '" << f
                                      << "' is not a plain file name inside the checkpoint directory");
    }
    for (const auto& [file, sums] : j.at("checksums").items()) {
      for (const auto& [ds, v] : sums.items()) m.checksums[file][ds] = parse_crc(v, path + " checksums." + file + "." + ds);
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    DS_THROW(path << ": missing or malformed field: " << e.what());
  }
  return m;
}

}  // namespace

CheckpointReader::CheckpointReader(const std::string& load_dir, const std::string& tag) {
  DS_CHECK(fs::is_directory(load_dir), "checkpoint directory '" << load_dir << "' does not exist");
  DS_CHECK(is_plain_name(tag), "checkpoint tag '" << tag << "' is not a plain directory name inside " << load_dir
                                                  << " (a tag has no '/' and is not '.' or '..')");
  dir_ = (fs::path(load_dir) / tag).string();
  if (!fs::is_directory(dir_)) {
    std::ostringstream tags;
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(load_dir)) {
      std::string n = e.path().filename().string();
      if (e.is_directory() && n.find(".tmp-") == std::string::npos) names.push_back(n);
    }
    std::sort(names.begin(), names.end());
    for (const auto& n : names) tags << (tags.tellp() ? ", " : "") << n;
    DS_THROW("checkpoint tag '" << tag << "' not found: " << dir_ << " does not exist (tags in " << load_dir << ": "
                                << (names.empty() ? std::string("none") : tags.str()) << ")");
  }
  std::string mpath = (fs::path(dir_) / kManifestFile).string();
  DS_CHECK(fs::exists(mpath), "checkpoint " << dir_ << " has no " << kManifestFile << " (incomplete save or not a dstrain checkpoint)");
  manifest_ = parse_manifest(mpath);
  DS_CHECK(fs::exists(fs::path(dir_) / kModelFile), "checkpoint " << dir_ << ": " << kModelFile << " is missing");
  for (const auto& p : manifest_.partitions)
    DS_CHECK(fs::exists(fs::path(dir_) / p.file), "checkpoint " << dir_ << ": shard " << p.file << " (rank " << p.rank
                                                                << " of " << manifest_.world_size << ") is missing");
  shards_.resize(manifest_.partitions.size());
  shard_maps_.resize(manifest_.partitions.size());
}

CheckpointReader::~CheckpointReader() = default;

H5File& CheckpointReader::model_file() {
  if (!model_) model_ = std::make_unique<H5File>((fs::path(dir_) / kModelFile).string(), H5File::Mode::Read);
  return *model_;
}

H5File& CheckpointReader::shard_file(std::size_t i) {
  if (!shards_[i])
    shards_[i] = std::make_unique<H5File>((fs::path(dir_) / manifest_.partitions[i].file).string(), H5File::Mode::Read);
  return *shards_[i];
}

const unsigned char* CheckpointReader::raw_bytes(H5File& f, std::unique_ptr<detail::MappedFile>& map, const std::string& ds,
                                                 std::size_t bytes) {
  auto ext = f.raw_extent(ds);
  if (!ext) return nullptr;
  DS_CHECK(ext->bytes == bytes, f.path() << " dataset '" << ds << "' stores " << ext->bytes << " bytes, expected " << bytes);
  if (!map) map = std::make_unique<detail::MappedFile>(f.path());
  return map->range(ext->offset, ext->bytes, f.path() + " dataset '" + ds + "'");
}

std::uint32_t CheckpointReader::expected_crc(const std::string& file, const std::string& dataset) const {
  auto f = manifest_.checksums.find(file);
  DS_CHECK(f != manifest_.checksums.end(), dir_ << "/" << kManifestFile << " has no checksums for " << file);
  auto d = f->second.find(dataset);
  DS_CHECK(d != f->second.end(), dir_ << "/" << kManifestFile << " has no checksum for " << file << " dataset '" << dataset << "'");
  return d->second;
}

void CheckpointReader::check_model(const std::vector<ExpectedParam>& expected, bool strict) const {
  std::map<std::string, const ManifestParam*> saved;
  for (const auto& p : manifest_.params) saved[p.name] = &p;
  std::vector<std::string> problems;
  bool fatal = false;
  auto shape_str = [](const std::vector<std::int64_t>& s) {
    std::ostringstream os;
    os << "[";
    for (std::size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
    os << "]";
    return os.str();
  };
  std::map<std::string, bool> seen;
  for (const auto& e : expected) {
    seen[e.name] = true;
    auto it = saved.find(e.name);
    if (it == saved.end()) {
      problems.push_back("missing in checkpoint: " + e.name + " " + shape_str(e.shape));
      fatal |= strict;
    } else if (it->second->shape != e.shape) {
      problems.push_back("shape differs: " + e.name + " checkpoint " + shape_str(it->second->shape) + " model " +
                         shape_str(e.shape));
      fatal = true;
    }
  }
  for (const auto& p : manifest_.params) {
    if (!seen.count(p.name)) {
      problems.push_back("unexpected in checkpoint: " + p.name + " " + shape_str(p.shape));
      fatal |= strict;
    }
  }
  if (fatal) {
    std::ostringstream os;
    os << "checkpoint " << dir_ << " (" << kModelFile << ") does not match the model"
       << (strict ? " (load_module_strict)" : "") << ":";
    for (const auto& p : problems) os << "\n  " << p;
    DS_THROW(os.str());
  }
  for (const auto& p : problems) DS_WARN("checkpoint " << dir_ << ": " << p);
}

bool CheckpointReader::same_flat_layout(const std::vector<ExpectedParam>& expected) const {
  if (expected.size() != manifest_.params.size()) return false;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const auto& s = manifest_.params[i];
    if (s.name != expected[i].name || s.shape != expected[i].shape || s.flat_offset != expected[i].flat_offset) return false;
  }
  return true;
}

void CheckpointReader::verify_params(const std::vector<std::string>& names) {
  H5File& f = model_file();
  for (const auto& n : names) {
    std::string ds = "params/" + n;
    DatasetInfo di = f.info(ds);
    std::size_t bytes = di.numel() * dtype_size(di.dtype);
    std::uint32_t got = 0;
    if (const unsigned char* p = raw_bytes(f, model_map_, ds, bytes)) {
      got = detail::crc32c_parallel(p, bytes);
    } else {
      if (scratch_.bytes() < bytes) scratch_ = HostBuffer(bytes);
      f.read(ds, scratch_.data(), di.dtype, di.numel());
      got = crc32c(scratch_.data(), bytes);
    }
    std::uint32_t want = expected_crc(kModelFile, ds);
    DS_CHECK(want == got, "checksum mismatch in " << f.path() << " dataset '" << ds << "' (manifest crc32c:" << hex32(want)
                                                  << ", data crc32c:" << hex32(got) << "): the file is corrupt");
  }
}

void CheckpointReader::verify_flat_range(std::size_t offset, std::size_t count) {
  constexpr std::size_t kChunk = std::size_t(4) << 20;  // floats per read (16 MiB)
  for (std::size_t i = 0; i < manifest_.partitions.size(); ++i) {
    const auto& p = manifest_.partitions[i];
    if (p.offset >= offset + count || p.offset + p.count <= offset || count == 0) continue;
    H5File& f = shard_file(i);
    for (const auto& ds : manifest_.shard_datasets) {
      DatasetInfo di = f.info(ds);
      DS_CHECK(di.dtype == DType::F32 && di.numel() == p.count,
               f.path() << " dataset '" << ds << "' has " << di.numel() << " " << dtype_name(di.dtype)
                        << " elements; the manifest says " << p.count << " fp32");
      std::uint32_t crc = 0;
      if (const unsigned char* raw = raw_bytes(f, shard_maps_[i], ds, p.count * sizeof(float))) {
        crc = detail::crc32c_parallel(raw, p.count * sizeof(float));
      } else {
        if (scratch_.bytes() < kChunk * sizeof(float)) scratch_ = HostBuffer(kChunk * sizeof(float));
        for (std::size_t o = 0; o < p.count; o += kChunk) {
          std::size_t n = std::min(kChunk, p.count - o);
          f.read_range(ds, scratch_.data(), DType::F32, o, n);
          crc = crc32c(scratch_.data(), n * sizeof(float), crc);
        }
      }
      std::uint32_t want = expected_crc(p.file, ds);
      DS_CHECK(want == crc, "checksum mismatch in " << f.path() << " dataset '" << ds << "' (manifest crc32c:" << hex32(want)
                                                    << ", data crc32c:" << hex32(crc) << "): the file is corrupt");
    }
  }
}

void CheckpointReader::read_param(const std::string& name, void* dst, DType dst_dtype, std::size_t numel) {
  H5File& f = model_file();
  std::string ds = "params/" + name;
  DatasetInfo di = f.info(ds);
  DS_CHECK(di.numel() == numel, f.path() << " dataset '" << ds << "' has " << di.numel() << " elements, the model " << numel);
  if (const unsigned char* p = raw_bytes(f, model_map_, ds, numel * dtype_size(di.dtype))) {
    if (di.dtype == dst_dtype) {
      detail::copy_parallel(dst, p, numel * dtype_size(dst_dtype));
    } else {
      auto* d = static_cast<unsigned char*>(dst);
      const std::size_t ssz = dtype_size(di.dtype), dsz = dtype_size(dst_dtype);
      detail::parallel_ranges(numel, [&](std::size_t lo, std::size_t hi) {  // element ranges
        convert(p + lo * ssz, di.dtype, d + lo * dsz, dst_dtype, hi - lo);
      });
    }
    return;
  }
  if (di.dtype == dst_dtype) {
    f.read(ds, dst, dst_dtype, numel);
    return;
  }
  std::size_t bytes = numel * dtype_size(di.dtype);
  if (scratch_.bytes() < bytes) scratch_ = HostBuffer(bytes);
  f.read(ds, scratch_.data(), di.dtype, numel);
  convert(scratch_.data(), di.dtype, dst, dst_dtype, numel);
}

bool CheckpointReader::has_shard_dataset(const std::string& dataset) const {
  return std::find(manifest_.shard_datasets.begin(), manifest_.shard_datasets.end(), dataset) != manifest_.shard_datasets.end();
}

void CheckpointReader::read_flat(const std::string& dataset, std::size_t offset, std::size_t count, float* dst) {
  DS_CHECK(has_shard_dataset(dataset), "checkpoint " << dir_ << " has no partitioned dataset '" << dataset << "'");
  std::vector<std::pair<std::size_t, std::size_t>> covered;
  for (std::size_t i = 0; i < manifest_.partitions.size(); ++i) {
    const auto& p = manifest_.partitions[i];
    std::size_t lo = std::max(offset, p.offset), hi = std::min(offset + count, p.offset + p.count);
    if (lo >= hi) continue;
    H5File& f = shard_file(i);
    DatasetInfo di = f.info(dataset);
    DS_CHECK(di.dtype == DType::F32 && di.numel() == p.count,
             f.path() << " dataset '" << dataset << "' has " << di.numel() << " " << dtype_name(di.dtype)
                      << " elements; the manifest says " << p.count << " fp32");
    if (const unsigned char* raw = raw_bytes(f, shard_maps_[i], dataset, p.count * sizeof(float)))
      detail::copy_parallel(dst + (lo - offset), raw + (lo - p.offset) * sizeof(float), (hi - lo) * sizeof(float));
    else
      f.read_range(dataset, dst + (lo - offset), DType::F32, lo - p.offset, hi - lo);
    covered.emplace_back(lo, hi);
  }
  std::sort(covered.begin(), covered.end());
  std::size_t pos = offset;
  for (auto [lo, hi] : covered) {
    if (lo > pos) std::fill(dst + (pos - offset), dst + (lo - offset), 0.0f);
    pos = std::max(pos, hi);
  }
  if (pos < offset + count) std::fill(dst + (pos - offset), dst + count, 0.0f);
}

StateValue CheckpointReader::engine_state() { return model_file().read_state("engine"); }
StateValue CheckpointReader::client_state() { return model_file().read_state("client_state"); }
std::string CheckpointReader::config_json() { return model_file().attr_string("/", "config"); }

}  // namespace ds::io

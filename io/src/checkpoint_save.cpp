// Saving a checkpoint: begin_save (collective), write_local (this rank's files), commit_save
// (collective; rank 0 writes the manifest and renames the tmp dir into place). The protocol
// and its crash safety: docs/user/checkpoints.md.
#include "ds/io/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>

#include "checkpoint_internal.h"
#include "ds/core/error.h"
#include "ds/core/file_read.h"
#include "ds/core/hash.h"
#include "ds/core/log.h"
#include "ds/io/checksum.h"
#include "raw_io.h"
#include "save_claim.h"

namespace fs = std::filesystem;

namespace ds::io {

namespace {

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

// Rank 0's random save id (48 bits), which names the temporary directory.
std::uint64_t random_save_id() {
  std::random_device rd;
  return ((std::uint64_t(rd()) << 32) ^ rd() ^ std::uint64_t(::getpid()) ^
          std::uint64_t(std::chrono::steady_clock::now().time_since_epoch().count())) & 0xffffffffffffull;
}

// The first collective, under a deadline (the communicator's unless the options set one): tag
// and layout hashes and rank 0's random save id. A rank that is alone in save_checkpoint times
// out here. Returns the tag every rank saves under; `id` receives the agreed save id.
std::string agree_on_tag(Communicator& comm, const std::string& save_dir, const std::string& tag,
                         const SaveOptions& options, const CheckpointContent& content, std::uint64_t& id) {
  const int rank = comm.rank();
  const double timeout = options.collective_timeout_s >= 0 ? options.collective_timeout_s : comm.timeout();
  const detail::SaveAgreement agreed =
      detail::agree_on_save(comm, fnv1a64(tag), fnv1a64(layout_signature(content)),
                            rank == 0 ? random_save_id() : 0, timeout, save_dir, tag);
  id = agreed.id;
  DS_CHECK(agreed.same_layout,
           "save_checkpoint: ranks disagree on what they save (ZeRO stage, flat length, dtype or optimizer state); "
           "this rank: " << layout_signature(content));
  if (agreed.same_tag) return tag;
  DS_CHECK(options.tag_validation != TagValidation::Fail,
           "[rank=" << rank << "] The checkpoint tag name '" << tag
                    << "' is not consistent across all ranks (checkpoint.tag_validation = Fail)");
  // Warn / Ignore: every rank adopts rank 0's tag so the shards land in one directory.
  const std::string t0 = detail::broadcast_tag(comm, tag);
  if (options.tag_validation == TagValidation::Warn) {
    DS_WARN("[rank=" << rank << "] The checkpoint tag name '" << tag
                     << "' is not consistent across all ranks; saving under rank 0's tag '" << t0 << "'");
  }
  return t0;
}

PendingSave pending_save(const std::string& save_dir, const std::string& tag, const SaveOptions& options,
                         std::uint64_t id, int world_size, const CheckpointContent& content) {
  PendingSave p;
  p.save_dir = save_dir;
  p.tag = tag;
  p.options = options;
  p.id = id;
  p.world_size = world_size;
  p.num_shard_datasets = content.shard.size();
  p.final_dir = (fs::path(save_dir) / tag).string();
  char idhex[32];
  std::snprintf(idhex, sizeof idhex, "%012llx", static_cast<unsigned long long>(p.id));
  p.tmp_dir = (fs::path(save_dir) / (tag + ".tmp-" + idhex)).string();
  return p;
}

// Rank 0 creates the save directory and claims the temporary one. Returns the status the
// ranks share: 0 ready, 1 the tag exists (and overwrite is off), 2 failed (`error` says why).
std::int64_t prepare_dirs_on_rank0(PendingSave& p, std::string& error) {
  try {
    std::error_code ec;
    fs::create_directories(p.save_dir, ec);
    DS_CHECK(!ec && fs::is_directory(p.save_dir), "cannot create checkpoint directory " << p.save_dir << ": " << ec.message());
    p.tag_seen = dir_identity(p.final_dir);  // the commit places the save only over this
    if (p.tag_seen.exists && !p.options.overwrite) return 1;
    clean_stale_tmp_dirs(p.save_dir);
    try {
      p.claim = detail::create_claimed_dir(p.tmp_dir);  // the marker goes in first, locked
      p.tmp_made = dir_identity(p.tmp_dir);
      fsync_path(p.save_dir);
    } catch (...) {
      p.claim.reset();
      fs::remove_all(p.tmp_dir, ec);
      throw;
    }
    return 0;
  } catch (const std::exception& e) {
    error = e.what();
    return 2;
  }
}

}  // namespace

PendingSave begin_save(Communicator& comm, const std::string& save_dir, const std::string& tag_in,
                       const SaveOptions& options, const CheckpointContent& content) {
  DS_CHECK(!save_dir.empty(), "save_checkpoint: save_dir is empty");
  check_tag(tag_in);
  const int rank = comm.rank();
  std::uint64_t id = 0;
  const std::string tag = agree_on_tag(comm, save_dir, tag_in, options, content, id);
  PendingSave p = pending_save(save_dir, tag, options, id, comm.size(), content);

  // Rank 0 prepares the directory; the status all-reduce orders it before any rank writes.
  std::string rank0_error;
  const std::int64_t status = detail::max_status(comm, rank == 0 ? prepare_dirs_on_rank0(p, rank0_error) : 0);
  DS_CHECK(status != 1, "checkpoint tag '" << tag << "' already exists in " << save_dir << " (" << p.final_dir
                                           << "); an existing tag is never overwritten unless overwrite is set");
  if (status == 2) {
    if (rank == 0) throw Error(rank0_error);
    DS_THROW("save_checkpoint: rank 0 could not prepare " << p.tmp_dir << " (see rank 0's message)");
  }
  p.active = true;
  detail::test_kill_point("begin", rank);
  return p;
}

namespace {

// HDF5 lays out both files (metadata, attributes, state trees, and storage for every tensor
// dataset, allocated but not written) and closes them; then the tensors' bytes go to their
// extents through detail::write_raw (parallel chunks, CRC per chunk, writeback started per
// chunk), and every file is fsynced once, after all writes were issued. The plan between.
struct RawWritePlan {
  struct Out {
    std::string path;
    int fd = -1;
  };
  struct JobInfo {
    std::size_t file;                               // index into files
    std::map<std::string, std::uint32_t>* crc_map;  // where the job's CRC goes
    std::string name;
  };
  std::vector<Out> files;
  std::vector<detail::RawWrite> jobs;
  std::vector<JobInfo> job_info;
  std::size_t first_shard_job = std::size_t(-1);

  void close_fds() {
    for (auto& f : files)
      if (f.fd >= 0) { ::close(f.fd); f.fd = -1; }
  }
};

// What the manifest needs from this rank, before anything is written.
LocalWriteResult local_result_header(const CheckpointContent& c) {
  LocalWriteResult res;
  res.working_dtype = c.working_dtype;
  res.zero_stage = c.zero_stage;
  res.flat_numel = c.flat_numel;
  res.has_shard = c.has_shard;
  res.shard_offset = c.shard_offset;
  res.shard_count = c.shard_count;
  for (const auto& r : c.shard_ranges)
    if (r.count > 0) res.shard_ranges.push_back(r);
  if (!res.shard_ranges.empty()) res.shard_offset = res.shard_ranges.front().offset;
  res.params_in_master = c.params_in_master;
  for (const auto& s : c.shard) res.shard_names.push_back(s.name);
  if (c.engine_state.is_map() && c.engine_state.contains("global_steps") && c.engine_state.at("global_steps").is_int())
    res.global_steps = c.engine_state.at("global_steps").as_int();
  return res;
}

void check_local_content(const PendingSave& pending, int rank, const CheckpointContent& c,
                         const LocalWriteResult& res) {
  DS_CHECK(pending.active, "write_local: no save in progress");
  if (c.has_shard && !res.shard_ranges.empty()) {
    const std::string problem = detail::local_ranges_problem(res.shard_ranges, c.shard_count, c.flat_numel);
    DS_CHECK(problem.empty(), "save_checkpoint to " << pending.final_dir << ": rank " << rank << ": " << problem);
  }
  if (c.params_in_master) {
    bool master = false;
    for (const auto& t : c.shard) master |= t.name == "fp32_master";
    DS_CHECK(master, "save_checkpoint to " << pending.final_dir
                                           << ": params_in_master needs an fp32_master shard dataset");
  }
}

// Rank 0's model file: attributes, the parameters' datasets (unless params_in_master) and
// the state trees; the parameters' bytes are planned, not written.
void lay_out_model_file(const PendingSave& pending, const CheckpointContent& c, LocalWriteResult& res,
                        RawWritePlan& plan) {
  std::size_t need = 65536 + state_bytes(c.engine_state) + state_bytes(c.client_state) + c.config_json.size();
  for (const auto& pr : c.params) need += 4096 + (c.params_in_master ? 0 : pr.numel() * dtype_size(pr.dtype));
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
  f.set_attr("/", "params_in_master", std::int64_t(c.params_in_master ? 1 : 0));
  for (const auto& pr : c.params) {
    DS_CHECK(!pr.name.empty() && pr.name.find('/') == std::string::npos,
             "parameter name '" << pr.name << "' cannot be a checkpoint dataset name (empty or contains '/')");
    ParamRecord meta = pr;
    meta.data = nullptr;
    res.params_meta.push_back(std::move(meta));
    if (c.params_in_master) continue;  // the manifest lists it; the weights are in fp32_master
    std::string ds = "params/" + pr.name;
    std::size_t bytes = pr.numel() * dtype_size(pr.dtype);
    auto ext = f.create_raw(ds, pr.dtype, pr.shape);
    f.set_attr(ds, "flat_offset", std::int64_t(pr.flat_offset));
    if (ext) {
      DS_CHECK(ext->bytes == bytes, "HDF5 allocated " << ext->bytes << " bytes for " << path << " dataset " << ds << ", expected " << bytes);
      plan.jobs.push_back({-1, ext->offset, pr.data, bytes, path + " dataset " + ds});
      plan.job_info.push_back({plan.files.size(), &res.model_crc, ds});
    } else {
      res.model_crc[ds] = crc32c(pr.data, bytes);
    }
  }
  f.write_state("engine", c.engine_state);
  f.write_state("client_state", c.client_state);
  f.close(/*sync=*/false);
  plan.files.push_back({path});
}

// This rank's shard file: attributes and one fp32 dataset per shard tensor, bytes planned.
void lay_out_shard_file(const PendingSave& pending, int rank, const CheckpointContent& c, LocalWriteResult& res,
                        RawWritePlan& plan) {
  const std::string path = (fs::path(pending.tmp_dir) / shard_file_name(rank)).string();
  ensure_space(path, 65536 + c.shard.size() * (4096 + c.shard_count * sizeof(float)));
  H5File s(path, H5File::Mode::Create);
  s.set_attr("/", "format", "dstrain-checkpoint-shard");
  s.set_attr("/", "format_version", std::int64_t(kFormatVersion));
  s.set_attr("/", "rank", std::int64_t(rank));
  s.set_attr("/", "world_size", std::int64_t(pending.world_size));
  s.set_attr("/", "zero_stage", std::int64_t(c.zero_stage));
  s.set_attr("/", "offset", std::int64_t(res.shard_offset));
  s.set_attr("/", "count", std::int64_t(c.shard_count));
  s.set_attr("/", "flat_numel", std::int64_t(c.flat_numel));
  if (!res.shard_ranges.empty()) {  // for a reader without the manifest: [[offset, count], ...]
    std::ostringstream rs;
    for (std::size_t i = 0; i < res.shard_ranges.size(); ++i)
      rs << (i ? ", [" : "[[") << res.shard_ranges[i].offset << ", " << res.shard_ranges[i].count << "]";
    rs << "]";
    s.set_attr("/", "ranges", rs.str());
  }
  const std::size_t bytes = c.shard_count * sizeof(float);
  const std::int64_t n = std::int64_t(c.shard_count);
  for (const auto& t : c.shard) {
    auto ext = s.create_raw(t.name, DType::F32, std::span<const std::int64_t>(&n, 1));
    if (ext) {
      if (plan.first_shard_job == std::size_t(-1)) plan.first_shard_job = plan.jobs.size();
      plan.jobs.push_back({-1, ext->offset, t.data, bytes, path + " dataset " + t.name});
      plan.job_info.push_back({plan.files.size(), &res.shard_crc, t.name});
    } else {
      res.shard_crc[t.name] = crc32c(t.data, bytes);
    }
  }
  s.close(/*sync=*/false);
  plan.files.push_back({path});
}

// The planned bytes into the laid-out files, their CRCs into the result, one fsync per file.
void write_planned(RawWritePlan& plan, const PendingSave& pending, int rank, bool has_shard) {
  for (auto& f : plan.files) {
    f.fd = ::open(f.path.c_str(), O_WRONLY | O_CLOEXEC);
    DS_CHECK(f.fd >= 0, "cannot open " << f.path << " for writing: " << std::strerror(errno));
  }
  for (std::size_t i = 0; i < plan.jobs.size(); ++i) plan.jobs[i].fd = plan.files[plan.job_info[i].file].fd;
  if (plan.first_shard_job == std::size_t(-1) && has_shard) detail::test_kill_point("shard_write", rank);
  std::vector<std::uint32_t> crcs = detail::write_raw(
      plan.jobs, [&](std::size_t job) {
        if (job == plan.first_shard_job) detail::test_kill_point("shard_write", rank);
      },
      pending.options.io_threads);
  for (std::size_t i = 0; i < plan.jobs.size(); ++i) (*plan.job_info[i].crc_map)[plan.job_info[i].name] = crcs[i];
  for (auto& f : plan.files) {
    int rc = ::fsync(f.fd);
    int err = errno;
    DS_CHECK(rc == 0, "fsync of " << f.path << " failed: " << std::strerror(err));
  }
}

}  // namespace

LocalWriteResult write_local(const PendingSave& pending, int rank, const CheckpointContent& c) {
  LocalWriteResult res = local_result_header(c);
  RawWritePlan plan;
  try {
    check_local_content(pending, rank, c, res);
    if (rank == 0) lay_out_model_file(pending, c, res, plan);
    if (c.has_shard) lay_out_shard_file(pending, rank, c, res, plan);
    write_planned(plan, pending, rank, c.has_shard);
    plan.close_fds();
    res.ok = true;
  } catch (const std::exception& e) {
    plan.close_fds();
    res.ok = false;
    res.error = e.what();
  }
  return res;
}

namespace {

// This rank's part of the verdict: whether it wrote, its ranges and its shard CRCs.
detail::ShardReport shard_report(const PendingSave& pending, const LocalWriteResult& local) {
  const std::size_t k = pending.num_shard_datasets;
  detail::ShardReport mine;
  mine.ok = local.ok && local.shard_names.size() == k;
  mine.has_shard = local.has_shard;
  mine.offset = local.shard_offset;
  mine.count = local.shard_count;
  mine.ranges = local.shard_ranges;
  for (std::size_t i = 0; i < k; ++i) {
    auto it = mine.ok && local.has_shard ? local.shard_crc.find(local.shard_names[i]) : local.shard_crc.end();
    mine.crcs.push_back(it == local.shard_crc.end() ? 0 : it->second);
  }
  return mine;
}

// Multi-range shards: every rank sees every report, so all reach the same verdict on the
// tiling without another collective. Empty when the ranges tile the flat space (or there are none).
std::string tiling_of(const std::vector<detail::ShardReport>& reports, const LocalWriteResult& local) {
  bool ranged = local.params_in_master;
  std::vector<detail::RankRange> ranges;
  for (int r = 0; r < int(reports.size()); ++r) {
    const detail::ShardReport& rr = reports[std::size_t(r)];
    if (!rr.has_shard) continue;
    ranged |= !rr.ranges.empty();
    if (rr.ranges.empty()) ranges.push_back({r, rr.offset, rr.count});
    for (const auto& g : rr.ranges) ranges.push_back({r, g.offset, g.count});
  }
  return ranged ? detail::tiling_problem(ranges, local.flat_numel) : std::string();
}

// Every rank throws the same verdict when a rank failed or the shards do not tile; rank 0
// removes the uncommitted directory first.
void check_reports(int rank, PendingSave& pending, const LocalWriteResult& local,
                   const std::vector<detail::ShardReport>& reports) {
  std::vector<int> failed;
  for (int r = 0; r < int(reports.size()); ++r)
    if (!reports[std::size_t(r)].ok) failed.push_back(r);
  const std::string tiling = failed.empty() ? tiling_of(reports, local) : std::string();
  if (tiling.empty() && failed.empty()) return;
  if (rank == 0) {
    std::error_code ec;
    fs::remove_all(pending.tmp_dir, ec);
    pending.claim.reset();
  }
  if (!tiling.empty())
    DS_THROW("save_checkpoint to " << pending.final_dir << ": the ranks' shard ranges do not cover the flat space [0, "
                                   << local.flat_numel << ") exactly once: " << tiling
                                   << "; nothing committed, the previous checkpoint and 'latest' are untouched");
  if (!local.ok) DS_THROW("save_checkpoint to " << pending.final_dir << " failed (nothing committed; the previous "
                          "checkpoint and 'latest' are untouched): " << local.error);
  std::ostringstream ranks;
  for (int r : failed) ranks << (ranks.tellp() ? "," : "") << r;
  DS_THROW("save_checkpoint to " << pending.final_dir << " failed on rank(s) " << ranks.str()
                                 << " (see their messages); nothing committed, the previous checkpoint and 'latest' are untouched");
}

// Rank 0: the manifest, the rename into place and `latest`. Returns the error, or "".
std::string commit_on_rank0(PendingSave& pending, int size, const LocalWriteResult& local,
                            const std::vector<detail::ShardReport>& reports) {
  std::string commit_error;
  try {
    detail::write_text_file_synced((fs::path(pending.tmp_dir) / kManifestFile).string(),
                                   detail::manifest_text(pending, size, local, reports));
    fsync_path(pending.tmp_dir);
    detail::test_kill_point("before_rename", 0);
    detail::place_tag(pending);
    fsync_path(pending.save_dir);
    // The committed tag needs no marker (only tmp names are ever cleaned); best effort.
    ::unlink((fs::path(pending.final_dir) / detail::kSaveMarker).c_str());
    detail::test_kill_point("before_latest", 0);
    if (pending.options.save_latest) detail::move_latest(pending, local.global_steps);
    detail::test_kill_point("after_latest", 0);
  } catch (const std::exception& e) {
    commit_error = e.what();
    if (commit_error.empty()) commit_error = "unknown error";
    // Only while the tmp name still holds this save's directory (after a failed exchange it
    // could hold another writer's checkpoint).
    std::error_code ec;
    if (dir_identity(pending.tmp_dir) == pending.tmp_made) fs::remove_all(pending.tmp_dir, ec);
  }
  pending.claim.reset();  // the save is over: committed, or its tmp dir removed
  return commit_error;
}

}  // namespace

std::string commit_save(Communicator& comm, PendingSave& pending, const LocalWriteResult& local) {
  DS_CHECK(pending.active, "commit_save: no save in progress");
  pending.active = false;
  const int rank = comm.rank(), size = comm.size();
  const std::vector<detail::ShardReport> reports =
      detail::gather_reports(comm, shard_report(pending, local), pending.num_shard_datasets);
  check_reports(rank, pending, local, reports);
  detail::test_kill_point("before_manifest", rank);

  std::string commit_error;
  if (rank == 0) commit_error = commit_on_rank0(pending, size, local, reports);
  const std::int64_t commit_status = detail::max_status(comm, commit_error.empty() ? 0 : 1);
  if (commit_status != 0) {
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

}  // namespace ds::io

// The dstrain checkpoint store: sharded HDF5 files, a JSON manifest, an atomic commit, and
// elastic (re-partitioning) reads. docs/user/checkpoints.md documents the layout and protocol.
//
//   save_dir/latest                    the newest complete tag (text, no newline)
//   save_dir/<tag>/model_states.h5     params/<name> (full tensors, working dtype), engine/
//                                      (counters, scheduler, scaler, ...), client_state/, config
//   save_dir/<tag>/zero_rank_<r>.h5    this rank's part of the flat fp32 master and of every
//                                      optimizer state tensor: one contiguous slice (stages
//                                      0-2) or several ranges end to end (stage 3)
//   save_dir/<tag>/manifest.json       format version, world size, ZeRO stage, dtypes, shapes,
//                                      partition map (one entry per range), CRC-32C of every
//                                      tensor dataset
//
// Stage 3 (no rank holds the working parameters whole): CheckpointContent::shard_ranges gives
// each rank's ranges of the dense flat space and params_in_master says that no params/<name>
// datasets are written; the manifest still lists every parameter, and read_param rebuilds it
// from the fp32 master rounded to the working dtype. Any stage reads any other's checkpoint.
//
// This layer knows nothing about the engine: the engine (src/engine/src/engine_checkpoint.cpp)
// describes what it saves with CheckpointContent and reads back through CheckpointReader.
// Collective calls take the data-parallel Communicator; every rank calls them in order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ds/core/buffer.h"
#include "ds/core/dtype.h"
#include "ds/io/h5file.h"
#include "ds/io/state_value.h"
#include "ds/mpi/communicator.h"

namespace ds::io {

namespace detail {
class MappedFile;
}

inline constexpr int kFormatVersion = 1;
inline constexpr const char* kModelFile = "model_states.h5";
inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr const char* kLatestFile = "latest";
std::string shard_file_name(int rank);  // "zero_rank_<r>.h5"

enum class TagValidation { Ignore, Warn, Fail };
// "Ignore" | "Warn" | "Fail", case-insensitive (DeepSpeed's checkpoint.tag_validation).
TagValidation parse_tag_validation(std::string_view s);

// One module parameter, full tensor, as the engine holds it (rank 0's copy is written).
struct ParamRecord {
  std::string name;  // no '/' (a dataset name under params/)
  std::vector<std::int64_t> shape;
  DType dtype = DType::F32;  // working dtype: F32 | F16 | BF16
  const void* data = nullptr;
  std::size_t flat_offset = 0;  // global element offset in the engine's flat space
  std::size_t numel() const;
};

// One partitioned flat fp32 tensor: this rank's slice [shard_offset, shard_offset + count), or
// its shard_ranges end to end.
struct ShardTensor {
  std::string name;  // "fp32_master", "optim/exp_avg", ... (same names on every rank)
  const float* data = nullptr;
};

// A range of the dense flat space (every parameter end to end, no padding).
struct ShardRange {
  std::size_t offset = 0;
  std::size_t count = 0;
};

struct CheckpointContent {
  std::vector<ParamRecord> params;
  std::string working_dtype = "fp32";
  int zero_stage = 0;
  std::size_t flat_numel = 0;     // length of the flat space (padding included)
  bool has_shard = true;          // false: this rank writes no shard (stage 0: only rank 0)
  std::size_t shard_offset = 0;   // global element offset of this rank's slice
  std::size_t shard_count = 0;    // elements in the slice
  // Several ranges (ZeRO stage 3: one piece of every parameter group): when non-empty, this
  // rank's shard datasets hold these ranges end to end, shard_count elements in all (the sum
  // of the counts), and shard_offset is not used. Ranges are in increasing offset order and
  // do not overlap; a rank with nothing to save leaves them empty with shard_count 0. When
  // any rank gives ranges, the ranks' ranges together must tile [0, flat_numel) exactly
  // (commit_save fails otherwise, naming the checkpoint and the overlap or gap).
  std::vector<ShardRange> shard_ranges;
  // No rank holds the working parameters whole (stage 3): params carry names, shapes, dtype
  // and offsets only (data is not read), no params/<name> datasets are written, and the
  // weights are the fp32 master rounded to the working dtype (the shards must hold
  // "fp32_master"). Every rank passes the same value.
  bool params_in_master = false;
  std::vector<ShardTensor> shard;
  StateValue engine_state;        // counters, scheduler, scaler, optimizer scalars (replicated)
  StateValue client_state;        // the user's tree
  std::string config_json;        // ds_config as written
};

struct SaveOptions {
  // Move `latest` to this tag, unless `latest` names a checkpoint of a later global step (the
  // manifests' global_steps): `latest` only moves forward.
  bool save_latest = true;
  // Replace an existing <tag> (atomically, renameat2 RENAME_EXCHANGE), but only the copy that
  // begin_save saw: one replaced or created by another writer since fails the commit.
  bool overwrite = false;
  TagValidation tag_validation = TagValidation::Warn;
  // Deadline of the save's first collective: a save entered by only some ranks fails with a
  // clear error instead of hanging. < 0: the communicator's deadline (Communicator::timeout():
  // comms_config.timeout or DS_COMM_TIMEOUT); 0: none.
  double collective_timeout_s = -1;
  // Threads that write one checkpoint file (config checkpoint.io_threads); 0: automatic, the
  // hardware threads, at most 4.
  int io_threads = 0;
};

// A directory entry's identity (lstat's device and inode), or its absence.
struct DirIdentity {
  bool exists = false;
  std::uint64_t dev = 0, ino = 0;
  bool operator==(const DirIdentity&) const = default;
};
DirIdentity dir_identity(const std::string& path);

// Saving in three steps, so that the file writing can run on a background thread while the
// collectives stay on the caller's thread (async save):
//   begin_save   (collective)  tag validation under a deadline, tmp dir created
//   write_local  (local)       this rank's files into the tmp dir, fsynced; no collectives
//   commit_save  (collective)  failure flags + checksums gathered; rank 0 writes the manifest,
//                              renames the tmp dir to <tag> (never over a tag it did not see
//                              at begin_save: another job's commit of the same tag in between
//                              fails this save), then moves `latest` forward
// save_checkpoint() runs the three in a row.
struct PendingSave {
  std::string save_dir, tag, tmp_dir, final_dir;
  SaveOptions options;
  std::uint64_t id = 0;          // shared by every rank (names the tmp dir)
  int world_size = 1;
  std::size_t num_shard_datasets = 0;
  bool active = false;
  // Rank 0: the lock on the tmp dir's marker file, held until the save ends, so that no
  // other save (this job's or another's) takes the tmp dir for abandoned and removes it.
  std::shared_ptr<void> claim;
  // Rank 0: <tag> as begin_save saw it (absent, or the copy an overwrite may replace), and the
  // tmp dir it created (a failed commit removes the tmp name only while it is still that one).
  DirIdentity tag_seen, tmp_made;
};

struct LocalWriteResult {
  bool ok = false;
  std::string error;  // what failed, when !ok
  // CRC-32C per dataset written by this rank ("params/<name>" in the model file, shard names).
  std::map<std::string, std::uint32_t> model_crc, shard_crc;
  // What the manifest needs from rank 0 (filled on rank 0).
  std::vector<ParamRecord> params_meta;  // data == nullptr
  std::string working_dtype;
  int zero_stage = 0;
  std::size_t flat_numel = 0;
  bool has_shard = false;
  std::size_t shard_offset = 0, shard_count = 0;
  std::vector<ShardRange> shard_ranges;  // CheckpointContent::shard_ranges (empty: one slice)
  bool params_in_master = false;
  std::vector<std::string> shard_names;
  std::int64_t global_steps = -1;  // the engine state's "global_steps" (rank 0); -1: it has none
};

// `content` is only inspected for its layout (layout_signature) here.
PendingSave begin_save(Communicator& comm, const std::string& save_dir, const std::string& tag,
                       const SaveOptions& options, const CheckpointContent& content);
LocalWriteResult write_local(const PendingSave& pending, int rank, const CheckpointContent& content);
// Returns the committed checkpoint directory. On any rank's failure every rank throws and the
// tmp dir is removed; the previous checkpoint and `latest` are untouched.
std::string commit_save(Communicator& comm, PendingSave& pending, const LocalWriteResult& local);

std::string save_checkpoint(Communicator& comm, const std::string& save_dir, const std::string& tag,
                            const CheckpointContent& content, const SaveOptions& options = SaveOptions());

// A signature of what every rank must agree on (zero stage, flat length, shard names,
// params_in_master);
// begin_save fails when ranks disagree.
std::string layout_signature(const CheckpointContent& content);

// ---------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------

// The tag in <load_dir>/latest (whitespace stripped); std::nullopt when there is no `latest`
// (DeepSpeed returns (None, None)). ds::Error when load_dir does not exist.
std::optional<std::string> read_latest(const std::string& load_dir);

struct ManifestParam {
  std::string name;
  std::vector<std::int64_t> shape;
  std::string dtype;
  std::size_t flat_offset = 0, numel = 0;
};
// One range of the flat space held by one rank's file: flat elements [offset, offset + count)
// are elements [position, position + count) of the file's shard datasets. One entry per rank
// for a contiguous slice (position 0), one per range for a multi-range (stage 3) shard.
struct ManifestPartition {
  int rank = 0;
  std::string file;
  std::size_t offset = 0, count = 0;
  std::size_t position = 0;  // manifest "position"; absent (older checkpoints): 0
};
struct Manifest {
  int format_version = 0;
  std::string tag;
  int world_size = 0;
  int zero_stage = 0;
  std::string working_dtype;
  std::size_t flat_numel = 0;
  std::vector<ManifestParam> params;
  std::vector<std::string> shard_datasets;
  std::vector<ManifestPartition> partitions;
  std::map<std::string, std::map<std::string, std::uint32_t>> checksums;  // file -> dataset -> crc
  // Partitions carry "position" (multi-range shards): they were checked to tile
  // [0, flat_numel) exactly when the manifest was read.
  bool shard_ranges = false;
  // No params/<name> datasets: the weights are "fp32_master" rounded to working_dtype.
  bool params_in_master = false;
  std::int64_t global_steps = -1;  // the engine's step at the save; -1: not recorded
  std::string writer;              // "pid 12 on host h" of the saving rank 0; "": not recorded
};

// Expected parameter (name + shape) for model checks.
struct ExpectedParam {
  std::string name;
  std::vector<std::int64_t> shape;
  std::size_t flat_offset = 0;
};

struct LoadOptions {
  // Threads that checksum and copy one checkpoint file (config checkpoint.io_threads); 0:
  // automatic, the hardware threads, at most 4.
  int io_threads = 0;
};

class CheckpointReader {
 public:
  // Opens <load_dir>/<tag>: checks the directory, manifest (format version), and that every
  // file it names exists. Errors name the path.
  CheckpointReader(const std::string& load_dir, const std::string& tag, const LoadOptions& options = {});
  ~CheckpointReader();

  const Manifest& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }

  // Names / shapes check. Returns the list of problems (one line each): missing from the
  // checkpoint, unexpected in it, shape differs. strict: missing and unexpected are errors;
  // a shape difference always is. Throws ds::Error listing all problems.
  void check_model(const std::vector<ExpectedParam>& expected, bool strict) const;
  // True when the saved flat layout equals `expected` (same offsets), so flat (master,
  // optimizer) state can be re-cut into the new partitioning.
  bool same_flat_layout(const std::vector<ExpectedParam>& expected) const;
  // True when every expected parameter is saved with its shape at its offset (a run of the
  // saved model: a pipeline stage's parameters), so its flat state can be read.
  bool holds_flat_layout(const std::vector<ExpectedParam>& expected) const;

  // Checksums: the model file's params (params_in_master: the fp32_master datasets of the
  // shard files holding the parameters' ranges), and every shard dataset of the files holding
  // part of [offset, offset + count) of the flat space. A file is checksummed once per reader. ds::Error naming file and dataset on mismatch. Contiguous
  // datasets (all that dstrain writes) are checksummed in place in the read-only mapped file
  // (no copy, io threads in parallel); others are streamed through a bounded scratch buffer.
  // Nothing outside the reader is written, so a caller can verify everything first and only
  // then read into live state (the engine does).
  void verify_params(const std::vector<std::string>& names);
  void verify_flat_range(std::size_t offset, std::size_t count);

  // Reads parameter `name` into dst (numel elements of dst_dtype, converting from the saved
  // dtype when they differ; params_in_master: its range of "fp32_master" via read_flat,
  // rounded to dst_dtype to nearest even as ds::convert does). Contiguous datasets are copied (or converted) straight from the
  // mapped file on the io threads; others go through HDF5 and a reused scratch buffer.
  void read_param(const std::string& name, void* dst, DType dst_dtype, std::size_t numel);
  // Elements [first, first + count) of parameter `name` alone, as read_param gives them (a
  // stage-3 rank reads only its piece of each tensor). Contiguous datasets and
  // params_in_master read just the range; others read the whole tensor into scratch first.
  void read_param_range(const std::string& name, std::size_t first, std::size_t count, void* dst, DType dst_dtype);
  // Elastic read of the flat fp32 tensor `dataset` ("fp32_master", ...): elements
  // [offset, offset + count) gathered from every old shard overlapping them (copies from the
  // mapped file, or HDF5 hyperslab reads into dst, no intermediate copy); elements beyond
  // every old shard (padding) become 0.
  void read_flat(const std::string& dataset, std::size_t offset, std::size_t count, float* dst);
  bool has_shard_dataset(const std::string& dataset) const;

  StateValue engine_state();
  StateValue client_state();
  std::string config_json();

 private:
  H5File& model_file();
  H5File& shard_file(std::size_t file_index);
  // Checksums `datasets` of shard file fi (each once per reader).
  void verify_shard_file(std::size_t fi, const std::vector<std::string>& datasets);
  const ManifestParam& manifest_param(const std::string& name) const;
  std::uint32_t expected_crc(const std::string& file, const std::string& dataset) const;
  // The bytes of dataset `ds` of f straight from the mapped file (mapping it on first use), or
  // nullptr when the dataset is not one contiguous run in the file (HDF5 reads it then).
  const unsigned char* raw_bytes(H5File& f, std::unique_ptr<detail::MappedFile>& map, const std::string& ds,
                                 std::size_t bytes);
  std::string dir_;
  Manifest manifest_;
  std::unique_ptr<H5File> model_;
  // The distinct shard files (several partitions name one file when a rank saved ranges),
  // each partition's index into them, and each file's dataset length.
  std::vector<std::string> files_;
  std::vector<std::size_t> part_file_;
  std::vector<std::size_t> file_numel_;
  std::set<std::pair<std::size_t, std::string>> verified_;  // (file, dataset) checksummed
  std::vector<std::unique_ptr<H5File>> shards_;
  std::unique_ptr<detail::MappedFile> model_map_;
  std::vector<std::unique_ptr<detail::MappedFile>> shard_maps_;
  HostBuffer scratch_;  // reused for conversions and checksum streaming
  int io_threads_ = 0;  // LoadOptions::io_threads
};

// Removes the tmp directories ("<tag>.tmp-<12 hex digits>" holding dstrain's marker file) that
// interrupted saves left behind, only where the writer is provably gone: its lock is free and
// its recorded process (pid, host, start time) no longer runs. Anything else in save_dir --
// users' files, another job's save in progress, a writer on another host -- is left alone.
// Returns how many were removed.
int clean_stale_tmp_dirs(const std::string& save_dir);

}  // namespace ds::io

// manifest.json: what rank 0 writes at commit and what the reader checks (format:
// docs/user/checkpoints.md).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>

#include "checkpoint_internal.h"
#include "ds/core/error.h"
#include "ds/core/file_read.h"
#include "save_claim.h"

namespace ds::io::detail {

std::string manifest_text(const PendingSave& pending, int size, const LocalWriteResult& local,
                          const std::vector<ShardReport>& reports) {
  const std::size_t k = pending.num_shard_datasets;
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
  m["params_in_master"] = local.params_in_master;
  // Who saved, and at which step: a job that loses a race for the same tag names this writer,
  // and `latest` is moved only to a checkpoint at least as late as the one it names.
  if (local.global_steps >= 0) m["global_steps"] = local.global_steps;
  m["writer"] = writer_description();
  // Multi-range shards (stage 3): one partition per range, each with its position inside the
  // rank's datasets; written only then, so a contiguous checkpoint's manifest is unchanged.
  bool ranged = false;
  for (const auto& rr : reports) ranged |= rr.has_shard && !rr.ranges.empty();
  nlohmann::json parts = nlohmann::json::array();
  nlohmann::json sums = nlohmann::json::object();
  nlohmann::json model_sums = nlohmann::json::object();
  for (const auto& [ds, crc] : local.model_crc) model_sums[ds] = "crc32c:" + hex32(crc);
  sums[kModelFile] = model_sums;
  for (int r = 0; r < size; ++r) {
    const ShardReport& rr = reports[std::size_t(r)];
    if (!rr.has_shard) continue;
    std::string file = shard_file_name(r);
    if (rr.ranges.empty()) {
      nlohmann::json e = {{"rank", r}, {"file", file}, {"offset", rr.offset}, {"count", rr.count}};
      if (ranged) e["position"] = 0;
      parts.push_back(e);
    }
    std::size_t position = 0;
    for (const auto& rg : rr.ranges) {
      parts.push_back({{"rank", r}, {"file", file}, {"offset", rg.offset}, {"count", rg.count}, {"position", position}});
      position += rg.count;
    }
    nlohmann::json fsums = nlohmann::json::object();
    for (std::size_t i = 0; i < k; ++i) fsums[local.shard_names[i]] = "crc32c:" + hex32(rr.crcs[i]);
    sums[file] = fsums;
  }
  m["partitions"] = parts;
  m["checksums"] = sums;
  return m.dump(1) + "\n";
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

// What a reader relies on: each file's partitions lie end to end from position 0 (so no
// element of a dataset serves two ranges), and a multi-range or params_in_master checkpoint's
// ranges tile the flat space, so every element -- every parameter -- is read from exactly one
// shard.
void check_partitions(const Manifest& m, const std::string& path) {
  std::map<std::string, std::vector<const ManifestPartition*>> by_file;
  for (const auto& p : m.partitions) by_file[p.file].push_back(&p);
  for (auto& [file, parts] : by_file) {
    std::sort(parts.begin(), parts.end(), [](auto* a, auto* b) { return a->position < b->position; });
    std::size_t pos = 0;
    for (const auto* p : parts) {
      DS_CHECK(p->position == pos, path << ": partitions of " << file << " do not lie end to end: the range at flat "
                                        << p->offset << " has position " << p->position << ", expected " << pos);
      DS_CHECK(p->rank == parts.front()->rank, path << ": " << file << " is named by partitions of ranks "
                                                    << parts.front()->rank << " and " << p->rank);
      pos += p->count;
    }
  }
  if (m.params_in_master) {
    DS_CHECK(std::find(m.shard_datasets.begin(), m.shard_datasets.end(), "fp32_master") != m.shard_datasets.end(),
             path << ": params_in_master is set but shard_datasets has no fp32_master");
    for (const auto& p : m.params)
      DS_CHECK(p.flat_offset + p.numel <= m.flat_numel, path << ": parameter '" << p.name << "' at flat ["
                                                             << p.flat_offset << ", " << p.flat_offset + p.numel
                                                             << ") ends past flat_numel " << m.flat_numel);
  }
  if (m.shard_ranges || m.params_in_master) {
    std::vector<RankRange> ranges;
    for (const auto& p : m.partitions) ranges.push_back({p.rank, p.offset, p.count});
    const std::string problem = tiling_problem(ranges, m.flat_numel);
    DS_CHECK(problem.empty(), path << ": the partitions do not cover the flat space [0, " << m.flat_numel
                                   << ") exactly once: " << problem);
  }
}

}  // namespace

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
                              p.at("count").get<std::size_t>(), p.value("position", std::size_t(0))});
      m.shard_ranges |= p.contains("position");
      const std::string& f = m.partitions.back().file;
      DS_CHECK(is_plain_name(f), path << ": partitions[" << m.partitions.size() - 1 << "].file '" << f
                                      << "' is not a plain file name inside the checkpoint directory");
    }
    m.params_in_master = j.value("params_in_master", false);
    m.global_steps = j.value("global_steps", std::int64_t(-1));
    m.writer = j.value("writer", std::string());
    for (const auto& [file, sums] : j.at("checksums").items()) {
      for (const auto& [ds, v] : sums.items()) m.checksums[file][ds] = parse_crc(v, path + " checksums." + file + "." + ds);
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    DS_THROW(path << ": missing or malformed field: " << e.what());
  }
  check_partitions(m, path);
  return m;
}

}  // namespace ds::io::detail

// ds_to_fp32 CHECKPOINT_DIR [--tag T] OUTPUT [--format hdf5|safetensors] [--force]
//
// Consolidates a dstrain checkpoint into one fp32 file, tensor by tensor: each parameter's
// fp32 master values are gathered from whichever ZeRO shards hold its flat range (hyperslab
// reads; any saved world size and stage), or converted from the module file's working-dtype
// weights when the checkpoint has no fp32 master. Memory: one buffer of the largest tensor
// (plus a 16 MiB checksum scratch). Every dataset read is checksum-verified first.
//
// safetensors: 8-byte little-endian header length, a JSON header
// {name: {dtype: "F32", shape, data_offsets: [begin, end]}, __metadata__: {...}} padded with
// spaces to a multiple of 8, then the raw little-endian data in header order.
//
// OUTPUT must not lie inside CHECKPOINT_DIR and, when it exists, must be a regular file and
// is replaced only with --force (output_path.h).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_usage.h"
#include "ds/core/env.h"
#include "ds/core/error.h"
#include "ds/io/checkpoint.h"
#include "ds/io/h5file.h"
#include "output_path.h"

namespace fs = std::filesystem;
using namespace ds;

namespace {

// Fills buf with parameter p's fp32 values.
void read_fp32(io::CheckpointReader& r, const io::ManifestParam& p, bool from_master, std::vector<float>& buf) {
  if (from_master) {
    r.read_flat("fp32_master", p.flat_offset, p.numel, buf.data());
  } else {
    r.read_param(p.name, buf.data(), DType::F32, p.numel);
  }
}

void write_all(std::FILE* f, const void* data, std::size_t bytes, const std::string& path) {
  if (bytes && std::fwrite(data, 1, bytes, f) != bytes)
    DS_THROW("writing " << path << " failed: " << std::strerror(errno));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Consolidate a dstrain checkpoint into one fp32 file (HDF5 or safetensors)"};
  std::string dir, output, tag, format = "hdf5";
  bool force = false;
  app.add_option("CHECKPOINT_DIR", dir, "checkpoint directory (holds `latest` and the tag folders)")->required();
  app.add_option("OUTPUT", output, "output file")->required();
  app.add_option("--tag,-t", tag, "checkpoint tag (default: the one in CHECKPOINT_DIR/latest)");
  app.add_option("--format", format, "hdf5 (default) or safetensors")->check(CLI::IsMember({"hdf5", "safetensors"}));
  app.add_flag("--force,-f", force, "replace OUTPUT when it already exists (a regular file)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return tools::usage_exit(app, e, "ds_to_fp32");
  }
  try {
    env::check_all();  // a bad DS_* value: one error line before any work
    tools::check_output_path(output, dir, force);
    if (tag.empty()) {
      auto latest = io::read_latest(dir);
      DS_CHECK(latest, "no 'latest' file in " << dir << "; pass --tag");
      tag = *latest;
    }
    io::CheckpointReader r(dir, tag);
    const auto& m = r.manifest();
    const bool from_master = r.has_shard_dataset("fp32_master") && !m.partitions.empty();
    std::size_t largest = 1;
    std::vector<std::string> names;
    for (const auto& p : m.params) {
      largest = std::max(largest, p.numel);
      names.push_back(p.name);
    }
    // Verify what load_checkpoint verifies, even where the output comes from the shards alone:
    // a truncated or corrupt model_states.h5 means a damaged checkpoint, and saying so here
    // beats a conversion that succeeds while the training resume then fails.
    if (from_master) r.verify_flat_range(0, m.flat_numel);
    r.verify_params(names);
    (void)r.engine_state();
    std::vector<float> buf(largest);

    const std::string tmp = output + ".tmp-" + std::to_string(::getpid());
    if (format == "hdf5") {
      io::H5File out(tmp, io::H5File::Mode::Create);
      out.set_attr("/", "source", r.dir());
      out.set_attr("/", "tag", tag);
      out.set_attr("/", "format", "dstrain-fp32");
      for (const auto& p : m.params) {
        read_fp32(r, p, from_master, buf);
        out.write(p.name, buf.data(), DType::F32, p.shape);
      }
      out.close();
    } else {
      nlohmann::json header = nlohmann::json::object();
      std::size_t offset = 0;
      for (const auto& p : m.params) {
        header[p.name] = {{"dtype", "F32"}, {"shape", p.shape}, {"data_offsets", {offset, offset + p.numel * 4}}};
        offset += p.numel * 4;
      }
      header["__metadata__"] = {{"format", "pt"}, {"source", r.dir()}, {"tag", tag}, {"producer", "dstrain ds_to_fp32"}};
      // Tensors must appear in data_offsets order; nlohmann sorts keys, so write data in the
      // order the offsets were assigned (manifest order) -- the offsets say where each is.
      std::string h = header.dump();
      while (h.size() % 8) h += ' ';
      std::FILE* f = std::fopen(tmp.c_str(), "wb");
      DS_CHECK(f, "cannot create " << tmp << ": " << std::strerror(errno));
      std::uint64_t n = h.size();
      unsigned char len[8];
      for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
      try {
        write_all(f, len, 8, tmp);
        write_all(f, h.data(), h.size(), tmp);
        for (const auto& p : m.params) {
          read_fp32(r, p, from_master, buf);
          write_all(f, buf.data(), p.numel * 4, tmp);
        }
        DS_CHECK(std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0, "flushing " << tmp << " failed: " << std::strerror(errno));
      } catch (...) {
        std::fclose(f);
        throw;
      }
      DS_CHECK(std::fclose(f) == 0, "closing " << tmp << " failed: " << std::strerror(errno));
    }
    tools::commit_output(tmp, output, force);
    std::cout << "ds_to_fp32: wrote " << m.params.size() << " fp32 tensors from " << r.dir() << " (world size "
              << m.world_size << ", ZeRO stage " << m.zero_stage << ", " << (from_master ? "fp32 master" : m.working_dtype + " weights")
              << ") to " << output << " (" << format << ")" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove(output + ".tmp-" + std::to_string(::getpid()), ec);
    std::cerr << "ds_to_fp32: error: " << e.what() << std::endl;
    return 1;
  }
}

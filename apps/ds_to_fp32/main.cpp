// ds_to_fp32 CHECKPOINT_DIR [--tag T] OUTPUT [--format hdf5|safetensors [--hf_names]] [--force]
//
// Consolidates a dstrain checkpoint into one fp32 file, tensor by tensor: each parameter's
// fp32 master values are gathered from whichever ZeRO shards hold its flat range (hyperslab
// reads; any saved world size and stage, stage 3's multi-range shards included -- a stage 3
// checkpoint keeps its weights only there), or converted from the module file's working-dtype
// weights when the checkpoint has no fp32 master. Memory: one buffer of the largest tensor
// (plus a 16 MiB checksum scratch). Every dataset read is checksum-verified first.
//
// safetensors (ds/io/safetensors.h): dstrain's names and layouts, or with --hf_names the
// Hugging Face ones (ds/io/hf_weights.h), which `train --init_from` and transformers both load.
// __metadata__ says which ("layout": "dstrain" | "huggingface").
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
#include <map>
#include <string>
#include <vector>

#include "cli_usage.h"
#include "ds/core/env.h"
#include "ds/core/error.h"
#include "ds/core/log.h"
#include "ds/io/checkpoint.h"
#include "ds/io/h5file.h"
#include "ds/io/hf_weights.h"
#include "ds/io/safetensors.h"
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

}  // namespace

int main(int argc, char** argv) {
  ds::log::set_tool("ds_to_fp32");  // diagnostics on stderr, no rank tag
  CLI::App app{"Consolidate a dstrain checkpoint into one fp32 file (HDF5 or safetensors)"};
  std::string dir, output, tag, format = "hdf5";
  bool force = false, hf_names = false;
  app.add_option("CHECKPOINT_DIR", dir, "checkpoint directory (holds `latest` and the tag folders)")->required();
  app.add_option("OUTPUT", output, "output file")->required();
  app.add_option("--tag,-t", tag, "checkpoint tag (default: the one in CHECKPOINT_DIR/latest)");
  app.add_option("--format", format, "hdf5 (default) or safetensors")->check(CLI::IsMember({"hdf5", "safetensors"}));
  app.add_flag("--hf_names", hf_names,
               "safetensors with Hugging Face names and layouts (GPT-2: GPT2Model, Conv1D weights [in, out]; Llama: LlamaForCausalLM)");
  app.add_flag("--force,-f", force, "replace OUTPUT when it already exists (a regular file)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return tools::usage_exit(app, e, "ds_to_fp32");
  }
  try {
    env::check_all();  // a bad DS_* value: one error line before any work
    DS_CHECK(!hf_names || format == "safetensors", "--hf_names needs --format safetensors");
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
      // --hf_names: the Hugging Face table that covers every parameter gives names and layouts.
      std::vector<ParamInfo> infos;
      for (const auto& p : m.params) infos.push_back({p.name, p.shape});
      const io::hf::Architecture* arch = nullptr;
      std::vector<io::hf::HfTensor> hf;
      if (hf_names) {
        arch = io::hf::detect(infos);
        DS_CHECK(arch, "--hf_names: no Hugging Face name table covers this checkpoint's parameters (first: '"
                           << (infos.empty() ? std::string() : infos.front().name) << "'); there are tables for the GPT and the Llama");
        hf = io::hf::to_hf(*arch, infos);
      }
      std::vector<io::SafetensorsSpec> specs;
      for (std::size_t i = 0; i < m.params.size(); ++i)
        specs.push_back({hf_names ? hf[i].name : m.params[i].name, DType::F32, hf_names ? hf[i].shape : m.params[i].shape});
      std::map<std::string, std::string> meta = {{"format", "pt"}, {"source", r.dir()}, {"tag", tag},
                                                 {"producer", "dstrain ds_to_fp32"},
                                                 {"layout", hf_names ? "huggingface" : "dstrain"}};
      if (arch) meta["architecture"] = std::string(arch->name);
      io::SafetensorsWriter out(tmp, std::move(specs), meta);
      std::vector<float> tbuf(hf_names ? largest : 0);
      for (std::size_t i = 0; i < m.params.size(); ++i) {
        const auto& p = m.params[i];
        read_fp32(r, p, from_master, buf);
        if (hf_names && hf[i].transpose) {
          // Conv1D layout: ours [rows, cols] -> theirs [cols, rows].
          io::hf::transpose(buf.data(), tbuf.data(), p.shape[1], p.shape[0]);
          out.write(std::span<const float>(tbuf.data(), p.numel));
        } else {
          out.write(std::span<const float>(buf.data(), p.numel));
        }
      }
      out.close();
    }
    tools::commit_output(tmp, output, force);
    std::cout << "ds_to_fp32: wrote " << m.params.size() << " fp32 tensors from " << r.dir() << " (world size "
              << m.world_size << ", ZeRO stage " << m.zero_stage << ", " << (from_master ? "fp32 master" : m.working_dtype + " weights")
              << ") to " << output << " (" << format << ")" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove(output + ".tmp-" + std::to_string(::getpid()), ec);
    std::cerr << "ds_to_fp32: error: " << ds::user_message(e) << std::endl;
    return 1;
  }
}

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

struct Options {
  std::string dir, output, tag, format = "hdf5";
  bool force = false, hf_names = false;
};

// The checkpoint being converted, verified, with where its fp32 values come from.
struct Source {
  io::CheckpointReader& reader;
  std::string tag;
  bool from_master = false;  // fp32 master shards (else the module file's working-dtype weights)
  std::size_t largest = 1;   // elements of the largest tensor: the one buffer's size
};

// Fills buf with parameter p's fp32 values.
void read_fp32(Source& src, const io::ManifestParam& p, std::vector<float>& buf) {
  if (src.from_master) {
    src.reader.read_flat("fp32_master", p.flat_offset, p.numel, buf.data());
  } else {
    src.reader.read_param(p.name, buf.data(), DType::F32, p.numel);
  }
}

void add_options(CLI::App& app, Options& o) {
  app.add_option("CHECKPOINT_DIR", o.dir, "checkpoint directory (holds `latest` and the tag folders)")->required();
  app.add_option("OUTPUT", o.output, "output file")->required();
  app.add_option("--tag,-t", o.tag, "checkpoint tag (default: the one in CHECKPOINT_DIR/latest)");
  app.add_option("--format", o.format, "hdf5 (default) or safetensors")->check(CLI::IsMember({"hdf5", "safetensors"}));
  app.add_flag("--hf_names", o.hf_names,
               "safetensors with Hugging Face names and layouts (GPT-2: GPT2Model, Conv1D weights [in, out]; Llama: LlamaForCausalLM)");
  app.add_flag("--force,-f", o.force, "replace OUTPUT when it already exists (a regular file)");
}

std::string resolve_tag(const Options& o) {
  if (!o.tag.empty()) return o.tag;
  auto latest = io::read_latest(o.dir);
  DS_CHECK(latest, "no 'latest' file in " << o.dir << "; pass --tag");
  return *latest;
}

// Verifies what load_checkpoint verifies, even where the output comes from the shards alone: a
// truncated or corrupt model_states.h5 means a damaged checkpoint, and saying so here beats a
// conversion that succeeds while the training resume then fails.
Source verified_source(io::CheckpointReader& reader, const std::string& tag) {
  Source src{reader, tag};
  const auto& m = src.reader.manifest();
  src.from_master = src.reader.has_shard_dataset("fp32_master") && !m.partitions.empty();
  std::vector<std::string> names;
  for (const auto& p : m.params) {
    src.largest = std::max(src.largest, p.numel);
    names.push_back(p.name);
  }
  if (src.from_master) src.reader.verify_flat_range(0, m.flat_numel);
  src.reader.verify_params(names);
  (void)src.reader.engine_state();
  return src;
}

void write_hdf5(Source& src, const std::string& path) {
  io::H5File out(path, io::H5File::Mode::Create);
  out.set_attr("/", "source", src.reader.dir());
  out.set_attr("/", "tag", src.tag);
  out.set_attr("/", "format", "dstrain-fp32");
  std::vector<float> buf(src.largest);
  for (const auto& p : src.reader.manifest().params) {
    read_fp32(src, p, buf);
    out.write(p.name, buf.data(), DType::F32, p.shape);
  }
  out.close();
}

// The output tensors' names and shapes: dstrain's, or with --hf_names those of the Hugging Face
// table that covers every parameter (nullptr arch: dstrain's).
struct OutputLayout {
  const io::hf::Architecture* arch = nullptr;
  std::vector<io::hf::HfTensor> hf;  // per parameter, with --hf_names
  std::vector<io::SafetensorsSpec> specs;
};

OutputLayout output_layout(const io::Manifest& m, bool hf_names) {
  OutputLayout out;
  std::vector<ParamInfo> infos;
  for (const auto& p : m.params) infos.push_back({p.name, p.shape});
  if (hf_names) {
    out.arch = io::hf::detect(infos);
    DS_CHECK(out.arch, "--hf_names: no Hugging Face name table covers this checkpoint's parameters (first: '"
                           << (infos.empty() ? std::string() : infos.front().name) << "'); there are tables for the GPT and the Llama");
    out.hf = io::hf::to_hf(*out.arch, infos);
  }
  for (std::size_t i = 0; i < m.params.size(); ++i)
    out.specs.push_back({hf_names ? out.hf[i].name : m.params[i].name, DType::F32,
                         hf_names ? out.hf[i].shape : m.params[i].shape});
  return out;
}

void write_safetensors(Source& src, const std::string& path, bool hf_names) {
  const auto& m = src.reader.manifest();
  OutputLayout layout = output_layout(m, hf_names);
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"source", src.reader.dir()}, {"tag", src.tag},
                                             {"producer", "dstrain ds_to_fp32"},
                                             {"layout", hf_names ? "huggingface" : "dstrain"}};
  if (layout.arch) meta["architecture"] = std::string(layout.arch->name);
  io::SafetensorsWriter out(path, std::move(layout.specs), meta);
  std::vector<float> buf(src.largest), tbuf(hf_names ? src.largest : 0);
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    const auto& p = m.params[i];
    read_fp32(src, p, buf);
    if (hf_names && layout.hf[i].transpose) {
      // Conv1D layout: ours [rows, cols] -> theirs [cols, rows].
      io::hf::transpose(buf.data(), tbuf.data(), p.shape[1], p.shape[0]);
      out.write(std::span<const float>(tbuf.data(), p.numel));
    } else {
      out.write(std::span<const float>(buf.data(), p.numel));
    }
  }
  out.close();
}

void convert(const Options& o) {
  env::check_all();  // a bad DS_* value: one error line before any work
  DS_CHECK(!o.hf_names || o.format == "safetensors", "--hf_names needs --format safetensors");
  tools::check_output_path(o.output, o.dir, o.force);
  const std::string tag = resolve_tag(o);
  io::CheckpointReader reader(o.dir, tag);
  Source src = verified_source(reader, tag);
  const std::string tmp = o.output + ".tmp-" + std::to_string(::getpid());
  if (o.format == "hdf5") {
    write_hdf5(src, tmp);
  } else {
    write_safetensors(src, tmp, o.hf_names);
  }
  tools::commit_output(tmp, o.output, o.force);
  const auto& m = src.reader.manifest();
  std::cout << "ds_to_fp32: wrote " << m.params.size() << " fp32 tensors from " << src.reader.dir() << " (world size "
            << m.world_size << ", ZeRO stage " << m.zero_stage << ", "
            << (src.from_master ? "fp32 master" : m.working_dtype + " weights") << ") to " << o.output << " ("
            << o.format << ")" << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  ds::log::set_tool("ds_to_fp32");  // diagnostics on stderr, no rank tag
  CLI::App app{"Consolidate a dstrain checkpoint into one fp32 file (HDF5 or safetensors)"};
  Options opts;
  add_options(app, opts);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return tools::usage_exit(app, e, "ds_to_fp32");
  }
  try {
    convert(opts);
    return 0;
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove(opts.output + ".tmp-" + std::to_string(::getpid()), ec);
    std::cerr << "ds_to_fp32: error: " << ds::user_message(e) << std::endl;
    return 1;
  }
}

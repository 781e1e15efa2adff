// Engine::save_16bit_model: the consolidated weights in one safetensors file (DeepSpeed's
// save_16bit_model; at stage 3 gated by stage3_gather_16bit_weights_on_model_save as there).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "ds/core/error.h"
#include "ds/core/half.h"
#include "ds/core/log.h"
#include "ds/engine/engine.h"
#include "ds/io/safetensors.h"
#include "param_store.h"
#include "zero3_store.h"

namespace ds {

namespace fs = std::filesystem;

namespace {

// Rank 0's safetensors file, written to a temporary name and renamed when complete. A failure
// is kept (not thrown) so that rank 0 still takes part in the collectives, and is shared with
// every rank at the end.
class ModelFile {
 public:
  ModelFile(const std::string& path, DType wdtype)
      : path_(path), tmp_(path + ".tmp-" + std::to_string(::getpid())), wdtype_(wdtype) {}

  const std::string& path() const { return path_; }
  const std::string& error() const { return error_; }

  void open(const std::string& save_dir, const engine::PartitionMap& map, std::int64_t global_steps) {
    guarded([&] {
      fs::create_directories(save_dir);
      std::vector<io::SafetensorsSpec> specs;
      for (const auto& p : map.params) specs.push_back({p.name, wdtype_, p.shape});
      out_ = std::make_unique<io::SafetensorsWriter>(
          tmp_, std::move(specs),
          std::map<std::string, std::string>{{"format", "pt"}, {"producer", "dstrain save_16bit_model"},
                                             {"global_steps", std::to_string(global_steps)}});
    });
  }

  // The next parameter in file order, numel working-dtype values at data, written as fp32.
  void write_param(const void* data, std::size_t numel) {
    guarded([&] {
      buf_.resize(numel);
      convert(data, wdtype_, buf_.data(), DType::F32, numel);
      out_->write(std::span<const float>(buf_.data(), numel));
    });
  }

  // Renames the complete file into place, or removes the temporary one after a failure.
  void finish() {
    guarded([&] {
      out_->close();
      out_.reset();
      fs::rename(tmp_, path_);
    });
    if (!error_.empty()) {
      out_.reset();
      std::error_code ec;
      fs::remove(tmp_, ec);
    }
  }

 private:
  template <class F>
  void guarded(F&& f) {
    if (!error_.empty()) return;
    try {
      f();
    } catch (const std::exception& e) {
      error_ = e.what();
    }
  }

  std::string path_, tmp_, error_;
  DType wdtype_;
  std::unique_ptr<io::SafetensorsWriter> out_;
  std::vector<float> buf_;
};

// Stage 3, one group at a time: every rank's pieces gathered into a group-sized buffer, which
// rank 0 writes (file is null elsewhere); no rank ever holds more than one group.
void write_stage3_groups(engine::Zero3Store& store, const engine::PartitionMap& map, Communicator& comm, int rank,
                         int world, DType wdtype, ModelFile* file) {
  HostBuffer group(map.largest_group(), wdtype);
  const std::size_t es = dtype_size(wdtype);
  for (std::size_t gi = 0; gi < map.groups.size(); ++gi) {
    const auto& g = map.groups[gi];
    const TensorView dst{group.data(), g.padded, wdtype};
    // This rank's piece into its block, then gathered in place (the piece may be on NVMe).
    char* mine = static_cast<char*>(group.data()) + std::size_t(rank) * g.piece * es;
    store.read_part_params(gi, mine);
    // Host buffers: over the host communicator (the device one may take device memory only).
    if (world > 1) comm.all_gather(TensorView{mine, g.piece, wdtype}, dst);
    if (!file) continue;
    for (std::size_t i = g.first_param; i < g.first_param + g.param_count; ++i) {
      const auto& p = map.params[i];
      file->write_param(static_cast<const char*>(group.data()) + (p.offset - g.offset) * es, p.numel);
    }
  }
}

}  // namespace

bool Engine::save_16bit_model(const std::string& save_dir, const std::string& filename) {
  if (map_.stage == 3 && !cfg_.zero_optimization.gather_16bit_weights_on_model_save) {
    DS_WARN("did not save the model " << save_dir << "/" << filename << ": at ZeRO stage 3 the weights are "
            "partitioned; set zero_optimization.stage3_gather_16bit_weights_on_model_save to gather them on save");
    return false;
  }
  const bool rank0 = rank_ == 0;
  ModelFile file((fs::path(save_dir) / filename).string(), wdtype_);
  if (rank0) file.open(save_dir, map_, global_steps_);
  if (map_.stage == 3) {
    write_stage3_groups(static_cast<engine::Zero3Store&>(*store_), map_, *comm_, rank_, world_, wdtype_,
                        rank0 ? &file : nullptr);
  } else if (rank0) {
    store_->to_host(*optimizer_);
    const char* params = static_cast<const char*>(store_->host_params().data());
    for (const auto& p : map_.params) file.write_param(params + p.offset * dtype_size(wdtype_), p.numel);
  }
  if (rank0) file.finish();
  float bad = file.error().empty() ? 0.0f : 1.0f;
  if (world_ > 1) comm_->all_reduce(TensorView{&bad, 1, DType::F32}, ReduceOp::Max);
  if (!file.error().empty()) throw Error("save_16bit_model " + file.path() + ": " + file.error());
  DS_CHECK(bad == 0.0f, "save_16bit_model " << file.path() << ": rank 0 failed to write it (see its message)");
  if (rank0) DS_INFO("saved 16-bit model " << file.path());
  return true;
}

}  // namespace ds

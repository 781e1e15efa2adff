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

bool Engine::save_16bit_model(const std::string& save_dir, const std::string& filename) {
  if (map_.stage == 3 && !cfg_.zero_optimization.gather_16bit_weights_on_model_save) {
    DS_WARN("did not save the model " << save_dir << "/" << filename << ": at ZeRO stage 3 the weights are "
            "partitioned; set zero_optimization.stage3_gather_16bit_weights_on_model_save to gather them on save");
    return false;
  }
  const bool rank0 = rank_ == 0;
  const std::string path = (fs::path(save_dir) / filename).string();
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  std::string error;
  std::unique_ptr<io::SafetensorsWriter> out;
  auto guarded = [&](auto&& f) {  // rank 0's file errors are kept, and shared at the end
    if (!error.empty()) return;
    try {
      f();
    } catch (const std::exception& e) {
      error = e.what();
    }
  };
  if (rank0) {
    guarded([&] {
      fs::create_directories(save_dir);
      std::vector<io::SafetensorsSpec> specs;
      for (const auto& p : map_.params) specs.push_back({p.name, wdtype_, p.shape});
      out = std::make_unique<io::SafetensorsWriter>(
          tmp, std::move(specs),
          std::map<std::string, std::string>{{"format", "pt"}, {"producer", "dstrain save_16bit_model"},
                                             {"global_steps", std::to_string(global_steps_)}});
    });
  }
  std::vector<float> buf;
  auto write_param = [&](const void* data, std::size_t numel) {
    guarded([&] {
      buf.resize(numel);
      convert(data, wdtype_, buf.data(), DType::F32, numel);
      out->write(std::span<const float>(buf.data(), numel));
    });
  };
  if (map_.stage == 3) {
    // One group at a time: every rank's pieces gathered into a group-sized buffer, which rank
    // 0 writes; no rank ever holds more than one group.
    auto& store = static_cast<engine::Zero3Store&>(*store_);
    HostBuffer group(map_.largest_group(), wdtype_);
    const std::size_t es = dtype_size(wdtype_);
    for (std::size_t gi = 0; gi < map_.groups.size(); ++gi) {
      const auto& g = map_.groups[gi];
      const TensorView dst{group.data(), g.padded, wdtype_};
      // This rank's piece into its block, then gathered in place (the piece may be on NVMe).
      char* mine = static_cast<char*>(group.data()) + std::size_t(rank_) * g.piece * es;
      store.read_part_params(gi, mine);
      // Host buffers: over the host communicator (the device one may take device memory only).
      if (world_ > 1) comm_->all_gather(TensorView{mine, g.piece, wdtype_}, dst);
      if (!rank0) continue;
      for (std::size_t i = g.first_param; i < g.first_param + g.param_count; ++i) {
        const auto& p = map_.params[i];
        write_param(static_cast<const char*>(group.data()) + (p.offset - g.offset) * es, p.numel);
      }
    }
  } else if (rank0) {
    store_->to_host(*optimizer_);
    const char* params = static_cast<const char*>(store_->host_params().data());
    for (const auto& p : map_.params) write_param(params + p.offset * dtype_size(wdtype_), p.numel);
  }
  if (rank0) {
    guarded([&] {
      out->close();
      out.reset();
      fs::rename(tmp, path);
    });
    if (!error.empty()) {
      out.reset();
      std::error_code ec;
      fs::remove(tmp, ec);
    }
  }
  float bad = error.empty() ? 0.0f : 1.0f;
  if (world_ > 1) comm_->all_reduce(TensorView{&bad, 1, DType::F32}, ReduceOp::Max);
  if (!error.empty()) throw Error("save_16bit_model " + path + ": " + error);
  DS_CHECK(bad == 0.0f, "save_16bit_model " << path << ": rank 0 failed to write it (see its message)");
  if (rank0) DS_INFO("saved 16-bit model " << path);
  return true;
}

}  // namespace ds

// PartitionedParamStore: ZeRO stage 3 in host memory (docs/dev/engine.md "Stage 3").
//
// Each rank keeps only its partition -- its piece of every parameter group (partition.h) --
// of the working parameters, the reduced gradients (fp32: the cycle's sum is rounded once),
// and the fp32 master. The module reads parameters and accumulates gradients through views
// of two full-size PagedBuffers (the flat space: address space, no memory until written);
// the GroupFetcher (zero3_fetcher.h) gathers a group's pieces into its range of the flat
// parameters before use and releases the pages after, and reduce-scatters a group's flat
// gradients into this rank's piece as soon as they are final, releasing those pages too.
// So between uses only the partition is resident: (w + 4 + 4) bytes per parameter / N plus
// the optimizer state, against w + w + 4 + K at stage 0.
#pragma once

#include <cstdint>

#include "ds/mpi/communicator.h"
#include "zero3_space.h"

namespace ds::engine {

class PartitionedParamStore final : public Zero3Store {
 public:
  PartitionedParamStore(const PartitionMap& map, int rank, const StoreOptions& o);

  // ParamStore: ranges are flat-space ranges (what the module's views point into).
  TensorView params(std::size_t offset, std::size_t count) const override;
  TensorView grads(std::size_t offset, std::size_t count) const override;
  void set_initial(const float* full) override;
  // Group g's initial values alone (its padded range, fp32): this rank keeps its piece.
  void set_initial_group(std::size_t g, const float* group_values) override;
  precision::GradStats grad_stats() override;
  void optimizer_step(optim::Optimizer& opt, optim::StepContext ctx) override;
  void gather_params(Communicator&) override {}  // the fetcher gathers groups on use
  void zero_grads() override;
  // A checkpoint load wrote the master through state_views() (`written`): the working
  // partition follows it, rounded from those views before they end -- with offload_optimizer
  // nvme from the mapped master file, which is therefore read once per load, not mapped and
  // read again afterwards. from_host() has nothing left to do.
  void done_with_state_views(bool written) override;
  // Collective over the communicator set with set_comm(): every rank's partition gathered.
  std::vector<float> params_fp32() const override;
  void add_memory(ModelStateBytes& b) const override;

  // For the fetcher (Zero3Store, zero3_space.h).
  // This rank's piece of group g: working params (wdtype; in memory only without
  // offload_param nvme) and reduced gradients (fp32).
  TensorView part_params(std::size_t g) const override;
  // Copies group g's working-params piece to dst (from memory or the parameter swap file).
  void read_part_params(std::size_t g, void* dst) const override;
  // With offload_param nvme: starts reading group g's piece from the swap file into dst, and
  // finishes that read (dst filled; its failure thrown). NvmeSwap::start_read_params.
  std::uint64_t start_read_part_params(std::size_t g, void* dst) override;
  void finish_read_part_params(std::uint64_t id) override;
  bool params_swapped() const override { return swap_ && swap_->params(); }
  // The pages of group g's range go back at once (madvise); they read as zero when touched again.
  void release_params(std::size_t g) override;
  void release_grads(std::size_t g) override;
  void fold(std::size_t g, TensorView reduced) override;  // add_into_f32
  void* reduce_scratch(std::size_t bytes) override;
  float* part_grads(std::size_t g) const;
  PagedBuffer& flat_params() { return flat_params_; }
  PagedBuffer& flat_grads() { return flat_grads_; }
  // Byte range of group g's pages in either flat buffer (2 MiB-aligned start; the end is the
  // next 2 MiB boundary or the end of the buffer).
  std::pair<std::size_t, std::size_t> group_bytes(std::size_t g) const;

 private:
  void params_from_master(const float* master);  // the working partition := master rounded

  PagedBuffer flat_params_, flat_grads_;  // padded_numel x wdtype, mostly not resident
  HostBuffer part_params_;                // partition_numel x wdtype (empty with offload_param nvme)
  HostBuffer part_grads_;                 // partition_numel x F32
  HostBuffer rs_scratch_;                 // the fetcher's reduce-scatter receive slots
};

}  // namespace ds::engine

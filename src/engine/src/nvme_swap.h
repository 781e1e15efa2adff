// NvmeSwap: ZeRO-Infinity's NVMe offload for one rank (docs/dev/offload.md).
//
// With zero_optimization.offload_optimizer device "nvme", the fp32 master and the optimizer
// state of the rank's step range (its ZeRO slice, or at stage 3 its partition) live in swap
// files, one per tensor ("fp32_master", then the optimizer's state names), and step() streams
// them through the optimizer sub_group_size elements at a time: buffer_count buffer sets in
// a ring, the read of the next sub-groups and the write-back of the previous ones in flight
// on the I/O threads while the current one is stepped. With offload_param device "nvme"
// (stage 3), the working-dtype parameter partition lives in a swap file too: the fetcher
// reads a group's piece into its place in the gathered buffer (started when the gather is
// decided, waited when the bytes are needed), and the step writes the updated pieces back.
// The step's writes go behind (the call returns with the last ones in flight), like the
// parameter file's writes after a step with the master in memory. Transfers are ordered by
// the blocks they touch: a read waits for the writes before it, a write for the reads and
// writes before it.
//
// The files are scratch: they sit in <nvme_path>/dstrain-swap/<host>-<pid>-rank<R>/ (io::SwapDir:
// removed when the engine goes, cleaned at the next start after a crash), and checkpoints
// never point at them -- save_checkpoint maps them into memory (map()) and writes their
// contents like any other state. Element offsets here are offsets into the step range.
//
// Threading: one thread (the engine's) calls everything; the AioQueue's threads do the I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ds/core/dtype.h"
#include "ds/engine/memory.h"
#include "ds/io/aio.h"
#include "ds/io/swap_dir.h"
#include "ds/optim/optimizer.h"

namespace ds::engine {

struct NvmeOptions {
  bool optimizer = false;           // offload_optimizer device nvme
  bool params = false;              // offload_param device nvme (stage 3)
  std::string optimizer_path, params_path;  // their nvme_path
  std::string optimizer_key, params_key;    // the config keys naming them, for messages
  std::size_t sub_group = 0;        // zero_optimization.sub_group_size (elements)
  int buffer_count = 4;             // offload_optimizer.buffer_count
  io::AioOptions aio;               // the aio section
  bool any() const { return optimizer || params; }
};

// The master and optimizer state as checkpoints read and write them: n floats each.
struct StateViews {
  std::span<float> master;
  std::vector<std::pair<std::string, std::span<float>>> state;
};

class NvmeSwap {
 public:
  // n: elements of the step range; opt: the optimizer whose state names and initial values
  // the state files take; wdtype: the working dtype (the parameter file). Creates the swap
  // directory and files (checking nvme_path and the free space first: a clear error naming
  // the key before the first step) and fills the state files with their initial values.
  NvmeSwap(const NvmeOptions& o, int rank, std::size_t n, const optim::Optimizer& opt, DType wdtype);
  ~NvmeSwap();
  NvmeSwap(const NvmeSwap&) = delete;
  NvmeSwap& operator=(const NvmeSwap&) = delete;

  bool optimizer() const { return o_.optimizer; }
  bool params() const { return o_.params; }
  std::size_t sub_group() const { return sub_; }

  // ---- offload_optimizer nvme ----
  // master[offset, offset + count) := src (initial values, checkpoint loads; any alignment).
  void write_master(std::size_t offset, std::size_t count, const float* src);
  // One optimizer update of the whole step range, streamed: grads (n elements, in memory)
  // times ctx.grad_scale; the updated working parameters go to `working` (n elements in
  // memory, complete at the return) or, with params(), to the parameter file. Returns once
  // the last sub-group is computed, with the writes of the last sub-groups still in flight
  // (behind the next forward and backward); every later access waits for the writes of the
  // blocks it touches: the next step's reads, write_master, map(), the parameter file's reads
  // and writes; the destructor drains them. A failed write is thrown, as the AioQueue words
  // it ("<file>: write of N bytes at offset O failed at offset P: ..."), by the first of
  // those waits.
  void step(optim::Optimizer& opt, TensorView grads, TensorView working, const optim::StepContext& ctx);
  // The master and state files mapped into memory (shared): what checkpoints read and write.
  // Valid until unmap(); unmap(true) after writing through the views.
  StateViews map();
  void unmap(bool written);
  // The master file's mapping while map()'s views are open, else nullptr.
  const float* mapped_master() const;

  // ---- offload_param nvme (stage 3) ----
  // Working parameters [offset, offset + count) of the partition, any alignment (synchronous).
  // Each first waits for the writes behind (write_params_behind) of the blocks it touches, so
  // a read returns what was last written and a write is not overtaken by an older one.
  void read_params(std::size_t offset, std::size_t count, void* dst);
  void write_params(std::size_t offset, std::size_t count, const void* src);
  // The whole partition := master[0, n) rounded to the working dtype, written behind: a chunk
  // at a time converted into a ring of aligned buffers and queued on the I/O threads; a
  // buffer is refilled once its last write completed, and the call returns with the last
  // chunks still being written. A failure of those writes (ENOSPC, EIO) is thrown, as the
  // AioQueue words it, by whichever call waits for them first: a read or write of their
  // blocks, the next write_params_behind, step(), map().
  void write_params_behind(const float* master);
  // Starts reading [offset, offset + count) into dst (any alignment) on the I/O threads,
  // after the writes behind of its blocks: the blocks go to a bounce buffer of the swap's,
  // and finish_read_params(id) waits for them, copies the piece to dst and throws the read's
  // failure. dst must stay valid until then; step() and map() finish every read still open
  // (so finish_read_params returns at once afterwards). Writes of the same blocks wait for
  // the read, which therefore returns what the file held when it was started.
  std::uint64_t start_read_params(std::size_t offset, std::size_t count, void* dst);
  void finish_read_params(std::uint64_t id);
  // Reads started and not finished yet (a failed one is finished: it is thrown once).
  std::size_t open_param_reads() const { return param_reads_.size(); }

  // Swap buffers (memory) and swap file bytes (disk).
  void add_memory(ModelStateBytes& b) const;
  // What the swap has done since it was made (tests and benchmarks count on these).
  struct Counters {
    std::size_t maps = 0;          // map() calls
    std::size_t mapped_bytes = 0;  // bytes of the files those calls mapped
    // The parameter file: synchronous transfers (read_params / write_params calls) and
    // chunks written behind (write_params_behind), with the writes of those that a later
    // call found still in flight and had to wait for.
    std::size_t param_sync_reads = 0, param_sync_writes = 0;
    std::size_t param_writes_behind = 0, param_writes_waited = 0;
    std::size_t param_async_reads = 0;  // start_read_params calls
    std::size_t step_writes_behind = 0;  // writes step() returned without waiting for
  };
  const Counters& counters() const { return counters_; }
  // Bytes the last step() read and wrote (its writes behind included) and its seconds until
  // it returned (benchmarks; the next step waits for what it left in flight).
  std::size_t last_step_bytes() const { return last_bytes_; }
  double last_step_seconds() const { return last_seconds_; }

 private:
  struct Slot {
    std::vector<io::AlignedBuffer> bufs;  // master, then each state tensor: sub_ floats
    io::AlignedBuffer out;                // updated working params (params() only)
    std::vector<io::Ticket> reads, writes;
    std::size_t sub_group = SIZE_MAX;     // whose data the buffers hold / are receiving
  };
  void issue_read(Slot& s, std::size_t i);
  void wait_writes(Slot& s);
  void wait_step_writes();  // every slot's writes: what a step left behind
  // Waits for (and forgets) the writes behind that overlap bytes [lo, hi) of params.swap.
  void wait_param_writes(std::size_t lo, std::size_t hi);
  // Finishes the open reads that overlap bytes [lo, hi) (before a write of those blocks).
  void finish_param_reads(std::size_t lo, std::size_t hi);
  // A read of params.swap in flight: its blocks, its bounce buffer and where the piece goes.
  struct ParamRead {
    std::uint64_t id = 0;
    std::size_t lo = 0, hi = 0;
    io::Ticket ticket = 0;
    io::AlignedBuffer bounce;
    char* dst = nullptr;
    std::size_t skip = 0, bytes = 0;  // the piece: bounce[skip, skip + bytes)
  };
  // A parameter write behind in flight: its bytes of params.swap and its request.
  struct ParamWrite {
    std::size_t lo = 0, hi = 0;
    io::Ticket ticket = 0;
  };
  std::size_t count_of(std::size_t i) const;  // elements of sub-group i

  NvmeOptions o_;
  int rank_ = 0;
  std::size_t n_ = 0, n_pad_ = 0, sub_ = 0;
  DType wdtype_ = DType::F32;
  std::vector<std::string> names_;  // "fp32_master", then the optimizer's state names
  std::unique_ptr<io::SwapDir> opt_dir_, param_dir_;
  std::vector<io::SwapFile> files_;  // one per names_ entry
  std::unique_ptr<io::SwapFile> param_file_;
  std::vector<Slot> slots_;
  std::vector<io::AlignedBuffer> param_ring_;  // write_params_behind's chunks (made on first use)
  std::vector<io::Ticket> param_ring_writes_;  // each ring buffer's last write
  std::vector<ParamWrite> param_writes_;       // writes behind not yet waited for
  std::vector<ParamRead> param_reads_;         // open reads, in start order
  std::vector<io::AlignedBuffer> spare_bounces_;  // finished reads' bounce buffers, for reuse
  std::uint64_t next_read_ = 1;
  // After the files and buffers it reads and writes: destroyed (drained, joined) first.
  std::unique_ptr<io::AioQueue> aio_;
  std::vector<std::pair<void*, std::size_t>> maps_;  // map(): address, bytes
  std::size_t last_bytes_ = 0;
  double last_seconds_ = 0.0;
  Counters counters_;
};

}  // namespace ds::engine

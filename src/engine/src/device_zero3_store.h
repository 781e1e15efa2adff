// DevicePartitionedParamStore: ZeRO stage 3 on a CUDA device (docs/dev/gpu.md "ZeRO-3 on the
// device"), the device counterpart of PartitionedParamStore (zero3_store.h) under the same
// GroupFetcher (zero3_fetcher.h), through Zero3Store's calls (zero3_space.h).
//
// Memory: the flat parameter and gradient spaces (padded_numel x wdtype each, what the
// module's views point into) are two DevicePagedBuffers -- address space, chunks mapped only
// for the groups in use; this rank's pieces (working params wdtype, reduced gradients fp32,
// the fp32 master: partition_numel each) are ordinary device allocations, as are the
// reduce-scatter receive slots.
//
// Ordering, all on the module's stream (the compute stream):
// - a gather maps its group's chunks first (params_needed); the compute stream is ordered
//   behind the all-gather (order_after: NCCL's completion event) instead of the host waiting;
// - release_params / release_grads record an event on the compute stream and queue the range
//   (DeferredReleases, deferred_release.h): the chunks are unmapped once the kernels enqueued
//   before the release ran (polled at every params_needed, waited for the oldest when
//   stage3_max_live_parameters would be exceeded); a group used again while its release is
//   queued leaves the queue (parameters: the gather overwrites them; gradients: zeroed on the
//   stream, as a fresh chunk reads);
// - backward's gradient chunks are mapped (and read zero) before the module's kernels write
//   them (grads_needed, at the fetcher's Backward acquire and before a reduce-scatter);
// - the fold (part_grads += the reduced piece) is a kernel on the compute stream after the
//   reduce-scatter's handle completed; a receive slot is reused by a later reduce-scatter that
//   the communicator starts behind the compute stream (NCCL: its ready event; StagedComm:
//   copies on that stream), hence behind the fold that read it;
// - grad_stats / the optimizer run on the pieces as DeviceParamStore does on its slice.
// offload_param is refused on the device (Engine::check_device_limits). Built without CUDA,
// make_device_zero3_store throws.
#pragma once

#include <memory>

#include "param_store.h"

namespace ds::engine {

// ParamStore::make's choice for a CUDA module at stage 3.
std::unique_ptr<ParamStore> make_device_zero3_store(const PartitionMap& map, int rank, const StoreOptions& o,
                                                    void* stream);

}  // namespace ds::engine

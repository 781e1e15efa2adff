// ds_config.json as typed structs, with DeepSpeed's keys and defaults
// (DeepSpeed's runtime/config.py; docs/user/config.md lists what we support).
//
// Parsing (parse.h) fills every default; resolve_batch_sizes() applies DeepSpeed's
// batch-size rules once the data-parallel world size is known.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/config/pipeline_config.h"
#include "ds/optim/params.h"
#include "ds/sched/params.h"

namespace ds::config {

// OptimizerConfig and SchedulerConfig are the optimizer's and the scheduler's own parameter
// structs (ds::optim::OptimizerParams, ds::sched::SchedulerParams); the descriptors of
// ds/config/registry.h map their fields to keys.

struct Fp16Config {
  bool enabled = false;
  bool auto_cast = false;
  double loss_scale = 0.0;  // 0: dynamic
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
};

struct Bf16Config {
  bool enabled = false;
  bool check_grad_overflow = true;
};

// zero_optimization.offload_optimizer / offload_param (DeepSpeed's offload_config.py; defaults
// DeepSpeed's). device "cpu": the states in host memory (the GPU path's ZeRO-Offload; on the
// CPU path they are there already). "nvme": in files under nvme_path, streamed through the
// optimizer in sub_group_size pieces (docs/user/offload.md).
struct OffloadConfig {
  std::string device = "none";  // "none" | "cpu" | "nvme"
  std::string nvme_path;        // required with "nvme"
  bool pin_memory = true;       // DeepSpeed >= 0.19.5
  int buffer_count = 4;         // offload_optimizer 4, offload_param 5: sub-group buffers in flight
  std::int64_t buffer_size = 100000000;   // offload_param: elements per parameter buffer
  std::int64_t max_in_cpu = 1000000000;   // offload_param: elements kept in host memory
  bool pipeline_read = false, pipeline_write = false;  // offload_optimizer
  bool fast_init = false;       // offload_optimizer
  double ratio = 1.0;           // offload_optimizer: fraction offloaded (dstrain: 1 only)
  bool enabled() const { return device != "none"; }
  bool nvme() const { return device == "nvme"; }
  static OffloadConfig param_defaults() {  // offload_param's buffer_count default differs
    OffloadConfig c;
    c.buffer_count = 5;
    return c;
  }
};

struct ZeroConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  std::int64_t reduce_bucket_size = 500000000;     // elements
  std::int64_t allgather_bucket_size = 500000000;  // elements
  bool allgather_partitions = true;
  std::optional<bool> overlap_comm;  // None -> stage == 3
  bool overlap_comm_effective() const { return overlap_comm.value_or(stage == 3); }
  // Stage 3 (DeepSpeed's defaults; sizes in elements, all >= 0). Read under the stage3_ name
  // or the bare one; only stage 3 uses them (docs/user/config.md "ZeRO stage 3").
  std::int64_t prefetch_bucket_size = 50000000;
  std::int64_t param_persistence_threshold = 100000;
  std::int64_t model_persistence_threshold = INT64_MAX;  // DeepSpeed: sys.maxsize
  std::int64_t max_live_parameters = 1000000000;
  std::int64_t max_reuse_distance = 1000000000;
  // Also read under the deprecated stage3_gather_fp16_weights_on_model_save (a warning).
  bool gather_16bit_weights_on_model_save = false;
  // Elements of the optimizer's partition stepped at once with offload_optimizer nvme (the
  // piece read from and written back to the swap files); no effect otherwise.
  std::int64_t sub_group_size = 1000000000;
  OffloadConfig offload_optimizer;                      // buffer_count 4
  OffloadConfig offload_param = OffloadConfig::param_defaults();  // stage 3 only
};

// aio: DeepSpeed's asynchronous I/O settings for NVMe offload (the swap files' reads and
// writes: block_size-byte requests, queue_depth of them in flight per thread).
struct AioConfig {
  std::int64_t block_size = 1048576;  // bytes per request
  int queue_depth = 8;                // requests in flight per thread
  int thread_count = 1;               // DeepSpeed's intra_op_parallelism (also read as thread_count)
  bool single_submit = false;         // accepted; no effect (each request is submitted on its own)
  bool overlap_events = true;         // accepted; dstrain always overlaps
  bool use_gds = false;               // GPUDirect Storage: not supported (true is an error)
};

// data_types: the dtype micro-step gradients are summed in over gradient_accumulation_steps.
struct DataTypesConfig {
  // "fp32" | "fp16" | "bf16"; None -> the working dtype (DeepSpeed's default). The parser
  // accepts only the working dtype or "fp32" (docs/user/config.md).
  std::optional<std::string> grad_accum_dtype;
};

struct CheckpointConfig {
  std::string tag_validation = "Warn";  // "Ignore" | "Warn" | "Fail" (as written in DeepSpeed docs)
  bool async_save = false;              // dstrain extension: background snapshot writer
  // dstrain extension: threads that read and write one checkpoint file; 0 = automatic (the
  // CPUs, at most 4).
  int io_threads = 0;
};

// dstrain extension (DeepSpeed takes the timeout as init_distributed(timeout=...)).
struct CommsConfig {
  // Seconds a rank waits in one collective for the others before the job ends with one line
  // naming the collective (0: forever). Default: torch's default_pg_timeout, 30 minutes.
  double timeout = 1800.0;
};

// DeepSpeed's comms_logger: per collective kind and message size, counts, latencies and
// bandwidths, a summary at the end of training (docs/user/monitoring.md).
struct CommsLoggerConfig {
  bool enabled = false;
  bool verbose = false;               // print each operation as it completes (rank 0)
  bool prof_all = true;               // every collective; false: only prof_ops
  std::vector<std::string> prof_ops;  // collective names ("all_reduce", ...), checked by the engine
  bool debug = false;                 // the summary names the engine step that called each one
};

// dstrain extension: how the ranks talk on one node.
struct CommunicationConfig {
  bool shared_memory = true;    // shared-memory collectives between the ranks of a node; false: plain MPI
  bool progress_thread = true;  // a thread that drives the non-blocking collectives
  // The communicator of a GPU model's gradients: "auto" | "nccl" | "staged" (ds/mpi/device_comm.h
  // has the rule auto follows).
  std::string device_backend = "auto";
};

// dstrain extension: which compute kernels run.
struct KernelsConfig {
  // "auto" | "materialized" | "flash". auto = materialized; flash only on a GPU with fp16/bf16.
  std::string attention = "auto";
  std::int64_t attention_block = 256;           // rows per query block of the materialized GPU attention
  std::string cpu_bf16_gemm = "auto";   // "auto" | "on" | "off"
};

// activation_checkpointing: DeepSpeed's deepspeed.checkpointing settings. DeepSpeed recomputes
// where the model code calls checkpoint(); the train app turns recomputation on in the
// built-in CPU models when the section is given (docs/user/training.md). The other keys tune
// DeepSpeed's GPU and model-parallel implementation: read, and warned about as having no
// effect when not at their defaults.
struct ActivationCheckpointingConfig {
  bool enabled = false;  // the section is given (an object)
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  std::optional<std::int64_t> number_checkpoints;
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
};

// csv_monitor and tensorboard (DeepSpeed's monitor sections): files under
// <output_path>/<job_name>/, written by global rank 0.
struct MonitorConfig {
  bool enabled = false;
  std::string output_path;
  std::string job_name = "DeepSpeedJobName";
};
using CsvMonitorConfig = MonitorConfig;

// flops_profiler (DeepSpeed's keys and defaults): at the optimizer step that starts when
// profile_step steps are done, global rank 0 prints the forward's profile per module
// (docs/user/monitoring.md "flops_profiler").
struct FlopsProfilerConfig {
  bool enabled = false;
  std::int64_t profile_step = 1;
  std::int64_t module_depth = -1;  // -1: every depth
  std::int64_t top_modules = 1;    // per depth in the aggregated profile
  bool detailed = true;            // the per-module tree
  std::optional<std::string> output_file;  // None or "": stdout
};

// A value written "auto" (the Hugging Face Trainer's placeholder, which it replaces before
// DeepSpeed reads the config): its key path and where it was written (file:line:col).
struct AutoValue {
  std::string path;
  std::string where;
};

struct DsConfig {
  // Batch sizes as given (0 = not given), then resolved by resolve_batch_sizes().
  std::int64_t train_batch_size = 0;
  std::int64_t train_micro_batch_size_per_gpu = 0;
  std::int64_t gradient_accumulation_steps = 0;

  std::optional<OptimizerConfig> optimizer;   // None: the client supplies one (we default to Adam)
  std::optional<SchedulerConfig> scheduler;   // None: constant lr
  Fp16Config fp16;
  Bf16Config bf16;
  ZeroConfig zero_optimization;

  double gradient_clipping = 1.0;  // 0 disables (DeepSpeed >= 0.19.3 default)
  std::optional<std::int64_t> steps_per_print;  // None: no progress lines
  bool wall_clock_breakdown = false;
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  std::optional<std::string> communication_data_type;  // "fp32" | "fp16" | "bf16"; None -> model dtype
  DataTypesConfig data_types;
  bool dataloader_drop_last = false;
  CheckpointConfig checkpoint;
  CsvMonitorConfig csv_monitor;
  MonitorConfig tensorboard;
  FlopsProfilerConfig flops_profiler;
  CommsConfig comms_config;
  CommunicationConfig communication;
  CommsLoggerConfig comms_logger;
  KernelsConfig kernels;
  ActivationCheckpointingConfig activation_checkpointing;
  AioConfig aio;
  PipelineConfig pipeline;
  std::optional<std::uint64_t> seed;  // dstrain extension (DeepSpeed has no top-level seed)

  // The "auto" values as written, in order; fill_auto_values() (ds/config/parse.h) resolves them.
  std::vector<AutoValue> auto_values;

  // Where it came from ("<json string>" for inline configs), for error messages.
  std::string source = "<config>";
  // The document as written (comments stripped), kept for checkpoints and ds_config check.
  nlohmann::json raw = nlohmann::json::object();
};

}  // namespace ds::config

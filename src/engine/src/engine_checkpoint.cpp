// Engine::save_checkpoint / load_checkpoint over the HDF5 checkpoint store (ds_io).
// docs/user/checkpoints.md describes the layout, docs/dev/checkpoints.md the commit protocol
// and the load checks; DeepSpeedEngine.save_checkpoint / load_checkpoint (runtime/engine.py)
// the behaviour we follow.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "async_save.h"
#include "ds/core/error.h"
#include "ds/core/half.h"
#include "ds/core/log.h"
#include "ds/engine/engine.h"
#include "ds/io/checkpoint.h"
#include "ds/mpi/comms_logger.h"
#include "ds/optim/optimizer.h"
#include "ds/sched/lr_scheduler.h"
#include "grad_sync.h"
#include "param_store.h"

namespace ds {

namespace {

std::int64_t get_int(const io::StateValue& s, const char* key, const std::string& where) {
  DS_CHECK(s.is_map() && s.contains(key) && s.at(key).is_int(), where << ": engine state has no integer '" << key << "'");
  return s.at(key).as_int();
}
double get_double(const io::StateValue& s, const char* key, const std::string& where) {
  DS_CHECK(s.is_map() && s.contains(key) && s.at(key).is_double(), where << ": engine state has no number '" << key << "'");
  return s.at(key).as_double();
}

// The state tree is not checksummed: its numbers are checked before they are applied, each
// error naming the field (a negative micro_steps would break the accumulation boundary, a
// zero or NaN loss scale every later step).
constexpr std::int64_t kMaxCount = std::int64_t(1) << 50;

void check_range(const io::StateValue& s, const char* key, std::int64_t lo, std::int64_t hi, const std::string& field,
                 const std::string& where) {
  const std::int64_t v = get_int(s, key, where);
  DS_CHECK(v >= lo && v <= hi, where << ": engine state '" << field << "' is " << v << "; expected an integer in [" << lo
                                     << ", " << hi << "]");
}

void check_engine_state(const io::StateValue& es, const std::string& where, bool counters, bool scheduler, bool scaler) {
  for (const char* k : {"global_steps", "global_samples", "micro_steps", "skipped_steps", "applied_steps"}) {
    if (counters) check_range(es, k, 0, kMaxCount, k, where);
    else (void)get_int(es, k, where);
  }
  if (!counters) return;  // load_module_only: only the parameters are applied
  if (es.contains("gradient_accumulation_steps"))
    check_range(es, "gradient_accumulation_steps", 1, kMaxCount, "gradient_accumulation_steps", where);
  if (scheduler) {
    DS_CHECK(es.contains("lr_scheduler") && es.at("lr_scheduler").is_map(), where << ": engine state has no 'lr_scheduler'");
    check_range(es.at("lr_scheduler"), "last_batch_iteration", -1, kMaxCount, "lr_scheduler.last_batch_iteration", where);
  }
  if (scaler) {
    DS_CHECK(es.contains("loss_scaler") && es.at("loss_scaler").is_map(), where << ": engine state has no 'loss_scaler'");
    const io::StateValue& ls = es.at("loss_scaler");
    const double scale = get_double(ls, "cur_scale", where);
    DS_CHECK(std::isfinite(scale) && scale > 0, where << ": engine state 'loss_scaler.cur_scale' is " << scale
                                                      << "; expected a finite number > 0");
    check_range(ls, "cur_iter", 0, kMaxCount, "loss_scaler.cur_iter", where);
    check_range(ls, "last_overflow_iter", -1, kMaxCount, "loss_scaler.last_overflow_iter", where);
    check_range(ls, "cur_hysteresis", 0, 1 << 30, "loss_scaler.cur_hysteresis", where);
    check_range(ls, "consecutive_overflows", 0, kMaxCount, "loss_scaler.consecutive_overflows", where);
  }
}

}  // namespace

// Stage 3: this rank's pieces as dense ranges (the real elements of each group's piece: the
// padding sits at the end of a group's last pieces).
std::vector<io::ShardRange> Engine::stage3_ranges() const {
  std::vector<io::ShardRange> out;
  for (const auto& g : map_.groups) {
    const std::size_t n = g.piece_real(rank_);
    if (n > 0) out.push_back({g.dense_offset + std::size_t(rank_) * g.piece, n});
  }
  return out;
}

// What save_checkpoint writes, pointing at the store's host copies (stage 3 with padding:
// at compact copies in `scratch`, which must outlive the content).
io::CheckpointContent Engine::checkpoint_content(const io::StateValue& client_state, std::vector<std::vector<float>>& scratch) {
  io::CheckpointContent c;
  const std::size_t wsz = dtype_size(wdtype_);
  const bool s3 = map_.stage == 3;
  const char* params = s3 ? nullptr : static_cast<const char*>(store_->host_params().data());
  for (const auto& p : map_.params)
    c.params.push_back({p.name, p.shape, wdtype_, s3 ? nullptr : params + p.offset * wsz, p.dense_offset});
  c.working_dtype = std::string(dtype_name(wdtype_));
  c.zero_stage = map_.stage;
  c.flat_numel = map_.total_numel;
  c.has_shard = store_->partitioned() || rank_ == 0;
  c.shard_offset = store_->step_offset();
  c.shard_count = store_->step_count();
  // The master and the optimizer state: in memory, or the NVMe swap files mapped (the caller
  // ends the views with done_with_state_views once the content is written or copied).
  const engine::StateViews views = store_->state_views(*optimizer_);
  std::vector<std::pair<std::string, const float*>> tensors{{"fp32_master", views.master.data()}};
  for (auto& [name, span] : views.state) {
    DS_CHECK(span.size() == c.shard_count, "optimizer state '" << name << "' holds " << span.size()
                                                               << " elements, the partition " << c.shard_count);
    tensors.push_back({"optim/" + name, span.data()});
  }
  if (s3) {
    // No rank holds the working parameters whole: they are the fp32 master rounded to the
    // working dtype, which every rank writes its pieces of (the reader rebuilds them).
    c.params_in_master = true;
    c.shard_ranges = stage3_ranges();
    std::size_t real = 0;
    for (const auto& r : c.shard_ranges) real += r.count;
    if (real != map_.partition_numel) {  // padding inside the partition: copy the real elements
      scratch.assign(tensors.size(), std::vector<float>(real));
      for (std::size_t t = 0; t < tensors.size(); ++t) {
        std::size_t at = 0;
        for (const auto& g : map_.groups) {
          const std::size_t n = g.piece_real(rank_);
          std::copy_n(tensors[t].second + g.part_offset, n, scratch[t].data() + at);
          at += n;
        }
        tensors[t].second = scratch[t].data();
      }
    }
    c.shard_count = real;
  }
  for (auto& [name, data] : tensors) c.shard.push_back({name, data});
  io::StateValue& s = c.engine_state;
  s["global_steps"] = global_steps_;
  s["global_samples"] = global_samples_;
  s["micro_steps"] = micro_steps_;
  s["gradient_accumulation_steps"] = cfg_.gradient_accumulation_steps;
  s["skipped_steps"] = skipped_steps_;
  s["applied_steps"] = applied_steps_;
  s["global_grad_norm"] = global_grad_norm_;
  s["world_size"] = world_;
  s["zero_stage"] = map_.stage;
  s["optimizer"] = std::string(optimizer_->name());
  s["lr_scheduler"]["name"] = std::string(scheduler_->name());
  s["lr_scheduler"]["last_batch_iteration"] = scheduler_->last_batch_iteration();
  const auto ls = scaler_.state();
  s["loss_scaler"]["cur_scale"] = ls.cur_scale;
  s["loss_scaler"]["cur_iter"] = ls.cur_iter;
  s["loss_scaler"]["last_overflow_iter"] = ls.last_overflow_iter;
  s["loss_scaler"]["cur_hysteresis"] = std::int64_t(ls.cur_hysteresis);
  s["loss_scaler"]["consecutive_overflows"] = ls.consecutive_overflows;
  c.client_state = client_state;
  c.config_json = cfg_.raw.dump();
  if (pipeline_.world) {
    s["pipeline_stages"] = std::int64_t(pipeline_.stages);  // the grid it was saved on
    s["world_size"] = std::int64_t(pipeline_.world->size());
    place_in_whole_model(c);
  }
  return c;
}

// A pipeline stage's checkpoint is the whole model's: every parameter listed at its dense
// offset in the model, the weights in the master (params_in_master, as at stage 3), and this
// rank's real part of its step range (stages 0-2: one slice, padding at its end) at the
// stage's place in the model. Where the stage's ranks hold the same slice (ZeRO stage 0) its
// data-parallel rank 0 writes it; the others write nothing.
void Engine::place_in_whole_model(io::CheckpointContent& c) const {
  c.params.clear();
  std::size_t at = 0;
  for (const ParamInfo& p : pipeline_.model_params) {
    c.params.push_back({p.name, p.shape, wdtype_, nullptr, at});
    at += p.numel();
  }
  c.flat_numel = at;
  c.params_in_master = true;
  if (map_.stage == 3) {  // the rank's pieces, already dense: moved to the stage's place
    for (io::ShardRange& r : c.shard_ranges) r.offset += pipeline_.dense_offset;
    return;
  }
  const bool writes = store_->partitioned() || rank_ == 0;
  const std::size_t lo = c.shard_offset;
  const std::size_t real = writes && lo < map_.total_numel ? std::min(c.shard_count, map_.total_numel - lo) : 0;
  c.has_shard = true;
  c.shard_ranges.clear();
  if (real > 0) c.shard_ranges.push_back({pipeline_.dense_offset + lo, real});
  c.shard_count = real;
}

// Joins the background writer of a pending async save and commits it (collective).
std::string Engine::wait_for_checkpoint() {
  engine::AsyncSave& a = *async_save_;
  if (!a.in_flight) return "";
  if (a.worker.joinable()) a.worker.join();
  a.in_flight = false;
  std::string dir = io::commit_save(checkpoint_comm(), a.pending, a.result);
  DS_INFO("saved checkpoint " << dir);  // the same line as a synchronous save, once committed
  return dir;
}

void Engine::save_checkpoint(const std::string& save_dir, std::optional<std::string> tag,
                             const io::StateValue& client_state, bool save_latest) {
  CommCallerScope caller("save_checkpoint");
  resolve_step();  // the counters, scaler and scheduler a save writes include the last step's outcome
  wait_for_checkpoint();
  const std::string t = tag.value_or("global_step" + std::to_string(global_steps_));
  if (micro_steps_ % cfg_.gradient_accumulation_steps != 0) {
    DS_WARN("save_checkpoint in the middle of a gradient accumulation cycle: the partial gradients are not saved");
  }
  store_->to_host(*optimizer_);  // GPU path: the host staging copies are what gets written
  std::vector<std::vector<float>> scratch;
  io::CheckpointContent c = checkpoint_content(client_state, scratch);
  io::SaveOptions o;
  o.save_latest = save_latest;
  o.io_threads = cfg_.checkpoint.io_threads;
  o.tag_validation = io::parse_tag_validation(cfg_.checkpoint.tag_validation);
  // The swap-file views (NVMe offload) end when the content is written, or copied for the
  // background writer, also when that throws.
  struct EndViews {
    engine::ParamStore& s;
    ~EndViews() {
      try { s.done_with_state_views(false); } catch (...) {}
    }
  } end_views{*store_};
  if (!cfg_.checkpoint.async_save) {
    std::string dir = io::save_checkpoint(checkpoint_comm(), save_dir, t, c, o);
    DS_INFO("saved checkpoint " << dir);
    return;
  }
  // Async: tag check + tmp dir now (collective, this thread), snapshot, write on a thread.
  engine::AsyncSave& a = *async_save_;
  a.pending = io::begin_save(checkpoint_comm(), save_dir, t, o, c);
  std::size_t bytes = 0;
  const bool rank0 = checkpoint_comm().rank() == 0;
  if (rank0 && !c.params_in_master) for (const auto& p : c.params) bytes += p.numel() * dtype_size(p.dtype);
  if (c.has_shard) bytes += c.shard.size() * c.shard_count * sizeof(float);
  bytes += 64 * (c.params.size() + c.shard.size());  // alignment slack
  if (a.snapshot.bytes() < bytes) a.snapshot = HostBuffer(bytes);
  char* dst = static_cast<char*>(a.snapshot.data());
  auto copy = [&](const void* src, std::size_t n) {
    std::memcpy(dst, src, n);
    const void* out = dst;
    dst += (n + 63) / 64 * 64;
    return out;
  };
  if (rank0) {
    if (!c.params_in_master)
      for (auto& p : c.params) p.data = copy(p.data, p.numel() * dtype_size(p.dtype));
  } else {
    c.params.clear();
  }
  if (c.has_shard) {
    for (auto& s : c.shard) s.data = static_cast<const float*>(copy(s.data, c.shard_count * sizeof(float)));
  }
  a.content = std::move(c);
  a.in_flight = true;
  const int rank = checkpoint_comm().rank();
  a.worker = std::thread([&a, rank] { a.result = io::write_local(a.pending, rank, a.content); });
}

namespace {

// The tag to load: the one given, else the one in load_dir/latest (nullopt, with DeepSpeed's
// warning, when there is none).
std::optional<std::string> tag_to_load(const std::string& load_dir, const std::optional<std::string>& tag) {
  if (tag) return *tag;
  auto latest = io::read_latest(load_dir);
  if (!latest) {
    DS_WARN("Unable to find latest file at " << load_dir << "/latest, if trying to load latest checkpoint please "
            "ensure this file exists or pass an explicit checkpoint tag when loading a checkpoint.");
  }
  return latest;
}

// A checkpoint checked on this rank before anything of the engine changes.
struct CheckedLoad {
  std::unique_ptr<io::CheckpointReader> reader;
  io::StateValue engine_state, client_state;
  std::vector<std::size_t> present;  // indices of the model's parameters found in the checkpoint
};

// The optimizer state: saved for the same flat layout (a pipeline stage's: the same run of the
// saved model) and optimizer, every dataset present, and the ranges this rank steps checksummed.
void check_optimizer_state(io::CheckpointReader& r, const io::StateValue& es, const optim::Optimizer& optimizer,
                           const std::vector<io::ExpectedParam>& expected, const std::vector<io::ShardRange>& ranges,
                           bool part_of_model) {
  DS_CHECK(part_of_model ? r.holds_flat_layout(expected) : r.same_flat_layout(expected),
           "checkpoint " << r.dir() << ": the saved parameter layout (names, shapes, order) differs from the model's, "
                         "so its optimizer state cannot be loaded; load with load_optimizer_states = false");
  std::string saved_opt = es.contains("optimizer") && es.at("optimizer").is_string() ? es.at("optimizer").as_string() : "?";
  DS_CHECK(saved_opt == optimizer.name(), "checkpoint " << r.dir() << " holds " << saved_opt
                                                        << " optimizer state; this engine runs " << optimizer.name()
                                                        << " (load with load_optimizer_states = false)");
  DS_CHECK(r.has_shard_dataset("fp32_master"), "checkpoint " << r.dir() << " has no fp32_master");
  for (const auto& name : optimizer.state_names())
    DS_CHECK(r.has_shard_dataset("optim/" + name), "checkpoint " << r.dir() << " has no optimizer state 'optim/" << name << "'");
  for (const auto& rg : ranges) r.verify_flat_range(rg.offset, rg.count);
}

// A pipeline stage's parameters in a checkpoint of the whole model: each present with its
// shape (a missing one is an error under load_module_strict); the other stages' are not its.
void check_stage_params(const io::CheckpointReader& r, const std::vector<io::ExpectedParam>& expected, bool strict) {
  for (const auto& e : expected) {
    const auto& mp = r.manifest().params;
    const auto it = std::find_if(mp.begin(), mp.end(), [&](const io::ManifestParam& q) { return q.name == e.name; });
    if (it == mp.end()) {
      DS_CHECK(!strict, "checkpoint " << r.dir() << " does not hold this pipeline stage's parameter " << e.name
                                      << " (load_module_strict)");
      DS_WARN("checkpoint " << r.dir() << ": missing in checkpoint: " << e.name);
      continue;
    }
    DS_CHECK(it->shape == e.shape, "checkpoint " << r.dir() << ": shape of " << e.name << " differs from the model's");
  }
}

// Opens and checks the checkpoint: names and shapes, the engine state's numbers, the client
// state (the caller's check), the optimizer state when it is loaded, and the checksums of the
// parameters. `ranges`: the dense ranges this rank steps. A pipeline stage (`shift`: its place
// in the model) checks its own parameters only.
CheckedLoad check_checkpoint(const std::string& load_dir, const std::string& tag, int io_threads,
                             const engine::PartitionMap& map, const LoadOptions& opt, bool load_opt,
                             const optim::Optimizer& optimizer, const std::vector<io::ShardRange>& ranges,
                             bool part_of_model, std::size_t shift) {
  CheckedLoad c;
  c.reader = std::make_unique<io::CheckpointReader>(load_dir, tag, io::LoadOptions{io_threads});
  io::CheckpointReader& r = *c.reader;
  std::vector<io::ExpectedParam> expected;
  for (const auto& p : map.params) expected.push_back({p.name, p.shape, shift + p.dense_offset});
  if (part_of_model) check_stage_params(r, expected, opt.load_module_strict);
  else r.check_model(expected, opt.load_module_strict);
  std::vector<std::string> names;
  const auto& mp = r.manifest().params;
  for (std::size_t i = 0; i < map.params.size(); ++i) {
    if (std::any_of(mp.begin(), mp.end(), [&](const io::ManifestParam& q) { return q.name == map.params[i].name; })) {
      c.present.push_back(i);
      names.push_back(map.params[i].name);
    }
  }
  c.engine_state = r.engine_state();
  c.client_state = r.client_state();
  const std::string where = r.dir() + "/" + io::kModelFile;
  check_engine_state(c.engine_state, where, !opt.load_module_only,
                     opt.load_lr_scheduler_states && !opt.load_module_only, load_opt);
  if (opt.check_client_state) opt.check_client_state(c.client_state, r.dir());
  if (load_opt) check_optimizer_state(r, c.engine_state, optimizer, expected, ranges, part_of_model);
  r.verify_params(names);
  return c;
}

// Stage 3: this rank's pieces only. With the optimizer state: the master's dense ranges;
// without: each parameter's weights (DeepSpeed's _restore_from_bit16_weights), cut to the pieces.
void read_stage3_pieces(io::CheckpointReader& r, const engine::PartitionMap& map, int rank, const CheckedLoad& c,
                        bool load_opt, DType wdtype, std::size_t shift, engine::StateViews& views) {
  float* master = views.master.data();
  if (load_opt) {
    for (std::size_t gi = 0; gi < map.groups.size(); ++gi) {
      const auto& g = map.groups[gi];
      const std::size_t n = g.piece_real(rank);
      if (n == 0) continue;
      const std::size_t dense = shift + g.dense_offset + std::size_t(rank) * g.piece;
      r.read_flat("fp32_master", dense, n, master + g.part_offset);
      for (auto& [name, span] : views.state) r.read_flat("optim/" + name, dense, n, span.data() + g.part_offset);
    }
    return;
  }
  std::vector<char> piece;
  std::vector<float> f32;
  for (std::size_t i : c.present) {
    const auto& p = map.params[i];
    const auto& g = map.groups[map.group_of(i)];
    const std::size_t lo = g.offset + std::size_t(rank) * g.piece, hi = lo + g.piece;
    const std::size_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.numel);
    if (a >= b) continue;
    piece.resize((b - a) * dtype_size(wdtype));  // this rank's part of the tensor only
    r.read_param_range(p.name, a - p.offset, b - a, piece.data(), wdtype);
    f32.resize(b - a);
    convert(piece.data(), wdtype, f32.data(), DType::F32, b - a);
    std::copy(f32.begin(), f32.end(), master + g.part_offset + (a - lo));
  }
}

// Stages 0-2: every parameter's weights, and this rank's step range [off, off + cnt) of the
// master and optimizer state (without them: the master from the loaded weights, as DeepSpeed's
// _restore_from_bit16_weights). `saved`: the range's real elements in the checkpoint's flat
// space (a pipeline stage's start further into the model; padding is not saved).
void read_dense(io::CheckpointReader& r, const engine::PartitionMap& map, const CheckedLoad& c, bool load_opt,
                DType wdtype, char* params, std::size_t off, std::size_t cnt, io::ShardRange saved,
                engine::StateViews& views) {
  const std::size_t wsz = dtype_size(wdtype);
  for (std::size_t i : c.present) {
    const auto& p = map.params[i];
    r.read_param(p.name, params + p.offset * wsz, wdtype, p.numel);
  }
  if (load_opt) {
    r.read_flat("fp32_master", saved.offset, saved.count, views.master.data());
    for (auto& [name, span] : views.state) r.read_flat("optim/" + name, saved.offset, saved.count, span.data());
  } else {
    convert(params + off * wsz, wdtype, views.master.data(), DType::F32, cnt);
  }
}

}  // namespace

std::optional<std::pair<std::string, io::StateValue>> Engine::load_checkpoint(const std::string& load_dir,
                                                                               std::optional<std::string> tag,
                                                                               const LoadOptions& opt) {
  CommCallerScope caller("load_checkpoint");
  resolve_step();  // the last step's outcome now, not over the loaded state later
  wait_for_checkpoint();
  const std::optional<std::string> t = tag_to_load(load_dir, tag);
  if (!t) return std::nullopt;

  // ---- validate everything (on every rank) before touching the engine ----
  const bool load_opt = opt.load_optimizer_states && !opt.load_module_only;
  const bool s3 = map_.stage == 3;
  const std::size_t off = store_->step_offset();
  const std::size_t cnt = store_->step_count();
  // The dense ranges this rank steps: its slice (stages 1-2), everything (stage 0), or its
  // pieces (stage 3).
  // A pipeline stage's slice sits further into the model's flat space, without its padding.
  const bool part_of_model = pipeline_.world != nullptr;
  const std::size_t shift = part_of_model ? pipeline_.dense_offset : 0;
  const io::ShardRange saved{shift + off, part_of_model && off < map_.total_numel
                                              ? std::min(cnt, map_.total_numel - off)
                                              : cnt};
  std::vector<io::ShardRange> ranges = s3 ? stage3_ranges() : std::vector<io::ShardRange>{saved};
  if (s3)
    for (io::ShardRange& rg : ranges) rg.offset += shift;
  std::string error;
  CheckedLoad c;
  try {
    c = check_checkpoint(load_dir, *t, cfg_.checkpoint.io_threads, map_, opt, load_opt, *optimizer_, ranges,
                         part_of_model, shift);
  } catch (const std::exception& ex) {
    error = ex.what();
  }
  // Every rank (of the job, for a pipeline stage) learns whether any rank failed, so all keep
  // their state together.
  float bad = error.empty() ? 0.0f : 1.0f;
  if (checkpoint_comm().size() > 1) checkpoint_comm().all_reduce(TensorView{&bad, 1, DType::F32}, ReduceOp::Max);
  if (!error.empty()) throw Error(error);
  DS_CHECK(bad == 0.0f, "load_checkpoint: another rank failed to validate checkpoint " << load_dir << "/" << *t
                                                                                       << " (see its message); nothing was loaded");

  // ---- apply ----
  // In memory, or the NVMe swap files mapped (written back, and at stage 3 the working
  // partition rounded from them, by done_with_state_views).
  engine::StateViews views = store_->state_views(*optimizer_);
  if (s3) {
    read_stage3_pieces(*c.reader, map_, rank_, c, load_opt, wdtype_, shift, views);
  } else {
    read_dense(*c.reader, map_, c, load_opt, wdtype_, static_cast<char*>(store_->host_params().data()), off, cnt,
               saved, views);
  }
  store_->done_with_state_views(true);
  if (!opt.load_module_only) apply_engine_state(c.engine_state, opt, load_opt);
  store_->from_host(*optimizer_, load_opt);  // GPU path: the loaded values go to the device
  sync_->params_changed();                    // stage 3: gathered copies are stale
  store_->zero_grads();
  reset_cycle();
  DS_INFO("loaded checkpoint " << c.reader->dir());
  return std::make_pair(c.reader->dir(), std::move(c.client_state));
}

// The counters, scheduler and loss scaler of a validated engine state.
void Engine::apply_engine_state(const io::StateValue& es, const LoadOptions& opt, bool load_opt) {
  global_steps_ = es.at("global_steps").as_int();
  global_samples_ = es.at("global_samples").as_int();
  // micro_steps only places the accumulation boundary (micro_steps % gas); an elastic
  // load may change gas (same global batch, other world size), so it is re-derived then.
  const std::int64_t gas = cfg_.gradient_accumulation_steps;
  const bool same_gas = es.contains("gradient_accumulation_steps") && es.at("gradient_accumulation_steps").is_int() &&
                        es.at("gradient_accumulation_steps").as_int() == gas;
  micro_steps_ = same_gas ? es.at("micro_steps").as_int() : global_steps_ * gas;
  skipped_steps_ = es.at("skipped_steps").as_int();
  if (opt.load_lr_scheduler_states) scheduler_->set_last_batch_iteration(es.at("lr_scheduler").at("last_batch_iteration").as_int());
  if (load_opt) {
    applied_steps_ = es.at("applied_steps").as_int();
    const auto& ls = es.at("loss_scaler");
    precision::LossScalerState st;
    st.cur_scale = ls.at("cur_scale").as_double();
    st.cur_iter = ls.at("cur_iter").as_int();
    st.last_overflow_iter = ls.at("last_overflow_iter").as_int();
    st.cur_hysteresis = int(ls.at("cur_hysteresis").as_int());
    st.consecutive_overflows = ls.at("consecutive_overflows").as_int();
    scaler_.set_state(st);
  }
}

namespace io {
std::string wait_for_checkpoint(Engine& engine) { return engine.wait_for_checkpoint(); }
}  // namespace io

}  // namespace ds

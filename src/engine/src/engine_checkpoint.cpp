// Engine::save_checkpoint / load_checkpoint over the HDF5 checkpoint store (ds_io).
// docs/user/checkpoints.md describes the layout, the commit protocol and the load checks;
// DeepSpeedEngine.save_checkpoint / load_checkpoint (runtime/engine.py) the behaviour we follow.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "ds/core/error.h"
#include "ds/core/half.h"
#include "ds/core/log.h"
#include "ds/engine/engine.h"
#include "ds/io/checkpoint.h"
#include "ds/io/wait_for_checkpoint.h"
#include "ds/optim/optimizer.h"
#include "ds/sched/lr_scheduler.h"

namespace ds {

namespace {

// One in-flight asynchronous save per engine: the snapshot it writes from and its thread.
struct AsyncSave {
  const Communicator* comm = nullptr;
  HostBuffer snapshot;  // grown once to the size a save needs, then reused
  io::CheckpointContent content;
  io::PendingSave pending;
  io::LocalWriteResult result;
  std::thread worker;
  bool in_flight = false;
  ~AsyncSave() {
    if (worker.joinable()) worker.join();  // never commit from a destructor (collective)
  }
};

std::mutex g_async_mu;
std::map<const Engine*, std::unique_ptr<AsyncSave>>& async_saves() {
  static std::map<const Engine*, std::unique_ptr<AsyncSave>> m;
  return m;
}

AsyncSave& async_slot(const Engine* e) {
  std::lock_guard<std::mutex> lock(g_async_mu);
  auto& p = async_saves()[e];
  if (!p) p = std::make_unique<AsyncSave>();
  return *p;
}

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

struct EngineCheckpointAccess {
  // What save_checkpoint writes, pointing at the engine's own buffers.
  static io::CheckpointContent content(Engine& e, const io::StateValue& client_state) {
    io::CheckpointContent c;
    const std::size_t wsz = dtype_size(e.wdtype_);
    for (const auto& p : e.map_.params) {
      c.params.push_back({p.name, p.shape, e.wdtype_, static_cast<const char*>(e.params_.data()) + p.offset * wsz, p.offset});
    }
    c.working_dtype = std::string(dtype_name(e.wdtype_));
    c.zero_stage = e.map_.stage;
    c.flat_numel = e.map_.total_numel;
    const bool partitioned = e.map_.stage >= 1;
    c.has_shard = partitioned || e.rank_ == 0;
    c.shard_offset = partitioned ? e.slice_.offset : 0;
    c.shard_count = partitioned ? e.slice_.real_count : e.map_.total_numel;
    c.shard.push_back({"fp32_master", e.master_.as<float>()});
    for (auto& [name, span] : e.optimizer_->state_tensors()) {
      DS_CHECK(span.size() == c.shard_count, "optimizer state '" << name << "' holds " << span.size()
                                                                 << " elements, the partition " << c.shard_count);
      c.shard.push_back({"optim/" + name, span.data()});
    }
    io::StateValue& s = c.engine_state;
    s["global_steps"] = e.global_steps_;
    s["global_samples"] = e.global_samples_;
    s["micro_steps"] = e.micro_steps_;
    s["gradient_accumulation_steps"] = e.cfg_.gradient_accumulation_steps;
    s["skipped_steps"] = e.skipped_steps_;
    s["applied_steps"] = e.applied_steps_;
    s["global_grad_norm"] = e.global_grad_norm_;
    s["world_size"] = e.world_;
    s["zero_stage"] = e.map_.stage;
    s["optimizer"] = std::string(e.optimizer_->name());
    s["lr_scheduler"]["name"] = std::string(e.scheduler_->name());
    s["lr_scheduler"]["last_batch_iteration"] = e.scheduler_->last_batch_iteration();
    const auto ls = e.scaler_.state();
    s["loss_scaler"]["cur_scale"] = ls.cur_scale;
    s["loss_scaler"]["cur_iter"] = ls.cur_iter;
    s["loss_scaler"]["last_overflow_iter"] = ls.last_overflow_iter;
    s["loss_scaler"]["cur_hysteresis"] = std::int64_t(ls.cur_hysteresis);
    s["loss_scaler"]["consecutive_overflows"] = ls.consecutive_overflows;
    c.client_state = client_state;
    c.config_json = e.cfg_.raw.dump();
    return c;
  }

  static io::SaveOptions options(const Engine& e, bool save_latest) {
    io::SaveOptions o;
    o.save_latest = save_latest;
    o.tag_validation = io::parse_tag_validation(e.cfg_.checkpoint.tag_validation);
    return o;
  }

  // Joins the background writer of a pending async save and commits it (collective).
  static std::string finish_async(Engine& e) {
    AsyncSave* a = nullptr;
    {
      std::lock_guard<std::mutex> lock(g_async_mu);
      auto it = async_saves().find(&e);
      if (it == async_saves().end()) return "";
      a = it->second.get();
    }
    if (!a->in_flight) return "";
    if (a->worker.joinable()) a->worker.join();
    a->in_flight = false;
    DS_CHECK(a->comm == e.comm_.get(), "async checkpoint: the pending save belongs to another engine");
    std::string dir = io::commit_save(*e.comm_, a->pending, a->result);
    DS_INFO("saved checkpoint " << dir);  // the same line as a synchronous save, once committed
    return dir;
  }

  static void save(Engine& e, const std::string& save_dir, std::optional<std::string> tag,
                   const io::StateValue& client_state, bool save_latest) {
    finish_async(e);
    const std::string t = tag.value_or("global_step" + std::to_string(e.global_steps_));
    if (e.micro_steps_ % e.cfg_.gradient_accumulation_steps != 0) {
      DS_WARN("save_checkpoint in the middle of a gradient accumulation cycle: the partial gradients are not saved");
    }
    e.device_to_host();  // GPU path: the host staging copies are what gets written
    io::CheckpointContent c = content(e, client_state);
    const io::SaveOptions o = options(e, save_latest);
    if (!e.cfg_.checkpoint.async_save) {
      std::string dir = io::save_checkpoint(*e.comm_, save_dir, t, c, o);
      DS_INFO("saved checkpoint " << dir);
      return;
    }
    // Async: tag check + tmp dir now (collective, this thread), snapshot, write on a thread.
    AsyncSave& a = async_slot(&e);
    a.comm = e.comm_.get();
    a.pending = io::begin_save(*e.comm_, save_dir, t, o, c);
    std::size_t bytes = 0;
    const bool rank0 = e.rank_ == 0;
    if (rank0) for (const auto& p : c.params) bytes += p.numel() * dtype_size(p.dtype);
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
      for (auto& p : c.params) p.data = copy(p.data, p.numel() * dtype_size(p.dtype));
    } else {
      c.params.clear();
    }
    if (c.has_shard) {
      for (auto& s : c.shard) s.data = static_cast<const float*>(copy(s.data, c.shard_count * sizeof(float)));
    }
    a.content = std::move(c);
    a.in_flight = true;
    const int rank = e.rank_;
    a.worker = std::thread([&a, rank] { a.result = io::write_local(a.pending, rank, a.content); });
  }

  static std::optional<std::pair<std::string, io::StateValue>> load(Engine& e, const std::string& load_dir,
                                                                    std::optional<std::string> tag,
                                                                    const Engine::LoadOptions& opt) {
    finish_async(e);
    std::string t;
    if (tag) {
      t = *tag;
    } else {
      auto latest = io::read_latest(load_dir);
      if (!latest) {
        DS_WARN("Unable to find latest file at " << load_dir << "/latest, if trying to load latest checkpoint please "
                "ensure this file exists or pass an explicit checkpoint tag when loading a checkpoint.");
        return std::nullopt;
      }
      t = *latest;
    }

    // ---- validate everything (on every rank) before touching the engine ----
    std::string error;
    std::unique_ptr<io::CheckpointReader> r;
    io::StateValue es, client;
    std::vector<std::size_t> present;  // indices of map_.params found in the checkpoint
    const bool load_opt = opt.load_optimizer_states && !opt.load_module_only;
    const bool partitioned = e.map_.stage >= 1;
    const std::size_t off = partitioned ? e.slice_.offset : 0;
    const std::size_t cnt = partitioned ? e.slice_.real_count : e.map_.total_numel;
    auto states = e.optimizer_->state_tensors();
    try {
      r = std::make_unique<io::CheckpointReader>(load_dir, t);
      std::vector<io::ExpectedParam> expected;
      for (const auto& p : e.map_.params) expected.push_back({p.name, p.shape, p.offset});
      r->check_model(expected, opt.load_module_strict);
      std::vector<std::string> names;
      for (std::size_t i = 0; i < e.map_.params.size(); ++i) {
        const auto& mp = r->manifest().params;
        if (std::any_of(mp.begin(), mp.end(), [&](const io::ManifestParam& q) { return q.name == e.map_.params[i].name; })) {
          present.push_back(i);
          names.push_back(e.map_.params[i].name);
        }
      }
      es = r->engine_state();
      client = r->client_state();
      const std::string where = r->dir() + "/" + io::kModelFile;
      check_engine_state(es, where, !opt.load_module_only, opt.load_lr_scheduler_states && !opt.load_module_only, load_opt);
      if (opt.check_client_state) opt.check_client_state(client, r->dir());
      if (load_opt) {
        DS_CHECK(r->same_flat_layout(expected),
                 "checkpoint " << r->dir() << ": the saved parameter layout (names, shapes, order) differs from the model's, "
                               "so its optimizer state cannot be loaded; load with load_optimizer_states = false");
        std::string saved_opt = es.contains("optimizer") && es.at("optimizer").is_string() ? es.at("optimizer").as_string() : "?";
        DS_CHECK(saved_opt == e.optimizer_->name(), "checkpoint " << r->dir() << " holds " << saved_opt
                                                                  << " optimizer state; this engine runs " << e.optimizer_->name()
                                                                  << " (load with load_optimizer_states = false)");
        DS_CHECK(r->has_shard_dataset("fp32_master"), "checkpoint " << r->dir() << " has no fp32_master");
        for (auto& [name, span] : states)
          DS_CHECK(r->has_shard_dataset("optim/" + name), "checkpoint " << r->dir() << " has no optimizer state 'optim/" << name << "'");
        r->verify_flat_range(off, cnt);
      }
      r->verify_params(names);
    } catch (const std::exception& ex) {
      error = ex.what();
    }
    // Every rank learns whether any rank failed, so all keep their state together.
    float bad = error.empty() ? 0.0f : 1.0f;
    if (e.world_ > 1) e.comm_->all_reduce(TensorView{&bad, 1, DType::F32}, ReduceOp::Max);
    if (!error.empty()) throw Error(error);
    DS_CHECK(bad == 0.0f, "load_checkpoint: another rank failed to validate checkpoint " << load_dir << "/" << t
                                                                                         << " (see its message); nothing was loaded");

    // ---- apply ----
    const std::size_t wsz = dtype_size(e.wdtype_);
    for (std::size_t i : present) {
      const auto& p = e.map_.params[i];
      r->read_param(p.name, static_cast<char*>(e.params_.data()) + p.offset * wsz, e.wdtype_, p.numel);
    }
    float* master = e.master_.as<float>();
    if (load_opt) {
      r->read_flat("fp32_master", off, cnt, master);
      for (auto& [name, span] : states) r->read_flat("optim/" + name, off, cnt, span.data());
    } else {
      // DeepSpeed's _restore_from_bit16_weights: the fp32 master from the (loaded) weights.
      convert(static_cast<const char*>(e.params_.data()) + off * wsz, e.wdtype_, master, DType::F32, cnt);
    }
    if (!opt.load_module_only) {
      e.global_steps_ = es.at("global_steps").as_int();
      e.global_samples_ = es.at("global_samples").as_int();
      // micro_steps only places the accumulation boundary (micro_steps % gas); an elastic
      // load may change gas (same global batch, other world size), so it is re-derived then.
      const std::int64_t gas = e.cfg_.gradient_accumulation_steps;
      const bool same_gas = es.contains("gradient_accumulation_steps") && es.at("gradient_accumulation_steps").is_int() &&
                            es.at("gradient_accumulation_steps").as_int() == gas;
      e.micro_steps_ = same_gas ? es.at("micro_steps").as_int() : e.global_steps_ * gas;
      e.skipped_steps_ = es.at("skipped_steps").as_int();
      if (opt.load_lr_scheduler_states) e.scheduler_->set_last_batch_iteration(es.at("lr_scheduler").at("last_batch_iteration").as_int());
      if (load_opt) {
        e.applied_steps_ = es.at("applied_steps").as_int();
        const auto& ls = es.at("loss_scaler");
        precision::LossScalerState st;
        st.cur_scale = ls.at("cur_scale").as_double();
        st.cur_iter = ls.at("cur_iter").as_int();
        st.last_overflow_iter = ls.at("last_overflow_iter").as_int();
        st.cur_hysteresis = int(ls.at("cur_hysteresis").as_int());
        st.consecutive_overflows = ls.at("consecutive_overflows").as_int();
        e.scaler_.set_state(st);
      }
    }
    e.host_to_device(load_opt);  // GPU path: the loaded values go to the device
    e.zero_grads();
    e.cycle_loss_sum_ = 0;
    e.cycle_losses_ = 0;
    e.cycle_loss_nonfinite_ = false;
    DS_INFO("loaded checkpoint " << r->dir());
    return std::make_pair(r->dir(), std::move(client));
  }
};

void Engine::save_checkpoint(const std::string& save_dir, std::optional<std::string> tag,
                             const io::StateValue& client_state, bool save_latest) {
  EngineCheckpointAccess::save(*this, save_dir, std::move(tag), client_state, save_latest);
}

std::optional<std::pair<std::string, io::StateValue>> Engine::load_checkpoint(const std::string& load_dir,
                                                                               std::optional<std::string> tag,
                                                                               const LoadOptions& options) {
  return EngineCheckpointAccess::load(*this, load_dir, std::move(tag), options);
}

namespace io {
std::string wait_for_checkpoint(Engine& engine) { return EngineCheckpointAccess::finish_async(engine); }
}  // namespace io

}  // namespace ds

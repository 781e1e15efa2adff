// GroupFetcher: gathers, prefetch, release and the per-group reduce-scatter (zero3_fetcher.h).
#include "zero3_fetcher.h"

#include <algorithm>
#include <cstring>

#include "ds/core/error.h"
#include "ds/core/half.h"
#include "ds/core/log.h"

namespace ds::engine {

namespace {
constexpr std::size_t pass_index(Pass p) { return p == Pass::Forward ? 0 : 1; }
}  // namespace

GroupFetcher::GroupFetcher(const PartitionMap& map, Zero3Store& store, Communicator& comm,
                           const FetchOptions& o, Timers& timers)
    : map_(map), store_(store), comm_(comm), o_(o), timers_(timers), world_(map.world_size), wdtype_(store.wdtype()) {
  DS_CHECK(map_.stage == 3 && !map_.groups.empty(), "the group fetcher needs a stage-3 partition map");
  groups_.resize(map_.groups.size());
  // Persistent groups: small ones, in order, while the model-wide budget lasts.
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const std::size_t n = map_.groups[g].numel;
    if (n <= o_.persistence_threshold && persistent_elems_ + n <= o_.model_persistence_threshold) {
      groups_[g].persistent = true;
      persistent_elems_ += n;
    }
  }
  max_padded_ = map_.largest_group();
  max_piece_ = max_padded_ / std::size_t(world_);  // padded = W x piece for every group
  if (o_.comm_dtype == wdtype_) {
    const std::size_t fit = (o_.reduce_bucket + max_padded_ - 1) / std::max<std::size_t>(1, max_padded_);
    slots_ = std::max<std::size_t>(2, std::min(fit, groups_.size()));
  }
  if (world_ > 1) {
    rs_recv_bytes_ = slots_ * max_piece_ * dtype_size(o_.comm_dtype);
    rs_recv_ = store_.reduce_scratch(rs_recv_bytes_);
    if (o_.comm_dtype != wdtype_) rs_send_ = HostBuffer(slots_ * max_padded_, o_.comm_dtype);
  }
  store_.set_comm(&comm_);
  store_.set_live_limit(o_.max_live);
}

GroupFetcher::~GroupFetcher() {
  // Reads land in the flat parameters, which the store frees after this.
  for (std::size_t g : reading_) {
    try {
      store_.finish_read_part_params(groups_[g].read);
    } catch (...) {
    }
  }
  for (auto& op : ops_) {
    try {
      if (op.work) op.work->wait();
    } catch (...) {
    }
  }
}

// ---- operations ----

void GroupFetcher::start_gather(std::size_t g) {
  Group& s = groups_[g];
  const FlatGroup& fg = map_.groups[g];
  live_ += fg.padded;
  peak_live_ = std::max(peak_live_, live_);
  store_.params_needed(g);  // a device maps the range before the gather writes it
  const TensorView dst = store_.params(fg.offset, fg.padded);
  if (store_.params_swapped()) {
    // offload_param nvme: the piece is read from the swap file into its block of the gathered
    // buffer (the all-gather then runs in place); the read runs while the module computes,
    // until finish_read.
    char* block = static_cast<char*>(dst.data) + std::size_t(comm_.rank()) * fg.piece * dtype_size(wdtype_);
    s.read = store_.start_read_part_params(g, block);
    s.state = State::Reading;
    reading_.push_back(g);
    return;
  }
  if (world_ == 1) {
    store_.read_part_params(g, dst.data);
    s.state = State::Resident;
    return;
  }
  start_all_gather(g);
}

void GroupFetcher::start_all_gather(std::size_t g) {
  Group& s = groups_[g];
  const FlatGroup& fg = map_.groups[g];
  const TensorView dst = store_.params(fg.offset, fg.padded);
  const TensorView mine =
      store_.params_swapped()
          ? TensorView{static_cast<char*>(dst.data) + std::size_t(comm_.rank()) * fg.piece * dtype_size(wdtype_), fg.piece, wdtype_}
          : store_.part_params(g);
  Op op;
  op.id = next_id_++;
  op.gather = true;
  op.group = g;
  op.work = comm_.iall_gather(mine, dst);
  s.state = State::Gathering;
  s.gather_op = op.id;
  ops_.push_back(std::move(op));
}

void GroupFetcher::finish_read(std::size_t g) {
  Group& s = groups_[g];
  reading_.erase(std::find(reading_.begin(), reading_.end(), g));
  try {
    store_.finish_read_part_params(s.read);
  } catch (...) {  // the read failed: the group holds nothing
    s.state = State::Released;
    live_ -= map_.groups[g].padded;
    throw;
  }
  if (world_ == 1) {
    s.state = State::Resident;
    return;
  }
  start_all_gather(g);
}

void GroupFetcher::finish_reads() {
  while (!reading_.empty()) finish_read(reading_.front());
}

void GroupFetcher::drop_read(std::size_t g) {
  Group& s = groups_[g];
  reading_.erase(std::find(reading_.begin(), reading_.end(), g));
  s.state = State::Resident;  // once its read is done, released like a gathered group
  try {
    store_.finish_read_part_params(s.read);  // it writes into the pages released here
  } catch (...) {
    release_params(g);
    throw;
  }
  release_params(g);
}

void GroupFetcher::start_reduce_scatter(std::size_t g) {
  Group& s = groups_[g];
  s.reduced = true;
  const FlatGroup& fg = map_.groups[g];
  store_.grads_needed(g);  // a device maps what backward never wrote: the collective reads it all
  const TensorView flat = store_.grads(fg.offset, fg.padded);
  if (world_ == 1) {  // nothing to reduce: fold the group's gradients and drop its pages
    fold_gradients(g, flat.data);
    store_.release_grads(g);
    return;
  }
  // At most slots_ in flight: wait for the oldest reduce-scatter (and what precedes it).
  while (rs_in_flight_ >= slots_) {
    auto it = std::find_if(ops_.begin(), ops_.end(), [](const Op& o) { return !o.gather; });
    DS_CHECK(it != ops_.end(), "stage 3: reduce-scatter bookkeeping lost an operation");
    timers_.start("bucket_wait");
    wait_until(it->id);
    timers_.stop("bucket_wait");
  }
  Op op;
  op.id = next_id_++;
  op.gather = false;
  op.group = g;
  op.slot = rs_started_++ % slots_;
  TensorView send = flat;
  if (o_.comm_dtype != wdtype_) {
    send = TensorView{static_cast<char*>(rs_send_.data()) + op.slot * max_padded_ * dtype_size(o_.comm_dtype), fg.padded,
                      o_.comm_dtype};
    convert(flat.data, wdtype_, send.data, o_.comm_dtype, fg.padded);
  }
  const TensorView recv{static_cast<char*>(rs_recv_) + op.slot * max_piece_ * dtype_size(o_.comm_dtype), fg.piece,
                        o_.comm_dtype};
  op.work = comm_.ireduce_scatter(send, recv, ReduceOp::Sum);
  rs_in_flight_++;
  ops_.push_back(std::move(op));
  if (!o_.overlap) wait_until(ops_.back().id);
}

void GroupFetcher::fold_gradients(std::size_t g, const void* reduced) {
  // The piece's fp32 partition accumulates the reduced sums of every micro-step of the cycle.
  const DType t = world_ == 1 ? wdtype_ : o_.comm_dtype;
  store_.fold(g, TensorView{const_cast<void*>(reduced), map_.groups[g].piece, t});
}

void GroupFetcher::complete_front() {
  Op op = std::move(ops_.front());
  ops_.pop_front();
  if (op.work) op.work->wait();
  if (op.gather) {
    // A device store ordered the compute stream behind this gather at the acquire already
    // (the group is Resident, maybe released or gathered again since): nothing left to do.
    if (gather_pending(op)) groups_[op.group].state = State::Resident;
    return;
  }
  rs_in_flight_--;
  fold_gradients(op.group, static_cast<const char*>(rs_recv_) + op.slot * max_piece_ * dtype_size(o_.comm_dtype));
  store_.release_grads(op.group);
}

bool GroupFetcher::gather_pending(const Op& op) const {
  const Group& s = groups_[op.group];
  return op.gather && s.state == State::Gathering && s.gather_op == op.id;
}

void GroupFetcher::wait_until(std::uint64_t id) {
  while (!ops_.empty() && ops_.front().id <= id) complete_front();
}

void GroupFetcher::release_params(std::size_t g) {
  Group& s = groups_[g];
  if (s.state == State::Released) return;
  store_.release_params(g);
  s.state = State::Released;
  s.stale = false;
  live_ -= map_.groups[g].padded;
}

// ---- the module's brackets ----

void GroupFetcher::acquire(std::size_t g, Pass pass) {
  DS_CHECK(g < groups_.size(), "GroupHooks::acquire(" << g << "): the module declared " << groups_.size() << " groups");
  Group& s = groups_[g];
  if (s.refs++ > 0) return;  // nested bracket: already resident
  try {
    make_resident(g, pass);
  } catch (...) {
    // Not acquired (a failed read, map or gather): the caller's bracket never got the group,
    // so no release() comes for it; the wait timer stops here (a no-op if it never started).
    --s.refs;
    timers_.stop("gather_wait");
    throw;
  }
}

void GroupFetcher::make_resident(std::size_t g, Pass pass) {
  Group& s = groups_[g];
  const std::size_t k = pass_index(pass);
  if (!traced_[k]) {
    trace_[k].push_back(g);
  } else if (!diverged_[k]) {
    // Follow the trace; a use it did not predict stops prefetching for the rest of the pass.
    auto& t = trace_[k];
    auto it = std::find(t.begin() + std::ptrdiff_t(std::min(cursor_[k], t.size())), t.end(), g);
    if (it == t.end()) diverged_[k] = true;
    else cursor_[k] = std::size_t(it - t.begin()) + 1;
  }
  // Backward writes the group's gradients: a device maps their chunks first (not once the
  // reduce-scatter started: they are final, maybe released already).
  if (pass == Pass::Backward && !s.reduced) store_.grads_needed(g);
  timers_.start("gather_wait");
  // Several ranks: the reads started since the last acquire (prefetches) had that group's
  // compute to run; they finish here and their all-gathers start, in the order the reads
  // started -- at this call on every rank, so the collectives keep one order.
  if (world_ > 1) finish_reads();
  if (s.state == State::Resident && s.stale) {  // a persistent group after a step: refresh in place
    live_ -= map_.groups[g].padded;
    s.state = State::Released;
    s.stale = false;
  }
  if (s.state == State::Released) start_gather(g);
  if (s.state == State::Reading) finish_read(g);
  if (s.state == State::Gathering) {
    if (store_.orders_on_device()) {
      // The compute stream waits for the gather on the device (NCCL: its completion event;
      // StagedComm waits on the host, oldest operation first), so the host goes on and the
      // prefetches stay in flight; the handle is still waited in order by wait_until.
      for (Op& op : ops_)
        if (op.id == s.gather_op) store_.order_after(*op.work);
      s.state = State::Resident;
    } else {
      wait_until(s.gather_op);
    }
  }
  timers_.stop("gather_wait");
  if (o_.overlap) prefetch(pass);
}

void GroupFetcher::release(std::size_t g, Pass pass) noexcept {
  if (g >= groups_.size()) return;
  Group& s = groups_[g];
  if (s.refs <= 0 || --s.refs > 0) return;
  if (s.persistent || keep_for_reuse(g, pass)) return;
  try {
    release_params(g);
  } catch (const std::exception& e) {  // madvise refused: the pages stay, nothing is wrong
    DS_WARN("stage 3: could not release parameter group " << map_.groups[g].name << ": " << e.what());
  }
}

bool GroupFetcher::keep_for_reuse(std::size_t g, Pass pass) const {
  // DeepSpeed's max_reuse_distance: kept when the trace uses it again within that many
  // elements of other gathers, and the live total stays under max_live_parameters.
  if (live_ > o_.max_live) return false;
  const std::size_t k = pass_index(pass);
  if (!traced_[k] || diverged_[k]) return false;
  std::size_t dist = 0;
  auto scan = [&](const std::vector<std::size_t>& t, std::size_t from) {
    for (std::size_t i = from; i < t.size(); ++i) {
      if (t[i] == g) return true;
      dist += map_.groups[t[i]].padded;
      if (dist > o_.max_reuse) return false;
    }
    return false;
  };
  if (scan(trace_[k], cursor_[k])) return dist <= o_.max_reuse;
  if (k == 0 && traced_[1] && dist <= o_.max_reuse) return scan(trace_[1], 0) && dist <= o_.max_reuse;
  return false;
}

void GroupFetcher::prefetch(Pass pass) {
  const std::size_t k = pass_index(pass);
  if (!traced_[k] || diverged_[k]) return;
  std::size_t in_flight = 0;
  for (const Op& op : ops_)
    if (gather_pending(op)) in_flight += map_.groups[op.group].padded;
  for (std::size_t g : reading_) in_flight += map_.groups[g].padded;
  const auto& t = trace_[k];
  for (std::size_t i = cursor_[k]; i < t.size(); ++i) {
    Group& s = groups_[t[i]];
    if (s.state == State::Gathering || s.state == State::Reading) continue;
    if (s.state == State::Resident && !s.stale) continue;
    const std::size_t n = map_.groups[t[i]].padded;
    if (in_flight + n > o_.prefetch_elems || live_ + n > o_.max_live) break;
    if (s.stale) {
      live_ -= n;
      s.state = State::Released;
      s.stale = false;
    }
    start_gather(t[i]);
    in_flight += n;
  }
}

void GroupFetcher::release_unused() {
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    Group& s = groups_[g];
    if (s.refs == 0 && !s.persistent && s.state != State::Released) {
      if (s.state == State::Reading) {  // prefetched but not used: no all-gather
        drop_read(g);
        continue;
      }
      if (s.state == State::Gathering) wait_until(s.gather_op);
      release_params(g);
    }
  }
}

// ---- the engine's calls ----

void GroupFetcher::begin_forward() {
  if (!traced_[0]) trace_[0].clear();  // uses outside a forward (sampling first) are not the pass
  cursor_[0] = 0;
  diverged_[0] = false;
  if (o_.whole_model) acquire(0, Pass::Forward);
}

void GroupFetcher::end_forward() {
  if (o_.whole_model) release(0, Pass::Forward);
  traced_[0] = true;
}

void GroupFetcher::begin_backward(bool /*boundary*/) {
  // Stage 3 reduces on every micro-step: the flat gradients live only until their group is done.
  if (!traced_[1]) trace_[1].clear();
  cursor_[1] = 0;
  diverged_[1] = false;
  for (auto& s : groups_) {
    s.grads_ready = 0;
    s.reduced = false;
  }
  if (o_.whole_model) acquire(0, Pass::Backward);
}

void GroupFetcher::grad_ready(std::size_t i) {
  DS_CHECK(i < map_.params.size(), "Module::backward reported grad_ready(" << i << ") but the module has "
                                   << map_.params.size() << " parameters");
  const std::size_t g = map_.group_of(i);
  Group& s = groups_[g];
  if (s.reduced) return;
  if (++s.grads_ready >= map_.groups[g].param_count) start_reduce_scatter(g);
}

void GroupFetcher::end_backward() {
  if (o_.whole_model) release(0, Pass::Backward);
  timers_.start("reduce");
  // Groups whose gradients never all reported (unused parameters, a module without
  // callbacks) reduce now, last group first as backward runs, the same order on every rank.
  for (std::size_t g = groups_.size(); g-- > 0;)
    if (!groups_[g].reduced) start_reduce_scatter(g);
  wait_until(next_id_);
  timers_.stop("reduce");
  release_unused();
  traced_[1] = true;
}

void GroupFetcher::finish() { wait_until(next_id_); }

void GroupFetcher::params_changed() {
  // Every piece may have changed (a step, a load): gathered copies are stale. Persistent
  // groups keep their pages and are refreshed by the next acquire (or prefetch); the rest are
  // released already.
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    Group& s = groups_[g];
    if (s.state == State::Reading) drop_read(g);  // read before the change, maybe (a prefetch)
    if (s.state == State::Gathering) wait_until(s.gather_op);  // gathered before it, likewise
    if (s.state == State::Resident) s.stale = true;
  }
}

}  // namespace ds::engine

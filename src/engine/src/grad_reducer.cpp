// GradReducer: buckets, their launch/finish order, communication-dtype copies, averaging,
// and the ZeRO-2 release of reduced gradient pages.
#include "grad_reducer.h"

#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>

#include "chunk_table.h"
#include "ds/core/error.h"
#include "ds/core/half.h"

namespace ds::engine {

namespace {

TensorView sub_view(void* base, DType t, std::size_t offset, std::size_t count) {
  return TensorView{static_cast<char*>(base) + offset * dtype_size(t), count, t};
}

// x *= f over a F32 / F16 / BF16 view (prescaled gradient averaging).
void scale_in_place(TensorView v, float f) {
  if (f == 1.0f || v.count == 0) return;
  switch (v.dtype) {
    case DType::F32: {
      float* p = v.as<float>();
#pragma omp parallel for schedule(static) if (v.count > (1u << 16))
      for (std::int64_t i = 0; i < std::int64_t(v.count); ++i) p[i] *= f;
      return;
    }
    case DType::F16: {
      f16* p = v.as<f16>();
#pragma omp parallel for schedule(static) if (v.count > (1u << 16))
      for (std::int64_t i = 0; i < std::int64_t(v.count); ++i) p[i] = float_to_f16(f16_to_float(p[i]) * f);
      return;
    }
    case DType::BF16: {
      bf16* p = v.as<bf16>();
#pragma omp parallel for schedule(static) if (v.count > (1u << 16))
      for (std::int64_t i = 0; i < std::int64_t(v.count); ++i) p[i] = float_to_bf16(bf16_to_float(p[i]) * f);
      return;
    }
    default:
      DS_THROW("gradient scaling: unsupported dtype " << dtype_name(v.dtype));
  }
}

}  // namespace

GradReducer::GradReducer(const PartitionMap& map, ParamStore& store, Communicator& comm, const ReducerOptions& o,
                         Timers& timers)
    : map_(map), store_(store), comm_(comm), o_(o), timers_(timers), wdtype_(store.wdtype()), world_(map.world_size),
      slice_ranks_only_(map.world_size > 1 && (map.stage == 1 || map.stage == 2)) {
  if (o_.release_grads) {
    pages_ = store_.grad_space();
    DS_CHECK(pages_ != nullptr, "ZeRO-2 gradient release needs a paged gradient buffer");
    for (const ParamGroup& g : o_.groups)
      DS_CHECK(g.first + g.count <= map_.params.size(),
               "parameter group '" << g.name << "' ends at parameter " << g.first + g.count << " of "
                                   << map_.params.size());
    std::tie(keep_lo_, keep_hi_) = store_.kept_bytes();
    max_in_flight_ = 2;  // DeepSpeed's two ipg buffers: one filling, one reducing
  }
  // Data-parallel averaging (DeepSpeed's allreduce_bucket).
  if (world_ > 1) {
    const double W = world_, pd = o_.predivide_factor;
    if (o_.prescale_gradients) {
      pre_factor_ = 1.0 / W;
      post_factor_ = 1.0;
    } else {
      pre_factor_ = pd != 1.0 ? 1.0 / pd : 1.0;
      post_factor_ = pd / W;
    }
    // ZeRO-2 keeps the accumulated partition inside the reduced buffer, so a pre-scale
    // would rescale it again every micro-step: apply the whole factor after the reduction.
    // A device store does the same (the optimizer kernel applies it as part of grad_scale).
    if (map_.stage == 2 || store_.grad_pages() == nullptr) {
      post_factor_ *= pre_factor_;
      pre_factor_ = 1.0;
    }
  }
  build_buckets(o_.bucket_size);
  if (o_.comm_dtype != wdtype_ && world_ > 1) {
    // ZeRO-2: a pool of max_in_flight_ bucket-sized slots, reused (bucket k uses slot
    // k % slots; at most that many reduce at once). Stages 0/1: the whole flat space.
    std::size_t n = map_.padded_numel;
    if (o_.release_grads) {
      const std::size_t bsz = buckets_[0].end - buckets_[0].begin;  // the largest bucket
      const std::size_t slots = std::min(max_in_flight_, buckets_.size());
      for (std::size_t k = 0; k < buckets_.size(); ++k) buckets_[k].wire = (k % slots) * bsz;
      n = slots * bsz;
    }
    comm_buf_ = HostBuffer(n, o_.comm_dtype);
  }
  param_ready_.assign(map_.params.size(), 0);
}

GradReducer::~GradReducer() {
  // Outstanding non-blocking operations own their buffers until waited.
  for (auto& b : buckets_) {
    if (b.work) {
      try {
        b.work->wait();
      } catch (...) {
      }
    }
  }
}

void GradReducer::build_buckets(std::int64_t bucket_size) {
  // Sizes: reduce_bucket_size elements, at most the whole space (a small model gets one
  // bucket and allocates nothing extra: buckets are ranges of the gradients, reduced in place).
  const std::size_t total = map_.padded_numel;
  const std::size_t bsz = std::size_t(std::min<std::int64_t>(bucket_size, std::int64_t(total)));
  buckets_.clear();
  for (std::size_t end = total; end > 0;) {
    const std::size_t begin = end > bsz ? end - bsz : 0;
    Bucket b;
    b.begin = begin;
    b.end = end;
    b.wire = begin;
    buckets_.push_back(std::move(b));
    end = begin;
  }
  if (slice_ranks_only_) {
    // The slices are consecutive in rank order, so the blocks tile the bucket.
    const std::size_t rank = std::size_t(comm_.rank());
    for (Bucket& b : buckets_) {
      b.blocks.assign(std::size_t(world_), 0);
      b.own_begin = b.own_end = b.begin;
      for (std::size_t r = 0; r < std::size_t(world_); ++r) {
        const RankSlice& s = map_.slices[r];
        const std::size_t lo = std::max(b.begin, s.offset), hi = std::min(b.end, s.offset + s.count);
        if (hi <= lo) continue;
        b.blocks[r] = hi - lo;
        if (r == rank) std::tie(b.own_begin, b.own_end) = std::pair(lo, hi);
      }
    }
  }
  param_buckets_.assign(map_.params.size(), {});
  for (std::size_t k = 0; k < buckets_.size(); ++k) {
    for (std::size_t i = 0; i < map_.params.size(); ++i) {
      const auto& p = map_.params[i];
      if (p.numel == 0) continue;
      if (p.offset < buckets_[k].end && p.offset + p.numel > buckets_[k].begin) {
        buckets_[k].params_total++;
        param_buckets_[i].push_back(k);
      }
    }
  }
}

void GradReducer::begin_backward(bool boundary) {
  // fp32 accumulation folds reduced gradients after every backward, so every stage then
  // reduces on every micro-step, as ZeRO-2 always does.
  reducing_ = world_ > 1 && (map_.stage == 2 || o_.accum_fp32 || boundary);
  if (!reducing_) return;
  for (auto& b : buckets_) {
    b.params_ready = 0;
    b.launched = false;
  }
  std::fill(param_ready_.begin(), param_ready_.end(), 0);
  next_launch_ = 0;
  next_finish_ = 0;
  if (!o_.release_grads) return;
  // Device chunks without groups: no bracket says where backward writes next, so map the
  // whole space now (zeroed); the buckets still unmap it as they are reduced.
  if (pages_->on_device() && o_.groups.empty()) make_params_resident(0, map_.params.size());
  populate_bucket(0);  // host: backward writes the tail first
}

void GradReducer::acquire(std::size_t group, Pass pass) {
  if (!reducing_ || !o_.release_grads || pass != Pass::Backward || group >= o_.groups.size()) return;
  make_params_resident(o_.groups[group].first, o_.groups[group].count);
}

void GradReducer::make_params_resident(std::size_t first, std::size_t count) {
  // The units of each parameter not final yet. Not one span over the group: a final
  // parameter between two others may sit in chunks already released, which would come back.
  const std::size_t es = dtype_size(wdtype_);
  for (std::size_t i = first; i < first + count; ++i) {
    const auto& p = map_.params[i];
    if (p.numel == 0 || param_ready_[i]) continue;
    const ByteRange r = units_covering(p.offset, p.numel, es, pages_->unit(), pages_->mapped_bytes());
    pages_->make_resident(r.begin, r.end);
  }
}

void GradReducer::grad_ready(std::size_t i) {
  if (!reducing_) return;
  DS_CHECK(i < param_ready_.size(), "Module::backward reported grad_ready(" << i << ") but the module has "
                                    << param_ready_.size() << " parameters");
  if (param_ready_[i]) return;  // a repeated call changes nothing
  param_ready_[i] = 1;
  for (std::size_t k : param_buckets_[i]) buckets_[k].params_ready++;
  launch_ready_buckets();
  if (o_.release_grads) reap_finished_buckets();
}

void GradReducer::end_backward() {
  if (!reducing_) return;
  timers_.start("reduce");
  // Buckets whose parameters never reported (unused parameters, a module without
  // callbacks) start now, still in index order so every rank issues the same sequence.
  for (; next_launch_ < buckets_.size(); ++next_launch_) launch_bucket(next_launch_);
  if (map_.stage == 2) {
    // ZeRO-2 reduces every micro-step: keep only this rank's slice (which accumulates the
    // reduced sums across micro-steps: other ranks contribute zeros there), drop the rest:
    // the pages outside the slice go back to the kernel as their buckets finish (they read
    // as zero next time); other ranks' elements on the slice's first and last pages are
    // zeroed here.
    while (next_finish_ < buckets_.size()) finish_and_release(next_finish_++);
    // Device: a memset on the compute stream, which the finished reductions' wait() ordered
    // after them (NCCL: the stream waits on the completion event; staged: synchronised).
    const RankSlice& s = store_.slice();
    const std::size_t es = dtype_size(wdtype_);
    pages_->zero(keep_lo_, s.offset * es);
    pages_->zero((s.offset + s.count) * es, std::min(keep_hi_, map_.padded_numel * es));
  } else if (o_.accum_fp32) {
    for (auto& b : buckets_) finish_bucket(b);  // the store folds them next
  } else {
    pending_ = true;  // waited for in finish()
  }
  timers_.stop("reduce");
  reducing_ = false;
}

void GradReducer::finish() {
  // ZeRO-2 and fp32 accumulation reduced in every backward already.
  if (world_ > 1 && map_.stage < 2 && !o_.accum_fp32) {
    if (pending_) {
      for (auto& b : buckets_) finish_bucket(b);
    } else {
      launch_all_and_wait();  // step() without a boundary backward: still reduce
    }
  }
  pending_ = false;
}

void GradReducer::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() &&
         buckets_[next_launch_].params_ready >= buckets_[next_launch_].params_total) {
    launch_bucket(next_launch_);
    ++next_launch_;
  }
}

void GradReducer::launch_bucket(std::size_t k) {
  Bucket& b = buckets_[k];
  if (b.launched) return;
  // ZeRO-2: at most max_in_flight_ buckets reducing (launches and finishes both go in
  // index order, so the ones in flight are [next_finish_, k)).
  if (o_.release_grads && k - next_finish_ >= max_in_flight_) {
    timers_.start("bucket_wait");
    while (k - next_finish_ >= max_in_flight_) finish_and_release(next_finish_++);
    timers_.stop("bucket_wait");
  }
  const std::size_t n = b.end - b.begin;
  if (o_.release_grads && pages_->on_device()) {
    // The reduction reads and writes the whole range, also chunks no kernel wrote (padding,
    // a parameter backward never touched), which acquire() left unmapped: map them now,
    // zeroed on the compute stream that the reduction is ordered after. None of them can be
    // released already: a chunk goes only with the last bucket over it, and this one is not
    // even launched.
    const ByteRange r = units_covering(b.begin, n, dtype_size(wdtype_), pages_->unit(), pages_->mapped_bytes());
    pages_->make_resident(r.begin, r.end);
  }
  TensorView g = store_.grads(b.begin, n);
  TensorView wire = g;
  if (comm_buf_.bytes() > 0) {
    wire = sub_view(comm_buf_.data(), o_.comm_dtype, b.wire, n);
    convert(g.data, wdtype_, wire.data, o_.comm_dtype, n);
  }
  scale_in_place(wire, float(pre_factor_));  // 1 on a device store
  b.work = slice_ranks_only_ ? comm_.ireduce_scatter_in_place(wire, b.blocks, ReduceOp::Sum)
                      : comm_.iall_reduce(wire, ReduceOp::Sum);
  b.launched = true;
  if (b.work) store_.grads_reducing(b.begin, n, *b.work);
  if (o_.release_grads) populate_bucket(k + 1);  // the bucket backward is writing now
}

void GradReducer::populate_bucket(std::size_t k) {
  // Batch-faults the released pages of bucket k in one madvise(MADV_POPULATE_WRITE): about
  // 2.5 us a page here, against 5 us for a fault on first write and 8-10 us for the read
  // fault + write fault of a `+=` into a released page (bench/zero/page_release_bench).
  // Pages already present are left alone, so a bucket already (partly) written is fine.
  // Device chunks are mapped where backward is about to write (acquire), not ahead by bucket:
  // backward does not write the buckets in order (the GPT's tied head writes the embeddings,
  // in the last bucket, first), and a device has no fault to fill a chunk in late.
  if (k >= buckets_.size() || pages_->on_device()) return;
  const Bucket& b = buckets_[k];
  const ByteRange r = units_covering(b.begin, b.end - b.begin, dtype_size(wdtype_), pages_->unit(), pages_->mapped_bytes());
  const auto [below, above] = outside(r, ByteRange{keep_lo_, keep_hi_});
  pages_->make_resident(below.begin, below.end);
  pages_->make_resident(above.begin, above.end);
}

void GradReducer::finish_bucket(Bucket& b) {
  if (!b.work) return;
  b.work->wait();
  b.work.reset();
  if (comm_buf_.bytes() > 0) {
    // Back into the working dtype: the whole bucket, or (stages 1/2) the part this rank owns,
    // the only part reduced.
    const std::size_t lo = slice_ranks_only_ ? b.own_begin : b.begin, hi = slice_ranks_only_ ? b.own_end : b.end;
    convert(sub_view(comm_buf_.data(), o_.comm_dtype, b.wire + (lo - b.begin), hi - lo).data, o_.comm_dtype,
            store_.grads(lo, hi - lo).data, wdtype_, hi - lo);
  }
}

void GradReducer::finish_and_release(std::size_t k) {
  Bucket& b = buckets_[k];
  finish_bucket(b);
  // Bucket k releases the units from the first boundary at or after its first element to the
  // first at or after its end (bucket_release_range: a unit shared with bucket k + 1, lower
  // addresses, finishes later, goes with k + 1). The partition's [keep_lo_, keep_hi_) stays.
  // Device: wait() above returned after the reduction completed (NCCL: its event synchronised
  // on the host; staged: the copy back synchronised), and the kernels enqueued since the
  // launch write only parameters not final yet, which sit in no released chunk -- so nothing
  // queued uses these chunks and they may be unmapped now, without a stream synchronisation.
  const ByteRange r = bucket_release_range(b.begin, b.end, map_.padded_numel, dtype_size(wdtype_), pages_->unit(),
                                           pages_->mapped_bytes());
  if (r.empty()) return;
  // Resident pages only grow between releases, so sampling before each release sees the peak.
  grad_peak_resident_ = std::max(grad_peak_resident_, pages_->resident_bytes());
  const auto [below, above] = outside(r, ByteRange{keep_lo_, keep_hi_});
  pages_->release(below.begin, below.end);
  pages_->release(above.begin, above.end);
}

void GradReducer::reap_finished_buckets() {
  while (next_finish_ < next_launch_) {
    Bucket& b = buckets_[next_finish_];
    if (b.work && !b.work->test()) return;
    finish_and_release(next_finish_++);
  }
}

void GradReducer::launch_all_and_wait() {
  for (std::size_t k = 0; k < buckets_.size(); ++k) {
    buckets_[k].launched = false;
    launch_bucket(k);
  }
  for (auto& b : buckets_) finish_bucket(b);
}

}  // namespace ds::engine

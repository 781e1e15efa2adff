// NvmeSwap: the swap files and the streamed optimizer step (nvme_swap.h).
#include "nvme_swap.h"

#include <fcntl.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>

#include "ds/core/error.h"
#include "ds/core/half.h"
#include "ds/core/log.h"

namespace ds::engine {

namespace {

// Sub-groups start on multiples of this many elements, so every file offset and length is
// a multiple of the O_DIRECT alignment for 4-, 2- and 1-byte elements alike.
constexpr std::size_t kAlignElems = io::kDirectAlign;

// write_params_behind: elements per chunk (a multiple of kAlignElems, so every chunk starts on
// a block; 8 MiB of bf16, the I/O threads' 8 default pieces of 1 MiB) and chunks in the ring
// (one being converted while the other is written).
constexpr std::size_t kParamChunk = std::size_t(1) << 22;
constexpr std::size_t kParamRing = 2;

std::size_t round_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

}  // namespace

NvmeSwap::NvmeSwap(const NvmeOptions& o, int rank, std::size_t n, const optim::Optimizer& opt, DType wdtype)
    : o_(o), rank_(rank), n_(n), wdtype_(wdtype) {
  n_pad_ = round_up(std::max<std::size_t>(n_, 1), kAlignElems);
  sub_ = std::min(round_up(std::max<std::size_t>(o_.sub_group, 1), kAlignElems), n_pad_);
  const std::size_t groups = (n_pad_ + sub_ - 1) / sub_;
  if (o_.optimizer) {
    names_.push_back("fp32_master");
    for (const auto& s : opt.state_names()) names_.push_back(s);
  }
  const std::size_t opt_bytes = names_.size() * n_pad_ * sizeof(float);
  const std::size_t param_bytes = o_.params ? n_pad_ * dtype_size(wdtype_) : 0;
  const bool one_dir = o_.optimizer && o_.params && o_.optimizer_path == o_.params_path;
  if (o_.optimizer)
    opt_dir_ = std::make_unique<io::SwapDir>(o_.optimizer_path, o_.optimizer_key, rank_,
                                             opt_bytes + (one_dir ? param_bytes : 0));
  if (o_.params && !one_dir)
    param_dir_ = std::make_unique<io::SwapDir>(o_.params_path, o_.params_key, rank_, param_bytes);
  for (const auto& name : names_) files_.push_back(io::SwapFile::create(opt_dir_->file(name + ".swap"), n_pad_ * sizeof(float)));
  if (o_.params) {
    const io::SwapDir& d = one_dir ? *opt_dir_ : *param_dir_;
    param_file_ = std::make_unique<io::SwapFile>(io::SwapFile::create(d.file("params.swap"), param_bytes));
  }
  aio_ = std::make_unique<io::AioQueue>(o_.aio);

  if (o_.optimizer) {
    // buffer_count sets in a ring (no more than there are sub-groups to hold).
    const std::size_t nslots = std::min<std::size_t>(std::max(o_.buffer_count, 1), groups);
    slots_.resize(nslots);
    for (Slot& s : slots_) {
      for (std::size_t t = 0; t < names_.size(); ++t) s.bufs.emplace_back(sub_ * sizeof(float));
      if (o_.params) s.out = io::AlignedBuffer(sub_ * dtype_size(wdtype_));
    }
    if (groups == 1 && n_ > (std::size_t(1) << 20)) {
      DS_WARN(o_.optimizer_key << ": sub_group_size " << o_.sub_group << " covers the rank's whole partition ("
                               << n_ << " elements), so the step reads all of the optimizer state into memory at "
                               "once and nothing overlaps; set zero_optimization.sub_group_size below it (e.g. "
                               << std::max<std::size_t>(n_ / 8, kAlignElems) << ")");
    }
    // The state files start at their initial values (fallocate'd blocks read as zero).
    for (std::size_t t = 1; t < names_.size(); ++t) {
      const float v = opt.initial_state_value(t - 1);
      if (v == 0.f) continue;
      Slot& s = slots_[0];
      std::fill_n(s.bufs[t].as<float>(), sub_, v);
      for (std::size_t i = 0; i < groups; ++i)
        aio_->wait(aio_->write(files_[t], i * sub_ * sizeof(float), sub_ * sizeof(float), s.bufs[t].data()));
    }
  }
}

NvmeSwap::~NvmeSwap() {
  try {
    unmap(false);
  } catch (...) {
  }
  aio_.reset();  // joins the I/O threads before the files close
}

std::size_t NvmeSwap::count_of(std::size_t i) const { return std::min(sub_, n_ - std::min(n_, i * sub_)); }

void NvmeSwap::write_master(std::size_t offset, std::size_t count, const float* src) {
  DS_CHECK(o_.optimizer && offset + count <= n_, "NvmeSwap::write_master out of range");
  wait_step_writes();  // a step's write of these blocks landing later would undo this one
  if (count > 0) aio_->write_unaligned(files_[0], offset * sizeof(float), count * sizeof(float), src);
}

void NvmeSwap::read_params(std::size_t offset, std::size_t count, void* dst) {
  DS_CHECK(o_.params && offset + count <= n_, "NvmeSwap::read_params out of range");
  const std::size_t es = dtype_size(wdtype_);
  if (count == 0) return;
  // The blocks the bounce buffer reads hold what the last writes behind put there.
  wait_param_writes(offset * es / io::kDirectAlign * io::kDirectAlign, io::align_up((offset + count) * es));
  counters_.param_sync_reads++;
  aio_->read_unaligned(*param_file_, offset * es, count * es, dst);
}

void NvmeSwap::write_params(std::size_t offset, std::size_t count, const void* src) {
  DS_CHECK(o_.params && offset + count <= n_, "NvmeSwap::write_params out of range");
  const std::size_t es = dtype_size(wdtype_);
  if (count == 0) return;
  // A partial first or last block is read, patched and written whole: after the writes
  // behind of those blocks, or the patch would be built on older bytes (and an older write
  // landing later would undo this one); and after the open reads of them, which must not
  // see it.
  const std::size_t lo = offset * es / io::kDirectAlign * io::kDirectAlign, hi = io::align_up((offset + count) * es);
  finish_param_reads(lo, hi);
  wait_param_writes(lo, hi);
  counters_.param_sync_writes++;
  aio_->write_unaligned(*param_file_, offset * es, count * es, src);
}

void NvmeSwap::write_params_behind(const float* master) {
  DS_CHECK(o_.params, "NvmeSwap::write_params_behind without offload_param nvme");
  const std::size_t es = dtype_size(wdtype_), chunk = std::min(kParamChunk, n_pad_);
  if (param_ring_.empty()) {
    for (std::size_t k = 0; k < kParamRing; ++k) param_ring_.emplace_back(chunk * es);
    param_ring_writes_.assign(kParamRing, 0);
  }
  for (std::size_t a = 0, c = 0; a < n_; a += chunk, ++c) {
    const std::size_t k = std::min(chunk, n_ - a), lo = a * es, hi = io::align_up((a + k) * es);
    io::AlignedBuffer& buf = param_ring_[c % kParamRing];
    aio_->wait(param_ring_writes_[c % kParamRing]);  // the buffer's last chunk is on disk
    finish_param_reads(lo, hi);  // the open reads of its blocks got the older values
    wait_param_writes(lo, hi);   // and any older write of them is on disk
    convert(master + a, DType::F32, buf.data(), wdtype_, k);
    std::memset(buf.as<char>() + k * es, 0, hi - lo - k * es);  // no stale tail on disk
    const io::Ticket t = aio_->write(*param_file_, lo, hi - lo, buf.data());
    param_ring_writes_[c % kParamRing] = t;
    param_writes_.push_back({lo, hi, t});
    counters_.param_writes_behind++;
  }
}

std::uint64_t NvmeSwap::start_read_params(std::size_t offset, std::size_t count, void* dst) {
  DS_CHECK(o_.params && offset + count <= n_, "NvmeSwap::start_read_params out of range");
  const std::size_t es = dtype_size(wdtype_);
  ParamRead r;
  r.id = next_read_++;
  r.lo = offset * es / io::kDirectAlign * io::kDirectAlign;
  r.hi = io::align_up((offset + count) * es);
  r.dst = static_cast<char*>(dst);
  r.skip = offset * es - r.lo;
  r.bytes = count * es;
  if (count == 0) return r.id;  // nothing to read: finish_read_params finds no such read
  wait_param_writes(r.lo, r.hi);  // the blocks hold the last values written
  // A spare bounce buffer large enough, else a new one (the spares end up sized for the
  // largest pieces read at once).
  auto fit = std::find_if(spare_bounces_.begin(), spare_bounces_.end(),
                          [&](const io::AlignedBuffer& b) { return b.bytes() >= r.hi - r.lo; });
  if (fit != spare_bounces_.end()) {
    r.bounce = std::move(*fit);
    spare_bounces_.erase(fit);
  } else {
    r.bounce = io::AlignedBuffer(r.hi - r.lo);
  }
  r.ticket = aio_->read(*param_file_, r.lo, r.hi - r.lo, r.bounce.data());  // whole blocks, inside the file
  counters_.param_async_reads++;
  param_reads_.push_back(std::move(r));
  return param_reads_.back().id;
}

void NvmeSwap::finish_read_params(std::uint64_t id) {
  auto it = std::find_if(param_reads_.begin(), param_reads_.end(), [&](const ParamRead& r) { return r.id == id; });
  if (it == param_reads_.end()) return;  // finished already (step, map, a write of its blocks)
  ParamRead r = std::move(*it);
  param_reads_.erase(it);
  struct Spare {  // the bounce buffer goes back to the spares, also when the read failed
    NvmeSwap& s;
    io::AlignedBuffer& b;
    ~Spare() { s.spare_bounces_.push_back(std::move(b)); }
  } spare{*this, r.bounce};
  aio_->wait(r.ticket);
  std::memcpy(r.dst, r.bounce.as<char>() + r.skip, r.bytes);
}

void NvmeSwap::finish_param_reads(std::size_t lo, std::size_t hi) {
  // Oldest first: a failure is thrown by the first read that had one, the rest stay open.
  for (std::size_t i = 0; i < param_reads_.size();) {
    if (param_reads_[i].lo < hi && lo < param_reads_[i].hi) finish_read_params(param_reads_[i].id);
    else ++i;
  }
}

void NvmeSwap::wait_param_writes(std::size_t lo, std::size_t hi) {
  for (std::size_t i = 0; i < param_writes_.size();) {
    const ParamWrite w = param_writes_[i];
    if (w.lo >= hi || lo >= w.hi) {
      ++i;
      continue;
    }
    // Forgotten before the wait: a failure is thrown once, by the first call that needs it.
    param_writes_.erase(param_writes_.begin() + std::ptrdiff_t(i));
    counters_.param_writes_waited++;
    aio_->wait(w.ticket);
  }
}

void NvmeSwap::issue_read(Slot& s, std::size_t i) {
  wait_writes(s);  // the buffers are free only once their last contents are on disk
  // Reads into them still open only after a step that threw half-way: their data is not
  // used (this read replaces it), so their failures are not either.
  for (io::Ticket t : s.reads) {
    try {
      aio_->wait(t);
    } catch (const std::exception&) {
    }
  }
  s.sub_group = i;
  s.reads.clear();
  const std::size_t bytes = round_up(count_of(i) * sizeof(float), io::kDirectAlign);
  for (std::size_t t = 0; t < files_.size(); ++t)
    s.reads.push_back(aio_->read(files_[t], i * sub_ * sizeof(float), bytes, s.bufs[t].data()));
}

void NvmeSwap::wait_writes(Slot& s) {
  // All of them, also after a failure (the buffers are free afterwards); the first failure
  // is thrown, once.
  std::exception_ptr failed;
  for (io::Ticket t : s.writes) {
    try {
      aio_->wait(t);
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  s.writes.clear();
  if (failed) std::rethrow_exception(failed);
}

void NvmeSwap::wait_step_writes() {
  std::exception_ptr failed;
  for (Slot& s : slots_) {
    try {
      wait_writes(s);
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
}

void NvmeSwap::step(optim::Optimizer& opt, TensorView grads, TensorView working, const optim::StepContext& ctx) {
  DS_CHECK(o_.optimizer, "NvmeSwap::step without offload_optimizer nvme");
  DS_CHECK(grads.count == n_ && (o_.params || working.count == n_), "NvmeSwap::step: views of the wrong size");
  if (o_.params) {  // the open reads get the values before the step, a load's writes land first
    finish_param_reads(0, SIZE_MAX);
    wait_param_writes(0, SIZE_MAX);
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::size_t moved = 0;  // bytes read and written (queued: the last writes finish after the return)
  const std::size_t groups = (n_ + sub_ - 1) / sub_, B = slots_.size();
  const std::size_t gs = dtype_size(grads.dtype), ws = dtype_size(wdtype_);
  // Reads run ahead by up to B - 1 sub-groups (B == 1: one at a time).
  const std::size_t ahead = std::max<std::size_t>(B - 1, 1);
  for (std::size_t i = 0; i < std::min(ahead, groups); ++i) issue_read(slots_[i % B], i);
  std::vector<float*> state(names_.size() - 1);
  for (std::size_t i = 0; i < groups; ++i) {
    Slot& s = slots_[i % B];
    if (s.sub_group != i) issue_read(s, i);  // B == 1
    for (io::Ticket t : s.reads) aio_->wait(t);
    s.reads.clear();
    if (i + ahead < groups && B > 1) issue_read(slots_[(i + ahead) % B], i + ahead);
    const std::size_t k = count_of(i), a = i * sub_;
    for (std::size_t t = 1; t < names_.size(); ++t) state[t - 1] = s.bufs[t].as<float>();
    const TensorView g{static_cast<char*>(grads.data) + a * gs, k, grads.dtype};
    TensorView w = o_.params ? TensorView{s.out.data(), k, wdtype_}
                             : TensorView{static_cast<char*>(working.data) + a * ws, k, wdtype_};
    opt.step_piece(std::span<float>(s.bufs[0].as<float>(), k), g, w, state, ctx);
    const std::size_t fbytes = round_up(k * sizeof(float), io::kDirectAlign);
    for (std::size_t t = 0; t < files_.size(); ++t)
      s.writes.push_back(aio_->write(files_[t], a * sizeof(float), fbytes, s.bufs[t].data()));
    moved += 2 * files_.size() * fbytes;
    if (o_.params) {
      const std::size_t pbytes = round_up(k * ws, io::kDirectAlign);
      std::memset(static_cast<char*>(s.out.data()) + k * ws, 0, pbytes - k * ws);  // no stale tail on disk
      const io::Ticket t = aio_->write(*param_file_, a * ws, pbytes, s.out.data());
      s.writes.push_back(t);
      param_writes_.push_back({a * ws, a * ws + pbytes, t});  // the fetcher's reads of these blocks wait for it
      moved += pbytes;
    }
  }
  // The writes of the last sub-groups stay in flight (behind the next forward and backward):
  // the next step's read into a slot waits for the slot's writes (sub-group i always goes
  // through slot i % B, so that is the write of the blocks it reads), write_master, map() and
  // the parameter file's readers wait for theirs, the destructor drains the queue.
  for (const Slot& s : slots_) counters_.step_writes_behind += s.writes.size();
  last_bytes_ = moved;
  last_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

StateViews NvmeSwap::map() {
  DS_CHECK(o_.optimizer, "NvmeSwap::map without offload_optimizer nvme");
  unmap(true);  // views left from a failed load: what was written goes to disk first
  finish_param_reads(0, SIZE_MAX);  // their pieces go where they were asked to
  param_writes_.clear();             // waited for (and their failure thrown) by wait_all,
  for (Slot& s : slots_) {            // like the step's writes behind
    s.writes.clear();
    s.reads.clear();
  }
  aio_->wait_all();
  counters_.maps++;
  StateViews v;
  for (std::size_t t = 0; t < files_.size(); ++t) {
    const std::size_t bytes = n_pad_ * sizeof(float);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, files_[t].fd(), 0);
    DS_CHECK(p != MAP_FAILED, files_[t].path() << ": cannot map the swap file for the checkpoint (" << std::strerror(errno) << ")");
    maps_.emplace_back(p, bytes);
    counters_.mapped_bytes += bytes;
    std::span<float> span(static_cast<float*>(p), n_);
    if (t == 0) v.master = span;
    else v.state.emplace_back(names_[t], span);
  }
  return v;
}

const float* NvmeSwap::mapped_master() const {
  return maps_.empty() ? nullptr : static_cast<const float*>(maps_.front().first);
}

void NvmeSwap::unmap(bool written) {
  for (std::size_t t = 0; t < maps_.size(); ++t) {
    auto [p, bytes] = maps_[t];
    // Written through the map: on disk before the next O_DIRECT read of the file, and the
    // page cache handed back (it would otherwise hold a copy of the whole state).
    if (written && msync(p, bytes, MS_SYNC) != 0)
      DS_THROW(files_[t].path() << ": cannot write the swap file back (" << std::strerror(errno) << ")");
    munmap(p, bytes);
    posix_fadvise(files_[t].fd(), 0, 0, POSIX_FADV_DONTNEED);
  }
  maps_.clear();
}

void NvmeSwap::add_memory(ModelStateBytes& b) const {
  for (const Slot& s : slots_) {
    for (const auto& buf : s.bufs) b.swap_buffers += buf.bytes();
    b.swap_buffers += s.out.bytes();
  }
  for (const auto& buf : param_ring_) b.swap_buffers += buf.bytes();
  for (const auto& buf : spare_bounces_) b.swap_buffers += buf.bytes();
  for (const auto& r : param_reads_) b.swap_buffers += r.bounce.bytes();
  for (const auto& f : files_) b.on_nvme += f.bytes();
  if (param_file_) b.on_nvme += param_file_->bytes();
}

}  // namespace ds::engine

#include "ds/nn/params.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ds/core/error.h"
#include "ds/core/half.h"

namespace ds::nn {

std::size_t ParamSet::add(std::string name, std::vector<std::int64_t> shape) {
  DS_CHECK(!bound_, "ParamSet::add(" << name << ") after bind()");
  ParamInfo p{std::move(name), std::move(shape)};
  offsets_.push_back(total_);
  direct_.push_back(0);
  total_ += p.numel();
  infos_.push_back(std::move(p));
  return infos_.size() - 1;
}

void ParamSet::bind(std::span<const TensorView> params, std::span<const TensorView> grads) {
  DS_CHECK(params.size() == infos_.size() && grads.size() == infos_.size(),
           "bind(): model has " << infos_.size() << " parameters, got " << params.size()
                                << " parameter views and " << grads.size() << " gradient views");
  const DType dt = params.empty() ? DType::F32 : params[0].dtype;
  DS_CHECK(dt == DType::F32 || dt == DType::F16 || dt == DType::BF16,
           "bind(): working dtype must be fp32, fp16 or bf16, got " << dtype_name(dt));
  for (std::size_t i = 0; i < infos_.size(); ++i) {
    const std::size_t n = infos_[i].numel();
    DS_CHECK(params[i].count == n && grads[i].count == n,
             "bind(): parameter '" << infos_[i].name << "' needs " << n << " elements, got "
                                   << params[i].count << " (param) and " << grads[i].count
                                   << " (grad)");
    DS_CHECK(params[i].dtype == dt && grads[i].dtype == dt,
             "bind(): parameter '" << infos_[i].name << "' has dtype "
                                   << dtype_name(params[i].dtype) << "/" << dtype_name(grads[i].dtype)
                                   << ", expected " << dtype_name(dt) << " for all");
    DS_CHECK(params[i].data && grads[i].data, "bind(): null view for '" << infos_[i].name << "'");
  }
  dtype_ = dt;
  params_.assign(params.begin(), params.end());
  grads_.assign(grads.begin(), grads.end());
  w_.assign(infos_.size(), nullptr);
  g_.assign(infos_.size(), nullptr);
  whole_bound_ = false;
  if (dt == DType::F32) {
    shadow_w_ = HostBuffer();
    shadow_g_ = HostBuffer();
    slots_.clear();
    for (std::size_t i = 0; i < infos_.size(); ++i) {
      w_[i] = params_[i].as<float>();
      g_[i] = grads_[i].as<float>();
    }
  }
  // Half dtypes: whole-model shadows at the first prepare_forward / prepare_backward; with
  // group hooks, a group's slot at its acquire (every group is released at a rebind).
  for (GroupState& s : groups_) {
    s.held = 0;
    s.slot = -1;
  }
  for (Slot& s : slots_) s.busy = false;
  std::fill(grad_state_.begin(), grad_state_.end(), kUnzeroed);
  bound_ = true;
}

void ParamSet::ensure_whole() {
  if (whole_bound_) return;
  if (shadow_w_.count() != total_) {
    shadow_w_ = HostBuffer(total_, DType::F32);
    shadow_g_ = HostBuffer(total_, DType::F32);
  }
  for (std::size_t i = 0; i < infos_.size(); ++i) {
    w_[i] = shadow_w_.as<float>() + offsets_[i];
    g_[i] = shadow_g_.as<float>() + offsets_[i];
  }
  whole_bound_ = true;
}

void ParamSet::prepare_forward(std::size_t first, std::size_t count) {
  DS_CHECK(bound_, "forward() before bind(): the engine must bind parameter storage first");
  if (dtype_ == DType::F32 || count == 0) return;
  if (outer_) {
    // The group's acquire converted it into its slot.
    for (std::size_t i = first; i < first + count; ++i)
      DS_CHECK(w_[i] != nullptr, "ParamSet::prepare_forward: parameter '"
                                     << infos_[i].name << "' is outside an acquired group's bracket");
    return;
  }
  ensure_whole();
  convert_range(first, count);
}

void ParamSet::convert_range(std::size_t first, std::size_t count) {
  // Parameters [first, first + count) in 64 Ki-element pieces, shared among the threads (a
  // GPT's ~3M parameters are ~20 MB of memory traffic per forward).
  constexpr std::size_t kPiece = std::size_t(1) << 16;
  const std::size_t lo_all = offsets_[first];
  const std::size_t hi_all = first + count < infos_.size() ? offsets_[first + count] : total_;
  const std::size_t span = hi_all - lo_all;
  const std::int64_t pieces = std::int64_t((span + kPiece - 1) / kPiece);
  const DType dt = dtype_;
#pragma omp parallel for schedule(static) if (span > 4 * kPiece)
  for (std::int64_t p = 0; p < pieces; ++p) {
    // Piece p covers [lo_all + p * kPiece, ...) of the concatenated parameters.
    const std::size_t begin = lo_all + std::size_t(p) * kPiece, end = std::min(hi_all, begin + kPiece);
    std::size_t i = std::size_t(std::upper_bound(offsets_.begin(), offsets_.end(), begin) - offsets_.begin()) - 1;
    for (std::size_t pos = begin; pos < end; ++i) {
      const std::size_t lo = pos - offsets_[i], n = std::min(params_[i].count - lo, end - pos);
      convert(static_cast<const char*>(params_[i].data) + lo * 2, dt, w_[i] + lo, DType::F32, n);
      pos += n;
    }
  }
}

void ParamSet::set_direct_grad(std::size_t i, bool on) { direct_.at(i) = on ? 1 : 0; }

void ParamSet::prepare_backward() {
  DS_CHECK(bound_, "backward() before bind(): the engine must bind parameter storage first");
  if (dtype_ == DType::F32) return;
  if (outer_) {
    std::fill(grad_state_.begin(), grad_state_.end(), kUnzeroed);
    for (std::size_t grp = 0; grp < groups_.size(); ++grp) {
      const GroupState& s = groups_[grp];
      if (s.held == 0) {
        drop_slot(grp);  // kept for a gradient of an earlier backward that never got folded
        continue;
      }
      for (std::size_t i = s.group.first; i < s.group.first + s.group.count; ++i)
        if (!direct_[i]) {
          std::memset(g_[i], 0, infos_[i].numel() * sizeof(float));
          grad_state_[i] = kOpen;
        }
    }
    return;
  }
  ensure_whole();
  // Zero the shadow ranges of the non-direct parameters, merging neighbours into one memset.
  float* g = shadow_g_.as<float>();
  std::size_t i = 0;
  while (i < infos_.size()) {
    if (direct_[i]) { ++i; continue; }
    const std::size_t begin = offsets_[i];
    while (i < infos_.size() && !direct_[i]) ++i;
    const std::size_t end = i < infos_.size() ? offsets_[i] : total_;
    std::memset(g + begin, 0, (end - begin) * sizeof(float));
  }
}

void ParamSet::finish_grad(std::size_t i, const std::function<void(std::size_t)>& ready) {
  fold_grad(i);
  if (ready) ready(i);
}

void ParamSet::fold_grad(std::size_t i) {
  if (dtype_ != DType::F32 && !direct_[i]) {
    // bound += shadow, in chunks through a small fp32 stack buffer.
    const std::size_t n = grads_[i].count;
    const float* src = g_[i];
    constexpr std::size_t kC = 2048;
    const std::int64_t chunks = std::int64_t((n + kC - 1) / kC);
    const DType dt = dtype_;
    void* base = grads_[i].data;
#pragma omp parallel for schedule(static) if (n > 32768)
    for (std::int64_t c = 0; c < chunks; ++c) {
      float tmp[kC];
      const std::size_t i0 = std::size_t(c) * kC, m = std::min(kC, n - i0);
      void* dst = static_cast<char*>(base) + i0 * 2;
      convert(dst, dt, tmp, DType::F32, m);
      for (std::size_t k = 0; k < m; ++k) tmp[k] += src[i0 + k];
      convert(tmp, DType::F32, dst, dt, m);
    }
  }
  if (outer_) grad_state_[i] = kFolded;  // (its slot may go back to the pool at the release)
}

GroupHooks* ParamSet::set_group_hooks(GroupHooks* hooks, const std::vector<ParamGroup>& groups) {
  bracket_.rebind(this);
  slots_.clear();
  groups_.clear();
  group_of_.clear();
  grad_state_.clear();
  whole_bound_ = false;
  if (bound_ && dtype_ != DType::F32) {
    std::fill(w_.begin(), w_.end(), nullptr);
    std::fill(g_.begin(), g_.end(), nullptr);
  }
  if (!hooks) {
    outer_ = nullptr;  // whole-model shadows again, at the next prepare_forward
    return nullptr;
  }
  std::size_t next = 0;
  for (const ParamGroup& grp : groups) {
    DS_CHECK(grp.first == next && grp.count > 0 && grp.first + grp.count <= infos_.size(),
             "set_group_hooks: group '" << grp.name << "' covers parameters [" << grp.first << ", "
                                        << grp.first + grp.count << "), expected a non-empty run from "
                                        << next << " of " << infos_.size());
    const std::size_t end = grp.first + grp.count;
    groups_.push_back({grp, (end < infos_.size() ? offsets_[end] : total_) - offsets_[grp.first], 0, -1});
    group_of_.insert(group_of_.end(), grp.count, groups_.size() - 1);
    next = end;
  }
  DS_CHECK(next == infos_.size(),
           "set_group_hooks: the groups cover " << next << " of " << infos_.size() << " parameters");
  grad_state_.assign(infos_.size(), kUnzeroed);
  shadow_w_ = HostBuffer();  // a rank under stage 3 never holds the whole model
  shadow_g_ = HostBuffer();
  outer_ = hooks;
  return &bracket_;
}

std::size_t ParamSet::shadow_bytes() const {
  std::size_t n = shadow_w_.bytes() + shadow_g_.bytes();
  for (const Slot& s : slots_) n += s.buf.bytes();
  return n;
}

std::size_t ParamSet::take_slot(std::size_t numel) {
  // The smallest free slot that fits; else the largest free one grows (or a new one): the
  // pool settles at one slot per group held at once, each as large as the groups it takes.
  std::size_t best = slots_.size(), largest = slots_.size();
  for (std::size_t k = 0; k < slots_.size(); ++k) {
    if (slots_[k].busy) continue;
    if (slots_[k].capacity >= numel && (best == slots_.size() || slots_[k].capacity < slots_[best].capacity)) best = k;
    if (largest == slots_.size() || slots_[k].capacity > slots_[largest].capacity) largest = k;
  }
  if (best == slots_.size()) {
    if (largest == slots_.size()) slots_.emplace_back();
    best = largest == slots_.size() ? slots_.size() - 1 : largest;
    Slot& s = slots_[best];
    s.buf = HostBuffer();  // the old one first: never both at once
    s.buf = HostBuffer(2 * numel, DType::F32);
    s.capacity = numel;
  }
  slots_[best].busy = true;
  return best;
}

void ParamSet::drop_slot(std::size_t group) {
  GroupState& s = groups_[group];
  if (s.slot < 0) return;
  slots_[std::size_t(s.slot)].busy = false;
  s.slot = -1;
  for (std::size_t i = s.group.first; i < s.group.first + s.group.count; ++i) w_[i] = g_[i] = nullptr;
}

void ParamSet::acquire_group(std::size_t group, Pass pass) {
  DS_CHECK(group < groups_.size(), "acquire of group " << group << " (the model has " << groups_.size() << ")");
  outer_->acquire(group, pass);
  if (dtype_ == DType::F32) return;
  GroupState& s = groups_[group];
  if (s.held++ > 0) return;  // nested: already converted (and zeroed, in backward)
  try {
    const std::size_t first = s.group.first, count = s.group.count;
    if (s.slot < 0) {
      s.slot = int(take_slot(s.numel));
      Slot& slot = slots_[std::size_t(s.slot)];
      float* base = slot.buf.as<float>();
      for (std::size_t i = first; i < first + count; ++i) {
        w_[i] = base + (offsets_[i] - offsets_[first]);
        g_[i] = w_[i] + slot.capacity;
      }
    }
    // Again when the slot was kept for an unfolded gradient: the engine gathered the group
    // anew (the same values).
    convert_range(first, count);
    if (pass == Pass::Backward)
      for (std::size_t i = first; i < first + count; ++i)
        if (!direct_[i] && grad_state_[i] == kUnzeroed) {
          std::memset(g_[i], 0, infos_[i].numel() * sizeof(float));
          grad_state_[i] = kOpen;
        }
  } catch (...) {
    release_group(group, pass);
    throw;
  }
}

void ParamSet::release_group(std::size_t group, Pass pass) noexcept {
  if (group < groups_.size() && dtype_ != DType::F32) {
    GroupState& s = groups_[group];
    if (s.held > 0 && --s.held == 0) {
      bool open = false;  // a gradient still to be folded keeps the slot (see the header)
      for (std::size_t i = s.group.first; i < s.group.first + s.group.count; ++i) open = open || grad_state_[i] == kOpen;
      if (!open) drop_slot(group);
    }
  }
  outer_->release(group, pass);
}

namespace {
std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// Uniform in (0, 1).
double unit(std::uint64_t& s) { return (double(splitmix64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
}  // namespace

void init_normal(std::span<float> out, float stddev, std::uint64_t seed, std::uint64_t stream) {
  std::uint64_t s = seed * 0x2545F4914F6CDD1Dull + stream * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t i = 0; i < out.size(); i += 2) {
    const double u1 = unit(s), u2 = unit(s);
    const double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = float(stddev * r * std::cos(2.0 * M_PI * u2));
    if (i + 1 < out.size()) out[i + 1] = float(stddev * r * std::sin(2.0 * M_PI * u2));
  }
}

void init_uniform(std::span<float> out, float bound, std::uint64_t seed, std::uint64_t stream) {
  std::uint64_t s = seed * 0x2545F4914F6CDD1Dull + stream * 0x9E3779B97F4A7C15ull + 1;
  for (float& v : out) v = float((2.0 * unit(s) - 1.0) * bound);
}

void init_constant(std::span<float> out, float value) { std::fill(out.begin(), out.end(), value); }

}  // namespace ds::nn

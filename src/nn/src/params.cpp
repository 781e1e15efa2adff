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
  w_.resize(infos_.size());
  g_.resize(infos_.size());
  if (dt == DType::F32) {
    shadow_w_ = HostBuffer();
    shadow_g_ = HostBuffer();
    for (std::size_t i = 0; i < infos_.size(); ++i) {
      w_[i] = params_[i].as<float>();
      g_[i] = grads_[i].as<float>();
    }
  } else {
    if (shadow_w_.count() != total_) {
      shadow_w_ = HostBuffer(total_, DType::F32);
      shadow_g_ = HostBuffer(total_, DType::F32);
    }
    for (std::size_t i = 0; i < infos_.size(); ++i) {
      w_[i] = shadow_w_.as<float>() + offsets_[i];
      g_[i] = shadow_g_.as<float>() + offsets_[i];
    }
  }
  bound_ = true;
}

void ParamSet::prepare_forward(std::size_t first, std::size_t count) {
  DS_CHECK(bound_, "forward() before bind(): the engine must bind parameter storage first");
  if (dtype_ == DType::F32 || count == 0) return;
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
  if (dtype_ == DType::F32) return;
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

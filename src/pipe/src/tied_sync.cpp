// TiedSync (tied_sync.h): the tied weights' gradient and value exchange between stages.
#include "tied_sync.h"

#include <algorithm>
#include <cstring>

#include "ds/core/error.h"
#include "ds/core/half.h"

namespace ds::pipe {

namespace {

constexpr int kTagTiedGrad = 16;    // + the tie's position
constexpr int kTagTiedValues = 64;  // + the tie's position

int stage_of_layer(const StageBounds& bounds, std::size_t layer) {
  for (std::size_t s = 0; s + 1 < bounds.size(); ++s)
    if (int(layer) >= bounds[s] && int(layer) < bounds[s + 1]) return int(s);
  DS_THROW("pipeline: layer " << layer << " is in no stage");
}

// dst += src, n elements of the working dtype (halves through fp32).
void add_into(void* dst, const void* src, std::size_t n, DType dtype) {
  if (dtype == DType::F32) {
    float* d = static_cast<float*>(dst);
    const float* s = static_cast<const float*>(src);
    for (std::size_t i = 0; i < n; ++i) d[i] += s[i];
    return;
  }
  constexpr std::size_t kPiece = 4096;
  float a[kPiece], b[kPiece];
  for (std::size_t off = 0; off < n; off += kPiece) {
    const std::size_t m = std::min(kPiece, n - off);
    char* dp = static_cast<char*>(dst) + off * 2;
    convert(dp, dtype, a, DType::F32, m);
    convert(static_cast<const char*>(src) + off * 2, dtype, b, DType::F32, m);
    for (std::size_t i = 0; i < m; ++i) a[i] += b[i];
    convert(a, DType::F32, dp, dtype, m);
  }
}

}  // namespace

TiedSync::TiedSync(const std::vector<TiedWeight>& tied, const StageBounds& bounds, int stage, StageModule& module,
                   PeerLink& link)
    : stage_(stage), module_(module), link_(link) {
  for (std::size_t k = 0; k < tied.size(); ++k) {
    Tie t;
    t.model_index = tied[k].parameter;
    t.owner = stage_of_layer(bounds, tied[k].layers.front());
    for (std::size_t l : tied[k].layers) {
      const int s = stage_of_layer(bounds, l);
      if (s != t.owner && std::find(t.users.begin(), t.users.end(), s) == t.users.end()) t.users.push_back(s);
    }
    t.tag_offset = int(k);
    if (!t.users.empty()) ties_.push_back(t);
  }
  outgoing_.resize(ties_.size());
  sends_.resize(ties_.size());
}

void TiedSync::receive_gradients(std::size_t model_index) {
  for (const Tie& t : ties_) {
    if (t.model_index != model_index || t.owner != stage_) continue;
    const TensorView g = module_.bound_grad(model_index);
    incoming_.resize(g.bytes());
    for (int user : t.users) {
      link_.recv(incoming_.data(), incoming_.size(), user, kTagTiedGrad + t.tag_offset);
      add_into(g.data, incoming_.data(), g.count, g.dtype);
    }
  }
}

void TiedSync::send_gradients() {
  for (std::size_t k = 0; k < ties_.size(); ++k) {
    const Tie& t = ties_[k];
    if (std::find(t.users.begin(), t.users.end(), stage_) == t.users.end()) continue;
    const TensorView g = module_.foreign_grad(t.model_index);
    sends_[k].wait();  // the previous micro-batch's send still reads outgoing_[k]
    outgoing_[k].assign(static_cast<const char*>(g.data), static_cast<const char*>(g.data) + g.bytes());
    std::memset(g.data, 0, g.bytes());
    sends_[k] = link_.isend(outgoing_[k].data(), outgoing_[k].size(), t.owner, kTagTiedGrad + t.tag_offset);
  }
}

void TiedSync::finish_sends() {
  for (P2PRequest& r : sends_) r.wait();
}

void TiedSync::sync_values() {
  for (const Tie& t : ties_) {
    if (t.owner == stage_) {
      // ZeRO-3: the weight's group gathered while it is sent. The engine's next step rewrites
      // the values, so the sends finish here (the users receive at the same point).
      const auto use = module_.use_group_of(t.model_index, Pass::Forward);
      const TensorView v = module_.bound_param(t.model_index);
      std::vector<P2PRequest> sends;
      for (int user : t.users) sends.push_back(link_.isend(v.data, v.bytes(), user, kTagTiedValues + t.tag_offset));
      for (P2PRequest& r : sends) r.wait();
    } else if (std::find(t.users.begin(), t.users.end(), stage_) != t.users.end()) {
      const TensorView v = module_.foreign_param(t.model_index);
      link_.recv(v.data, v.bytes(), t.owner, kTagTiedValues + t.tag_offset);
    }
  }
}

}  // namespace ds::pipe

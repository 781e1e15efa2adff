#include "ds/engine/memory.h"

#include <cstdio>

#include "ds/core/error.h"

namespace ds::engine {

namespace {
std::string mib(std::size_t b) {
  char buf[64];
  if (b < (1u << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f MiB", double(b) / (1024.0 * 1024.0));
  }
  return buf;
}
}  // namespace

std::string ModelStateBytes::to_string() const {
  return "params " + mib(params) + ", grads " + mib(grads) + ", master " + mib(master) +
         ", optimizer " + mib(optimizer_state) +
         ", comm scratch " + mib(comm_scratch) + ", total " + mib(total());
}

std::size_t optimizer_state_bytes_per_param(const std::string& t, bool sgd_momentum) {
  if (t == "adam" || t == "adamw" || t == "lamb") return 8;
  if (t == "adagrad") return 4;
  if (t == "sgd") return sgd_momentum ? 4 : 0;
  DS_THROW("unknown optimizer type '" << t << "' (expected adam, adamw, lamb, sgd or adagrad)");
}

ModelStateBytes estimate_model_states_bytes(std::size_t p, int n, int stage, DType working,
                                            std::size_t k) {
  DS_CHECK(n >= 1, "world size must be >= 1, got " << n);
  DS_CHECK(stage >= 0 && stage <= 2, "ZeRO stage " << stage << " is not supported (0, 1 or 2)");
  const double w = double(dtype_size(working));
  const double P = double(p), N = double(n);
  ModelStateBytes b;
  b.params = std::size_t(w * P);
  b.grads = std::size_t(stage == 2 ? w * P / N : w * P);
  b.master = std::size_t(stage >= 1 ? 4.0 * P / N : 4.0 * P);
  b.optimizer_state = std::size_t(stage >= 1 ? double(k) * P / N : double(k) * P);
  return b;
}

}  // namespace ds::engine

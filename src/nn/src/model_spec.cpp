#include "ds/nn/model_spec.h"

#include <iomanip>
#include <sstream>

namespace ds::nn {

std::string ModelSpec::describe() const {
  std::ostringstream os;
  if (type.starts_with("torchscript:")) {  // the train app's --model torchscript:PATH
    os << type << " block_size=" << block_size << " vocab_size=" << vocab_size;
  } else if (type == "gpt") {
    os << "gpt n_layer=" << n_layer << " n_head=" << n_head << " n_embd=" << n_embd
       << " block_size=" << block_size << " vocab_size=" << vocab_size;
  } else if (type == "llama") {
    os << "llama n_layer=" << n_layer << " n_head=" << n_head << " n_kv_head=" << n_kv_head << " n_embd=" << n_embd
       << " intermediate_size=" << intermediate_size << " block_size=" << block_size
       << " vocab_size=" << vocab_size << std::setprecision(10);
    if (rope_theta != ModelSpec{}.rope_theta) os << " rope_theta=" << rope_theta;
    if (rms_norm_eps != ModelSpec{}.rms_norm_eps) os << " rms_norm_eps=" << rms_norm_eps;
    if (tie_embeddings) os << " tie_embeddings=true";
  } else if (in_features > 0) {
    os << "mlp n_layer=" << n_layer << " n_embd=" << n_embd << " in_features=" << in_features
       << " vocab_size=" << vocab_size;
  } else {
    os << "mlp n_layer=" << n_layer << " n_embd=" << n_embd << " block_size=" << block_size
       << " vocab_size=" << vocab_size;
  }
  return os.str();
}

}  // namespace ds::nn

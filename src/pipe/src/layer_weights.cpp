// The partition input of a layer-sequence model (ds/pipe/layer_weights.h).
#include "ds/pipe/layer_weights.h"

#include "ds/core/error.h"

namespace ds::pipe {

std::vector<LayerInfo> layer_infos(const LayerSequence& model, const std::vector<ParamInfo>& params) {
  const std::vector<LayerSpec> layers = model.layers();
  std::vector<LayerInfo> out;
  for (const LayerSpec& l : layers) {
    DS_CHECK(l.first + l.count <= params.size(), "layer_infos: layer '" << l.name << "' holds parameters "
                                                     << l.first << " .. " << l.first + l.count << " of "
                                                     << params.size());
    std::int64_t count = 0;
    for (std::size_t i = l.first; i < l.first + l.count; ++i) count += std::int64_t(params[i].numel());
    out.push_back({l.name, count});
  }
  for (const TiedWeight& t : model.tied_weights()) {
    DS_CHECK(t.parameter < params.size(),
             "layer_infos: tied weight '" << t.name << "' is parameter " << t.parameter << " of " << params.size());
    for (std::size_t l : t.layers) {
      DS_CHECK(l < out.size(), "layer_infos: tied weight '" << t.name << "' used by layer " << l << " of "
                                                             << out.size());
      if (l != t.layers.front()) out[l].parameters += std::int64_t(params[t.parameter].numel());  // the owner has it
    }
  }
  return out;
}

}  // namespace ds::pipe

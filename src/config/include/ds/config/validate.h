// The rules that span keys of ds_config.json (docs/user/config.md "Rules across keys"), in
// one place: the parser runs them once a document is read, and the engine runs them on the
// config it is given (which may have been built or changed in code, never parsed).
#pragma once

#include <optional>

#include "ds/config/ds_config.h"

namespace ds::config {

// Throws ds::Error on the first rule broken, "<source>: <message>" (the parser's own call
// reports "<file>:<line>:<column>: <key>: <message>" instead, as every parse error).
// world_size: given when the config is about to be trained with (the engine, after
// resolve_batch_sizes, with the data-parallel world size). Then the batch sizes must be
// resolved and fit it, and the limits of dstrain's engine apply too (an optimizer's ZeRO
// stages, e.g. Lamb only without ZeRO). Without it (the parser, `ds_config check`) the
// config is checked as a DeepSpeed config: those two are left to the training call.
void validate(const DsConfig& cfg, std::optional<int> world_size = std::nullopt);

}  // namespace ds::config

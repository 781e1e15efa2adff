// The parser's key tables as data (internal to ds_config and its tests).
#pragma once

#include <string>
#include <vector>

namespace ds::config {

// Every key path the parser accepts, sorted: section keys ("fp16.loss_scale"), the keys of
// every optimizer's and scheduler's params ("optimizer.params.betas"), the top-level keys,
// and the DeepSpeed keys accepted with no effect or only at their default. The docs check
// (tests/config/test_docs_keys.cpp) holds docs/user/config.md to it.
std::vector<std::string> config_keys();

}  // namespace ds::config

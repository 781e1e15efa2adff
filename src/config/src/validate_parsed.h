// The parser's entry to validate(): the same rules, with the positions the keys were
// written at, so that a broken rule reads "file:line:col: key: message" like every other
// parse error.
#pragma once

#include <map>
#include <string>

#include "ds/config/ds_config.h"
#include "ds/core/json.h"

namespace ds::config::detail {

using KeyPositions = std::map<std::string, SourcePos>;  // key path ("fp16.enabled") -> where

void validate_parsed(const DsConfig& cfg, const KeyPositions& positions);

}  // namespace ds::config::detail

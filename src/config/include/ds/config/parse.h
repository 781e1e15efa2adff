// Reading ds_config.json: DeepSpeed's format, with clear errors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ds/config/ds_config.h"

namespace ds::config {

// The largest config accepted (file or text). Real configs are a few KiB; parsing costs many
// times the size on every rank, so a runaway file fails at once, naming it and its size.
inline constexpr std::size_t kMaxConfigBytes = std::size_t(4) << 20;  // 4 MiB

// Unknown top-level keys warned about one by one; the rest are counted in one last warning.
inline constexpr std::size_t kMaxUnknownKeyWarnings = 20;

// Parses a config file (hjson-style // and /* */ comments allowed). Errors (ds::Error) name
// the file with line:column for syntax errors and duplicate keys, and the key path and the
// expected type for wrong values. Unknown keys inside a section are errors; unknown top-level
// keys are warnings with the closest known key ("did you mean gradient_clipping?"), collected
// into `warnings` (and logged) rather than thrown: the first kMaxUnknownKeyWarnings, then one
// "... and N more unknown top-level keys". The file must be a regular file of at most
// kMaxConfigBytes (a FIFO, directory or device is refused as what it is).
DsConfig load_config_file(const std::string& path, std::vector<std::string>* warnings = nullptr);
// Same, from JSON text; `source` names it in messages.
DsConfig parse_config_text(const std::string& text, const std::string& source = "<json string>",
                           std::vector<std::string>* warnings = nullptr);
// Same, from an already-parsed document (no line numbers available).
DsConfig parse_config_json(const nlohmann::json& doc, const std::string& source = "<json object>",
                           std::vector<std::string>* warnings = nullptr);
// DeepSpeed's initialize() also accepts a path or a JSON string in one argument.
DsConfig load_config(const std::string& path_or_json, std::vector<std::string>* warnings = nullptr);

// DeepSpeed's batch-size rules for a data-parallel world size (runtime/config.py), filling the
// missing one of train_batch_size / micro batch / gradient_accumulation_steps. The error
// shows all four numbers and says which to change.
void resolve_batch_sizes(DsConfig& cfg, int dp_world_size);

// What a job knows that can fill the Hugging Face Trainer's "auto" placeholders.
struct KnownValues {
  std::optional<std::int64_t> total_steps;  // the run's optimizer steps, when given
  std::optional<double> lr;                 // a learning rate given on the command line
  std::string steps_flag = "--steps";       // how the user gives each, for the messages
  std::string lr_flag = "--lr";
};

// Resolves every "auto" the parser met (cfg.auto_values), after resolve_batch_sizes(): batch
// keys take the batch arithmetic's values (all of them "auto" is an error there);
// optimizer.params.lr takes known.lr and scheduler.params.total_num_steps known.total_steps,
// else they are errors; fp16/bf16 "enabled" is always an error (a precision is never chosen
// silently); any other key keeps dstrain's default (DeepSpeed's). Returns one line per key,
// "file:line:col: key: \"auto\" -> value (where it came from)", for the caller to print;
// throws ds::Error naming the key, where it was written and what to write instead.
std::vector<std::string> fill_auto_values(DsConfig& cfg, const KnownValues& known);

// The fully resolved config, every default filled in, as JSON (ds_config check prints it).
nlohmann::json to_json(const DsConfig& cfg);

}  // namespace ds::config

// Environment propagation: default export prefixes and .deepspeed_env files
// (DeepSpeed's launcher/runner.py; docs/user/launching.md "Environment").
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ds::launch {

using EnvList = std::vector<std::pair<std::string, std::string>>;

// Parses NAME=VALUE lines. Blank lines and lines whose first non-blank character is '#'
// are skipped; the key is trimmed and must be a shell identifier; the value is every byte
// after the first '=' up to the end of the line (a trailing '\r' is dropped), so spaces,
// quotes and '$' survive unchanged. Errors name "<source>:<line>".
EnvList parse_env_file(std::string_view text, const std::string& source);

// Variables of `environ` whose names start with NCCL, PYTHON, UCX, MV2, MLFLOW or are in
// DeepSpeed's AzureML/Nebula list, in environment order.
EnvList default_exports(const EnvList& environ);

// The env files DeepSpeed reads, in order: <home>/<name> then <cwd>/<name>, where name is
// $DS_ENV_FILE or ".deepspeed_env" (an absolute DS_ENV_FILE is read once).
std::vector<std::string> env_file_paths(const EnvList& environ, const std::string& cwd);

// Whether $DS_ENV_FILE names a file (set and not empty): then the user expects it to be read.
bool env_file_named(const EnvList& environ);

// Reads the files that exist among `paths`, in order (later entries win). Throws on a read
// or parse error. named (env_file_named): none of `paths` existing is an error naming them,
// and each file found that sets no variable (empty, or only blank and comment lines) adds a
// line to `warnings`. Not named, both places are optional and nothing is said.
EnvList read_env_files(const std::vector<std::string>& paths, bool named = false,
                       std::vector<std::string>* warnings = nullptr);

// Sets key=value in list, replacing an existing key in place (later wins).
void env_set(EnvList& list, const std::string& key, const std::string& value);
const std::string* env_get(const EnvList& list, std::string_view key);

}  // namespace ds::launch

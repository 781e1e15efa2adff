// Environment propagation (DeepSpeed's launcher/runner.py, docs/user/launching.md "Environment").
#include "ds/launch/env_file.h"

#include "ds/core/error.h"
#include "ds/core/file_read.h"
#include "ds/core/text_lines.h"

namespace ds::launch {
namespace {

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

bool valid_key(std::string_view k) {
  if (k.empty()) return false;
  if (!((k[0] >= 'A' && k[0] <= 'Z') || (k[0] >= 'a' && k[0] <= 'z') || k[0] == '_')) return false;
  for (char c : k) {
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}

// DeepSpeed's export prefixes and its AzureML / Nebula names (launcher/runner.py EXPORT_ENVS).
constexpr std::string_view kPrefixes[] = {"NCCL", "PYTHON", "UCX", "MV2", "MLFLOW"};
constexpr std::string_view kNames[] = {
    "DLTS_JOB_ID", "DLTS_NUM_WORKER", "NEBULA_PERSISTENT_STORAGE_PATH",
    "NEBULA_PERSISTENT_TIME_INTERVAL", "AML_RUN_ID", "AZUREML_RUN_TOKEN",
    "AZUREML_WORKSPACE_SCOPE", "AZUREML_EXPERIMENT_SCOPE", "AZUREML_RUN_HISTORY_SERVICE_ENDPOINT",
    "AZUREML_RUN_ID", "NEBULA_MEMORY_BUFFER_SIZE", "AZUREML_PARAMETER_ITPJOB_NAME",
    "FC_TASKROLE_NAME", "FC_TASK_INDEX", "MASTER_HOST", "LOCAL_HOST", "AZUREML_BLOB_ACCOUNT_NAME",
    "AZUREML_BLOB_ACCOUNT_KEY"};

}  // namespace

EnvList parse_env_file(std::string_view text, const std::string& source) {
  EnvList out;
  TextLines lines(text, source);
  while (lines.next()) {
    const std::string_view line = lines.line();
    std::size_t first = 0;
    while (first < line.size() && is_blank(line[first])) ++first;
    if (first == line.size() || line[first] == '#') continue;
    const std::string where = lines.where();
    DS_CHECK(line.find('\0') == std::string_view::npos, where << "NUL byte in line");
    std::size_t eq = line.find('=');
    DS_CHECK(eq != std::string_view::npos,
             where << "malformed line (expected NAME=VALUE): '" << line << "'");
    std::string_view key = line.substr(first, eq - first);
    while (!key.empty() && is_blank(key.back())) key.remove_suffix(1);
    DS_CHECK(valid_key(key), where << "bad variable name '" << key
                                   << "' (letters, digits and '_', not starting with a digit)");
    env_set(out, std::string(key), std::string(line.substr(eq + 1)));
  }
  return out;
}

EnvList default_exports(const EnvList& environ) {
  EnvList out;
  for (const auto& [k, v] : environ) {
    bool pick = false;
    for (auto p : kPrefixes)
      if (std::string_view(k).starts_with(p)) pick = true;
    for (auto n : kNames)
      if (k == n) pick = true;
    if (pick) env_set(out, k, v);
  }
  // AISC_JOB_NAME: nodes set these two individually (DeepSpeed).
  if (env_get(environ, "AISC_JOB_NAME") != nullptr) {
    std::erase_if(out, [](const auto& kv) { return kv.first == "NCCL_IB_HCA" || kv.first == "UCX_NET_DEVICES"; });
  }
  return out;
}

std::vector<std::string> env_file_paths(const EnvList& environ, const std::string& cwd) {
  const std::string* custom = env_get(environ, "DS_ENV_FILE");
  std::string name = (custom != nullptr && !custom->empty()) ? *custom : ".deepspeed_env";
  if (name.front() == '/') return {name};
  std::vector<std::string> out;
  const std::string* home = env_get(environ, "HOME");
  if (home != nullptr && !home->empty()) out.push_back(*home + "/" + name);
  std::string local = cwd + "/" + name;
  if (out.empty() || out.front() != local) out.push_back(local);
  return out;
}

bool env_file_named(const EnvList& environ) {
  const std::string* custom = env_get(environ, "DS_ENV_FILE");
  return custom != nullptr && !custom->empty();
}

EnvList read_env_files(const std::vector<std::string>& paths, bool named, std::vector<std::string>* warnings) {
  EnvList out;
  bool found = false;
  for (const auto& p : paths) {
    // Missing is fine (both places are optional); a FIFO, device or directory is an error, not
    // a hang or an unbounded read, and the file is capped like every control file.
    if (!check_regular_file(p, "environment file", /*missing_ok=*/true)) continue;
    found = true;
    const std::string text = read_regular_file(p, "environment file");
    const EnvList vars = parse_env_file(text, p);
    if (named && vars.empty() && warnings != nullptr)
      warnings->push_back("DS_ENV_FILE: environment file " + p + " sets no variable (" +
                          (text.empty() ? "it is empty" : "only blank and comment lines") + "): nothing is exported from it");
    for (const auto& [k, v] : vars) env_set(out, k, v);
  }
  if (named && !found) {
    std::string where;
    for (const auto& p : paths) where += (where.empty() ? "" : " or ") + p;
    DS_THROW("DS_ENV_FILE: environment file " << where << " does not exist (unset DS_ENV_FILE to read the "
                                                "optional .deepspeed_env instead)");
  }
  return out;
}

void env_set(EnvList& list, const std::string& key, const std::string& value) {
  for (auto& [k, v] : list) {
    if (k == key) {
      v = value;
      return;
    }
  }
  list.emplace_back(key, value);
}

const std::string* env_get(const EnvList& list, std::string_view key) {
  for (const auto& [k, v] : list)
    if (k == key) return &v;
  return nullptr;
}

}  // namespace ds::launch

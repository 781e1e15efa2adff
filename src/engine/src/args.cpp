#include "ds/engine/args.h"

#include <string_view>

#include <CLI/CLI.hpp>

#include "ds/core/error.h"
#include "ds/mpi/discovery.h"

namespace ds::engine {

void add_deepspeed_args(CLI::App& app, DeepSpeedArgs& out) {
  app.add_flag("--deepspeed,--deepscale", out.deepspeed, "Enable the DeepSpeed engine (flag for user code)");
  app.add_option("--deepspeed_config,--deepscale_config", out.deepspeed_config,
                 "DeepSpeed json configuration file");
  app.add_option("--local_rank", out.local_rank, "Local rank passed by launchers");
}

namespace {
int parse_int(const std::string& flag, const std::string& v) {
  try {
    std::size_t pos = 0;
    int x = std::stoi(v, &pos);
    if (pos == v.size()) return x;
  } catch (const std::exception&) {
  }
  DS_THROW(flag << " expects an integer, got '" << v << "'");
}
}  // namespace

DeepSpeedArgs parse_deepspeed_args(int argc, const char* const* argv, std::vector<std::string>* rest) {
  DeepSpeedArgs a;
  if (rest) rest->clear();
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    std::string name = arg, value;
    bool has_inline = false;
    if (auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_inline = true;
    }
    auto take_value = [&]() -> std::string {
      if (has_inline) return value;
      DS_CHECK(i + 1 < argc, name << " expects a value");
      return argv[++i];
    };
    if (i > 0 && (name == "--deepspeed" || name == "--deepscale") && !has_inline) {
      a.deepspeed = true;
    } else if (i > 0 && (name == "--deepspeed_config" || name == "--deepscale_config")) {
      a.deepspeed_config = take_value();
      DS_CHECK(!a.deepspeed_config.empty(), name << " expects a file name");
    } else if (i > 0 && name == "--local_rank") {
      a.local_rank = parse_int(name, take_value());
    } else if (rest) {
      rest->push_back(arg);
    }
  }
  return a;
}

int resolve_local_rank(const DeepSpeedArgs& args) {
  if (const std::optional<int> env = launcher_local_rank()) {
    const int e = *env;
    DS_CHECK(args.local_rank < 0 || args.local_rank == e,
             "--local_rank " << args.local_rank << " disagrees with the environment's local rank " << e);
    return e;
  }
  return args.local_rank < 0 ? 0 : args.local_rank;
}

}  // namespace ds::engine

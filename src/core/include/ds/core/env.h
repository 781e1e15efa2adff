// The one registry of dstrain's environment variables.
//
// Every DS_* variable the product reads is a row of one table (src/core/src/env_table.cpp):
// name, type, default, class and a line of help. `ds_report --env` prints the table with the
// current values and docs/user/environment.md is checked against it by a test. Code reads a
// variable only through the typed getters below; parsing is strict, so a value that does not
// parse ("DS_COMM_TIMEOUT=10x") is a ds::Error naming the variable and the accepted form,
// never a silent default.
//
// Knobs a user tunes for a run belong in ds_config.json, not here: the table holds what must
// be known before a config is read (logging), what a launcher passes to every rank, and
// debug switches (class Debug) that force a plain code path for a test or a bug report.
//
// Variables that other programs set for us (MPI launchers, Slurm, OpenMP) are not knobs and
// are not in the table; read them with external().
//
// Threading: the getters read the process environment on every call (no cache); call them
// before threads that may setenv() start, as with std::getenv.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace ds::env {

enum class Type {
  Bool,     // 0/1 (also true/false, yes/no, on/off)
  Int,      // a decimal integer within [min, max]
  Size,     // bytes: N, NK, NM or NG (powers of 1024)
  Seconds,  // a non-negative decimal number of seconds
  String,   // free text (a path, a program)
  Choice,   // one of `choices` ("a|b|c")
};

enum class Class {
  System,  // a user may set it for a run (logging, launcher, timeouts)
  Debug,   // forces a plain or alternative code path for tests and bug reports
};

struct Var {
  const char* name;
  Type type;
  const char* default_value;  // as text in the variable's own syntax; "" = unset / none
  Class cls;
  const char* help;           // one line: what it does
  const char* choices = nullptr;  // Type::Choice: "a|b|c"
  long long min = 0;              // Type::Int bounds (inclusive)
  long long max = 0;
};

// The whole table, in documentation order.
std::span<const Var> table();

// Names for `ds_report --env` and docs/user/environment.md: "system" / "debug"; "bool",
// "int", "size", "seconds", "string", "choice".
const char* class_name(Class c);
const char* type_name(Type t);
// The accepted values in words: "0 or 1", "1 to 64", "one of debug|info|warn|error", ...
std::string accepted(const Var& v);

// The row for `name`; throws ds::Error for a name that is not in the table (a programming
// error: every read must be registered).
const Var& find(std::string_view name);

// True when the variable is set to a non-empty value.
bool is_set(std::string_view name);

// The raw value when set and non-empty.
std::optional<std::string> raw(std::string_view name);

// Typed values: the variable when set, else the table's default. Each checks that `name` has
// the matching type. Errors: "environment variable DS_X='v': <what is accepted>".
bool get_bool(std::string_view name);
long long get_int(std::string_view name);
std::size_t get_size(std::string_view name);
double get_seconds(std::string_view name);
std::string get_string(std::string_view name);  // Type::String or Type::Choice (validated)

// Parses every registered variable that is set, throwing the first error. Apps call it first
// thing in main, so a bad value stops the job before any work instead of at first use.
void check_all();

// A variable another program sets (OMPI_COMM_WORLD_SIZE, SLURM_LOCALID, OMP_NUM_THREADS ...):
// the value when set, std::nullopt otherwise. Throws for a DS_* name (those go in the table).
std::optional<std::string> external(const char* name);

// Parsers shared with the config reader and tests; `what` names the source in errors.
bool parse_bool(std::string_view text, std::string_view what);
std::size_t parse_size(std::string_view text, std::string_view what);

}  // namespace ds::env

// The one error type of dstrain, and the macros that raise it with context.
//
// Every failure that reaches a user (a bad config key, an MPI error, a corrupt checkpoint)
// travels as ds::Error up to the app, which prints what() on one line and exits non-zero.
// Library-specific check macros (DS_MPI_CHECK, DS_H5_CHECK, DS_CUDA_CHECK, DS_NCCL_CHECK)
// live beside the code that links those libraries and all throw ds::Error.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ds {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what), message_(what) {}
  // what() is "message [location]"; location is the source file:line (and rank) of the throw.
  Error(const std::string& message, const std::string& location);
  // The message alone, as the one-process tools print it (a user has no use for our file:line).
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

// What a tool prints for an exception: ds::Error's message() without its location, else what().
inline std::string user_message(const std::exception& e) {
  if (const auto* de = dynamic_cast<const Error*>(&e)) return de->message();
  return e.what();
}

// The rank shown in error and log messages; -1 until the distributed runtime sets it.
int process_rank();
void set_process_rank(int rank);

// Builds "file:line [rank r]: message" and throws ds::Error.
[[noreturn]] void throw_error(const std::string& message, const char* file, int line);

}  // namespace ds

// DS_THROW("bad value " << v): stream-style message, throws ds::Error with file, line, rank.
#define DS_THROW(msg_stream)                                   \
  do {                                                         \
    std::ostringstream ds_throw_os_;                           \
    ds_throw_os_ << msg_stream;                                \
    ::ds::throw_error(ds_throw_os_.str(), __FILE__, __LINE__); \
  } while (0)

// DS_CHECK(cond, "message" << detail): for input validation and invariants (never assert).
#define DS_CHECK(cond, msg_stream)                 \
  do {                                             \
    if (!(cond)) DS_THROW(msg_stream);             \
  } while (0)

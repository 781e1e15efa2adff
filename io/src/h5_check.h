// DS_H5_CHECK: the one check macro of ds_io (private: HDF5 is a private dependency).
#pragma once

#include <hdf5.h>

#include <sstream>
#include <string>

#include "ds/core/error.h"

namespace ds::io::detail {

// Turns off HDF5's automatic error printing for the calling thread (the thread-safe HDF5
// keeps that setting per thread).
void silence_hdf5_errors();

// The current HDF5 error stack, condensed to one line ("H5Dopen2: unable to open dataset:
// object 'x' doesn't exist"), then cleared.
std::string hdf5_error_summary();

[[noreturn]] void throw_h5_error(const char* call, const std::string& context, const char* file, int line);

}  // namespace ds::io::detail

// DS_H5_CHECK(H5Dwrite(...), path << " dataset " << name): a negative return throws ds::Error
// "HDF5 call H5Dwrite(...) failed on <context>: <HDF5 reason>" with file, line and rank.
#define DS_H5_CHECK(call, context_stream)                                                      \
  ([&]() {                                                                                     \
    auto ds_h5_rc_ = (call);                                                                   \
    if (ds_h5_rc_ < 0) {                                                                       \
      std::ostringstream ds_h5_os_;                                                            \
      ds_h5_os_ << context_stream;                                                             \
      ::ds::io::detail::throw_h5_error(#call, ds_h5_os_.str(), __FILE__, __LINE__);            \
    }                                                                                          \
    return ds_h5_rc_;                                                                          \
  }())

// The one boundary between libtorch and dstrain: DS_TORCH_CALL(model_file, expr) evaluates
// expr and turns what libtorch throws (c10::Error, the TorchScript interpreter's errors) into
// ds::Error naming the call, the model file and our source line. A ds::Error thrown from
// inside (an engine callback run by autograd) passes through unchanged.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>
#include <utility>

#include "ds/core/error.h"

namespace ds::torch::detail {

// The line of a libtorch message that says what went wrong: TorchScript errors carry the
// script's traceback first and the Python-style "RuntimeError: ..." last.
std::string torch_message(const std::string& what);

template <class F>
decltype(auto) torch_call(F&& f, const char* call, const std::string& model_file, const char* src, int line) {
  try {
    return std::forward<F>(f)();
  } catch (const ds::Error&) {
    throw;
  } catch (const c10::Error& e) {
    throw_error(model_file + ": " + call + ": " + torch_message(e.what_without_backtrace()), src, line);
  } catch (const std::exception& e) {
    throw_error(model_file + ": " + call + ": " + torch_message(e.what()), src, line);
  }
}

}  // namespace ds::torch::detail

#define DS_TORCH_CALL(model_file, expr) \
  ::ds::torch::detail::torch_call([&]() -> decltype(auto) { return expr; }, #expr, (model_file), __FILE__, __LINE__)

#include "check.h"

#include <sstream>

namespace ds {

void throw_mpi_error(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof text, "unknown MPI error");
  int cls = -1;
  MPI_Error_class(code, &cls);
  std::ostringstream os;
  os << "MPI call " << call << " failed: " << text << " (error class " << cls << ")";
  throw_error(os.str(), file, line);
}

}  // namespace ds

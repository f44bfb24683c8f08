// FT_MPI_CHECK: turns a failed MPI call (communicators use MPI_ERRORS_RETURN) into ft::Error
// naming the call and MPI's own error text. Internal to comm/mpi.
// Thread safety: stateless.
#pragma once
#include <mpi.h>

#include <string>

#include "core/check.h"

namespace ft {

inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

}  // namespace ft

#define FT_MPI_CHECK(call)                                                                \
  do {                                                                                    \
    const int ft_mpi_code = (call);                                                       \
    FT_CHECK(ft_mpi_code == MPI_SUCCESS, #call, ": ", ::ft::mpi_error_text(ft_mpi_code)); \
  } while (0)

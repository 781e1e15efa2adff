# Every dependency is a Debian package (scripts/install_deps.sh installs them).
set(DS_MISSING_HINT "run: sudo scripts/install_deps.sh")

find_package(MPI REQUIRED COMPONENTS C CXX)
find_package(HDF5 REQUIRED COMPONENTS C)   # defines hdf5::hdf5 (CMake >= 3.19)
find_package(CLI11 CONFIG REQUIRED)         # libcli11-dev ships CLI11Config.cmake
find_package(nlohmann_json 3.10 REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(Threads REQUIRED)

# OpenBLAS' CBLAS (the GEMMs of src/nn). Debian ships one flavour per threading model;
# the OpenMP one shares the thread pool with our own OpenMP kernels. Their directories carry
# the multiarch triplet (x86_64-linux-gnu, aarch64-linux-gnu).
set(_ds_multiarch ${CMAKE_LIBRARY_ARCHITECTURE})
if(NOT _ds_multiarch)
  set(_ds_multiarch ${CMAKE_SYSTEM_PROCESSOR}-linux-gnu)
endif()
find_path(DS_CBLAS_INCLUDE cblas.h
  HINTS /usr/include/${_ds_multiarch}/openblas-openmp /usr/include/${_ds_multiarch}/openblas-pthread
        /usr/include/openblas /usr/include)
find_library(DS_OPENBLAS_LIBRARY NAMES openblas libopenblas.so.0
  PATHS /usr/lib/${_ds_multiarch}/openblas-openmp NO_DEFAULT_PATH)
find_library(DS_OPENBLAS_LIBRARY NAMES openblas)
if(NOT DS_CBLAS_INCLUDE OR NOT DS_OPENBLAS_LIBRARY)
  message(FATAL_ERROR "OpenBLAS (cblas.h, libopenblas) not found: ${DS_MISSING_HINT}")
endif()
add_library(ds_openblas INTERFACE)
target_include_directories(ds_openblas SYSTEM INTERFACE ${DS_CBLAS_INCLUDE})
target_link_libraries(ds_openblas INTERFACE ${DS_OPENBLAS_LIBRARY})
install(TARGETS ds_openblas EXPORT dstrainTargets)

if(DS_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(DS_BUILD_BENCH)
  find_package(benchmark QUIET)
endif()

# Python side: interop tests and baselines only, always the system interpreter.
find_program(DS_SYSTEM_PYTHON python3 PATHS /usr/bin NO_DEFAULT_PATH)

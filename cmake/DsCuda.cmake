# Optional CUDA kernels and NCCL communicator. AUTO: use them when nvcc (and nccl.h) are found.
set(DS_HAVE_CUDA OFF)
set(DS_HAVE_NCCL OFF)
if(NOT DS_WITH_CUDA STREQUAL "OFF")
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
    set(CMAKE_CUDA_ARCHITECTURES 80 90)   # A100 and H100/H200; must precede enable_language
  endif()
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    # CMake < 3.26 does not know nvcc's C++20 flag (nvcc >= 12 supports it).
    if(CMAKE_VERSION VERSION_LESS 3.26 AND CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA"
       AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    # CMake < 3.26's FindCUDAToolkit (Debian 12 ships 3.25.1) sets a property on
    # CUDA::nvToolsExt unconditionally, but CUDA 12.9+ no longer ships that legacy library,
    # so configure stops. dstrain does not use it: an empty stand-in target lets the stock
    # module run. The module leaves an existing target alone.
    if(CMAKE_VERSION VERSION_LESS 3.26 AND NOT TARGET CUDA::nvToolsExt)
      get_filename_component(_ds_cuda_root "${CMAKE_CUDA_COMPILER}" DIRECTORY)
      find_library(_ds_nvtoolsext NAMES nvToolsExt nvToolsExt64
                   HINTS "${_ds_cuda_root}/.." PATH_SUFFIXES lib64 lib NO_CACHE)
      if(NOT _ds_nvtoolsext)
        add_library(CUDA::nvToolsExt INTERFACE IMPORTED)
      endif()
    endif()
    find_package(CUDAToolkit REQUIRED)
    set(DS_HAVE_CUDA ON)
  elseif(DS_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DS_WITH_CUDA=ON but no CUDA compiler (nvcc) was found; set CUDACXX or PATH")
  endif()
endif()

if(DS_HAVE_CUDA AND NOT DS_WITH_NCCL STREQUAL "OFF")
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME PATH_SUFFIXES include)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_HOME PATH_SUFFIXES lib lib64)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    add_library(NCCL::nccl UNKNOWN IMPORTED)
    set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                          INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
    set(DS_HAVE_NCCL ON)
  endif()
endif()
if(DS_WITH_NCCL STREQUAL "ON" AND NOT DS_HAVE_NCCL)
  message(FATAL_ERROR "DS_WITH_NCCL=ON but NCCL (nccl.h, libnccl) was not found; set NCCL_HOME")
endif()

# Include before find_package(CUDAToolkit): used by DsCuda.cmake and by the installed
# dstrainConfig.cmake (a consumer's find_package(dstrain) finds the toolkit again).
#
# CMake < 3.26's FindCUDAToolkit (Debian 12 ships 3.25.1) sets a property on CUDA::nvToolsExt
# unconditionally, but CUDA 12.9+ no longer ships that legacy library, so configure stops with
# "set_property could not find TARGET CUDA::nvToolsExt". dstrain does not use it: where the
# library is absent, an empty stand-in target lets the stock module run (the module leaves an
# existing target alone).
if(CMAKE_VERSION VERSION_LESS 3.26 AND NOT TARGET CUDA::nvToolsExt)
  set(_ds_cuda_hints)
  if(CMAKE_CUDA_COMPILER)
    get_filename_component(_ds_cuda_bin "${CMAKE_CUDA_COMPILER}" DIRECTORY)
    list(APPEND _ds_cuda_hints "${_ds_cuda_bin}/..")
  endif()
  list(APPEND _ds_cuda_hints ${CUDAToolkit_ROOT} $ENV{CUDAToolkit_ROOT} $ENV{CUDA_PATH} /usr/local/cuda)
  find_library(_ds_nvtoolsext NAMES nvToolsExt nvToolsExt64 HINTS ${_ds_cuda_hints}
               PATH_SUFFIXES lib64 lib NO_CACHE)
  if(NOT _ds_nvtoolsext)
    add_library(CUDA::nvToolsExt INTERFACE IMPORTED)
  endif()
  unset(_ds_nvtoolsext)
  unset(_ds_cuda_hints)
  unset(_ds_cuda_bin)
endif()

# Optional PyTorch adapter (src/torch, ds_torch): TorchScript models trained by the engine.
# DS_WITH_TORCH AUTO builds it when find_package(Torch) finds a libtorch (Debian's libtorch-dev,
# or a user's own through Torch_DIR / CMAKE_PREFIX_PATH), ON requires one, OFF skips it.
# Sets DS_HAVE_TORCH and DS_TORCH_VERSION.
set(DS_WITH_TORCH AUTO CACHE STRING "Build the PyTorch (TorchScript) adapter: AUTO, ON or OFF")
set_property(CACHE DS_WITH_TORCH PROPERTY STRINGS AUTO ON OFF)
set(DS_HAVE_TORCH OFF)
set(DS_TORCH_VERSION "")
if(NOT DS_WITH_TORCH STREQUAL "OFF")
  find_package(Torch QUIET)
  if(TORCH_FOUND AND TARGET torch)
    set(DS_HAVE_TORCH ON)
    set(DS_TORCH_VERSION "${Torch_VERSION}")
  elseif(DS_WITH_TORCH STREQUAL "ON")
    message(FATAL_ERROR "DS_WITH_TORCH=ON but no libtorch was found (TorchConfig.cmake); install "
                        "libtorch-dev or set Torch_DIR to <libtorch>/share/cmake/Torch")
  endif()
endif()

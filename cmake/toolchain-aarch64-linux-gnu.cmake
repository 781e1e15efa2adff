# Cross build for aarch64 Linux (Grace, Graviton) with Debian's cross compiler
# (g++-aarch64-linux-gnu) against an arm64 sysroot: Debian's :arm64 packages unpacked into a
# directory (scripts/check_arm64.sh makes one in /var/cache/dstrain/arm64/sysroot).
#
#   cmake -S . -B build-arm64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64-linux-gnu.cmake \
#         -DDS_ARM64_SYSROOT=/var/cache/dstrain/arm64/sysroot -DDS_WITH_CUDA=OFF -DDS_BUILD_BENCH=OFF
#
# Libraries and headers are looked up in the sysroot only, programs on the host. Test binaries
# run through qemu-aarch64 with the sysroot as its library prefix (CMAKE_CROSSCOMPILING_EMULATOR:
# gtest_discover_tests and ctest use it).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# Kept across try_compile (which reads this file again without the cache).
if(NOT DS_ARM64_SYSROOT AND DEFINED ENV{DS_ARM64_SYSROOT})
  set(DS_ARM64_SYSROOT $ENV{DS_ARM64_SYSROOT})
endif()
if(NOT DS_ARM64_SYSROOT OR NOT EXISTS ${DS_ARM64_SYSROOT}/usr/include/aarch64-linux-gnu)
  message(FATAL_ERROR "DS_ARM64_SYSROOT='${DS_ARM64_SYSROOT}' is not an arm64 sysroot "
                      "(no usr/include/aarch64-linux-gnu): scripts/check_arm64.sh makes one")
endif()
set(ENV{DS_ARM64_SYSROOT} ${DS_ARM64_SYSROOT})
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES DS_ARM64_SYSROOT)

set(CMAKE_SYSROOT ${DS_ARM64_SYSROOT})
set(CMAKE_FIND_ROOT_PATH ${DS_ARM64_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# pkg-config (FindMPI asks it for Open MPI's flags) reads the sysroot's .pc files only.
set(ENV{PKG_CONFIG_SYSROOT_DIR} ${DS_ARM64_SYSROOT})
set(ENV{PKG_CONFIG_LIBDIR} ${DS_ARM64_SYSROOT}/usr/lib/aarch64-linux-gnu/pkgconfig:${DS_ARM64_SYSROOT}/usr/share/pkgconfig)
# The host's mpicc and h5cc would report the host's (x86-64) paths: the MPI and HDF5 modules
# find the sysroot's headers and libraries through pkg-config and by name instead.
set(MPI_SKIP_COMPILER_WRAPPER ON)
set(MPI_C_COMPILER "" CACHE FILEPATH "no MPI wrapper when cross compiling")
set(MPI_CXX_COMPILER "" CACHE FILEPATH "no MPI wrapper when cross compiling")
set(HDF5_C_COMPILER_EXECUTABLE "" CACHE FILEPATH "no HDF5 wrapper when cross compiling")

find_program(DS_QEMU_AARCH64 qemu-aarch64)
if(DS_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${DS_QEMU_AARCH64} -L ${DS_ARM64_SYSROOT})
endif()

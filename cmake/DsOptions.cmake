# Compiler flags ride on targets, never globally.
add_library(ds_warnings INTERFACE)
target_compile_options(ds_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)

add_library(ds_cpu_flags INTERFACE)
if(DS_NATIVE)
  target_compile_options(ds_cpu_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
endif()

if(DS_SANITIZE)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=address,undefined> $<$<COMPILE_LANGUAGE:CXX,C>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-sanitize-recover=undefined>)
  add_link_options(-fsanitize=address,undefined)
endif()

# ds_library(NAME <target> SOURCES ... [PUBLIC_DEPS ...] [PRIVATE_DEPS ...])
# One static library with its public headers in ./include, an alias dstrain::<short>,
# and an install rule into the dstrainTargets export set.
function(ds_library)
  cmake_parse_arguments(A "" "NAME" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${A_NAME} STATIC ${A_SOURCES})
  string(REGEX REPLACE "^ds_" "" short ${A_NAME})
  add_library(dstrain::${short} ALIAS ${A_NAME})
  set_target_properties(${A_NAME} PROPERTIES EXPORT_NAME ${short})
  target_include_directories(${A_NAME} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(${A_NAME} PUBLIC ${A_PUBLIC_DEPS} PRIVATE ds_warnings ds_cpu_flags ${A_PRIVATE_DEPS})
  install(TARGETS ${A_NAME} EXPORT dstrainTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/include)
    install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  endif()
endfunction()

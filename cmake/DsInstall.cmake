include(CMakePackageConfigHelpers)
set(DS_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/dstrain)
install(TARGETS ds_warnings ds_cpu_flags EXPORT dstrainTargets)
install(EXPORT dstrainTargets NAMESPACE dstrain:: DESTINATION ${DS_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/dstrainConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/dstrainConfig.cmake INSTALL_DESTINATION ${DS_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/dstrainConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/dstrainConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/dstrainConfigVersion.cmake
              ${CMAKE_CURRENT_LIST_DIR}/DsNvToolsExtCompat.cmake
        DESTINATION ${DS_CMAKE_DIR})

# Installs headers (under include/jvpc, keeping their source paths: "runtime/executable.h"),
# the static libraries and a CMake package:
#
#   find_package(jvpc REQUIRED)                        # also finds Torch and nlohmann_json
#   target_link_libraries(app PRIVATE jvpc::runtime)   # load and run compiled graphs
#   target_link_libraries(app PRIVATE jvpc::jvpc)      # the whole compiler: trace, linearize
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(DIRECTORY compiler runtime passes DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/jvpc
  FILES_MATCHING PATTERN "*.h" PATTERN "cli" EXCLUDE)
set_target_properties(jvpc_ir PROPERTIES EXPORT_NAME ir)
set_target_properties(jvpc_cost PROPERTIES EXPORT_NAME cost)
set_target_properties(jvpc_runtime PROPERTIES EXPORT_NAME runtime)
set_target_properties(jvpc_trace PROPERTIES EXPORT_NAME trace)
set_target_properties(jvpc_passes PROPERTIES EXPORT_NAME passes)
set_target_properties(jvpc_lib PROPERTIES EXPORT_NAME jvpc)
install(TARGETS jvpc_options jvpc_ir jvpc_cost jvpc_runtime jvpc_trace jvpc_passes jvpc_lib
  EXPORT jvpcTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS jvpc_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT jvpcTargets NAMESPACE jvpc:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/jvpc)
configure_package_config_file(cmake/jvpcConfig.cmake.in ${PROJECT_BINARY_DIR}/jvpcConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/jvpc)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/jvpcConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/jvpcConfig.cmake ${PROJECT_BINARY_DIR}/jvpcConfigVersion.cmake cmake/torch.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/jvpc)

# Installs the public headers (under include/jvpc, keeping their source paths:
# "runtime/executable.h"), the static libraries and a CMake package:
#
#   find_package(jvpc REQUIRED)                        # also finds Torch and nlohmann_json
#   target_link_libraries(app PRIVATE jvpc::runtime)   # load and run compiled graphs
#   target_link_libraries(app PRIVATE jvpc::jvpc)      # the whole compiler: trace, linearize
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)


# The public headers: the API an application includes (linearize, programs, the forward-AD
# reference, graph files and the text form, the runtime, the passes and the pipeline) and the
# headers those include. The rules' tables, shape rules, the tracer's state, the runtime's plan
# and CUDA-graph internals stay inside.
set(JVPC_PUBLIC_HEADERS
  compiler/api/linearize.h compiler/api/program.h compiler/api/reference.h compiler/api/report.h
  ir/cost/cost_model.h ir/cost/kernel_watch.h
  ir/builder.h ir/io/files.h ir/graph.h ir/op.h ir/op_names.def ir/io/graph_files.h ir/io/graph_json.h
  ir/io/json_text.h ir/io/limits.h ir/ops.h ir/printer.h ir/retarget.h
  ir/io/safetensors.h ir/text.h ir/verifier.h
  compiler/trace/tracer.h
  passes/cost_table.h passes/linearize_pipeline.h passes/pass.h passes/passes.h passes/rewrite.h
  runtime/aoti_program.h runtime/executable.h runtime/program.h)
foreach(_header IN LISTS JVPC_PUBLIC_HEADERS)
  get_filename_component(_dir ${_header} DIRECTORY)
  install(FILES ${_header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/jvpc/${_dir})
endforeach()
set_target_properties(jvpc_ir PROPERTIES EXPORT_NAME ir)
set_target_properties(jvpc_cost PROPERTIES EXPORT_NAME cost)
set_target_properties(jvpc_runtime PROPERTIES EXPORT_NAME runtime)
set_target_properties(jvpc_trace PROPERTIES EXPORT_NAME trace)
set_target_properties(jvpc_passes PROPERTIES EXPORT_NAME passes)
set_target_properties(jvpc_lib PROPERTIES EXPORT_NAME jvpc)
install(TARGETS jvpc_options jvpc_ir jvpc_cost jvpc_runtime jvpc_trace jvpc_passes jvpc_lib
  EXPORT jvpcTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
if(TARGET jvpc_cli)
  install(TARGETS jvpc_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(EXPORT jvpcTargets NAMESPACE jvpc:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/jvpc)
configure_package_config_file(cmake/jvpcConfig.cmake.in ${PROJECT_BINARY_DIR}/jvpcConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/jvpc)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/jvpcConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/jvpcConfig.cmake ${PROJECT_BINARY_DIR}/jvpcConfigVersion.cmake cmake/torch.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/jvpc)

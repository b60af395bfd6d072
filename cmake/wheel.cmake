# What `pip install --no-build-isolation .` puts in the wheel (pyproject.toml, scikit-build-core):
# the CMake install component "python", beside the package's Python files that scikit-build-core
# copies from python/jvpc. Included only in that build (SKBUILD).
#
#   site-packages/jvpc/_C*.so, _build.py   the extension and the torch release it was built against
#   bin/jvpc                               the CLI, on PATH in that environment
#
# Both find LibTorch in the torch package of the same environment through a relative RPATH:
# site-packages/torch/lib, seen from site-packages/jvpc and from the scripts folder (bin/ of a
# virtual environment; its path to site-packages is the interpreter's install scheme's); then in
# the torch the wheel was built against, where torch lies elsewhere (a virtual environment with
# --system-site-packages, a user install beside a system torch).
if(NOT TARGET jvpc_python OR NOT TARGET jvpc_cli)
  message(FATAL_ERROR "the wheel needs the Python module and the CLI (JVPC_PYTHON, JVPC_BUILD_CLI)")
endif()
execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c
    "import os, sysconfig; print(os.path.relpath(sysconfig.get_path('platlib'), sysconfig.get_path('scripts')))"
  OUTPUT_VARIABLE _jvpc_scripts_to_site OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
set_target_properties(jvpc_python PROPERTIES INSTALL_RPATH "$ORIGIN/../torch/lib;${TORCH_INSTALL_PREFIX}/lib")
set_target_properties(jvpc_cli PROPERTIES
  INSTALL_RPATH "$ORIGIN/${_jvpc_scripts_to_site}/torch/lib;${TORCH_INSTALL_PREFIX}/lib")
install(TARGETS jvpc_python LIBRARY DESTINATION jvpc COMPONENT python)
install(FILES ${PROJECT_BINARY_DIR}/python/jvpc/_build.py DESTINATION jvpc COMPONENT python)
install(TARGETS jvpc_cli RUNTIME DESTINATION ${SKBUILD_SCRIPTS_DIR} COMPONENT python)

# After find_package(Torch), in jvpc's build and in jvpcConfig.cmake alike.
#
# The torch wheel's CUDA libraries (nvidia/*/lib beside torch/) are the ones libtorch_cuda was
# built for, and the ones its RPATH loads at run time. The linker resolves that library's own
# dependencies (libnccl.so.2, ...) through the link line's -rpath before the library's RPATH, and
# a CUDA toolkit there (/usr/local/cuda/lib, from Caffe2's config) may hold older copies that lack
# symbols it needs: -rpath-link puts the wheel's first.
file(GLOB _jvpc_wheel_libs "${TORCH_INSTALL_PREFIX}/../nvidia/*/lib")
if(_jvpc_wheel_libs AND TARGET torch)
  list(JOIN _jvpc_wheel_libs ":" _jvpc_wheel_libs)
  set_property(TARGET torch APPEND PROPERTY INTERFACE_LINK_OPTIONS "LINKER:-rpath-link,${_jvpc_wheel_libs}")
endif()

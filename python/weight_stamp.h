// jvpc._C._WeightStamp: what a linear map was made with (python/jvpc/_weights.py).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace jvpc {

void bind_weight_stamp(pybind11::module_& m);

}  // namespace jvpc

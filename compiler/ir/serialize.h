// The files jvpc reads and writes, one header per job:
//   json_text.h    JSON text: the parser and its limits, At (a value with its path, for errors)
//   graph_json.h   the JSON form of a graph: to_json, from_json, parse_graph
//   safetensors.h  safetensors files: constants and inputs
//   graph_files.h  graph and program files: save, load (pairing, memory before loading)
//   retarget.h     moving a graph to a device, retyping its floating-point tensors
#pragma once

#include "compiler/ir/graph_files.h"
#include "compiler/ir/graph_json.h"
#include "compiler/ir/json_text.h"
#include "compiler/ir/retarget.h"
#include "compiler/ir/safetensors.h"

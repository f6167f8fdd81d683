// Stand-in for ATen's CUDA context in the emulated build of ops/cuda (see ../../../simt.h).
#pragma once
#include "ops/cuda/emulation/simt.h"

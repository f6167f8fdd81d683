// Stand-in for the CUDA runtime header in the emulated build of ops/cuda (see ../simt.h).
#pragma once
#include "ops/cuda/emulation/simt.h"

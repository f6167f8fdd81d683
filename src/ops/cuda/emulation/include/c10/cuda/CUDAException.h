// Stand-in for c10's CUDA error checks in the emulated build of ops/cuda (see ../../../simt.h): an
// emulated launch reports its errors by throwing.
#pragma once

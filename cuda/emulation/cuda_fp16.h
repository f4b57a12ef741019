#pragma once
// Host emulation (cuda_runtime.h here): the half and bfloat16 types and conversions live there.
#include "cuda_runtime.h"

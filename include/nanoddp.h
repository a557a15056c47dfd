#pragma once
// nanoddp: the one header a program includes. Names follow LibTorch under nd::.
#include "engine/autograd.h"
#include "engine/device.h"
#include "engine/dtype.h"
#include "engine/error.h"
#include "engine/factories.h"
#include "engine/ops/copy.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/index.h"
#include "engine/ops/reduce.h"
#include "engine/ops/view.h"
#include "engine/storage.h"
#include "engine/tensor.h"

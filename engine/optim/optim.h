#pragma once
// All optimizers and schedulers.
#include "engine/optim/adam.h"
#include "engine/optim/grad_scaler.h"
#include "engine/optim/graphed_step.h"
#include "engine/optim/lr_scheduler.h"
#include "engine/optim/optimizer.h"
#include "engine/optim/sgd.h"

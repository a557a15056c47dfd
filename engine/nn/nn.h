#pragma once
// Every nn layer (docs/modules.md): the Module base, containers, layers, activations,
// losses and init. Included by <nanoddp.h>.
#include "engine/nn/activation.h"
#include "engine/nn/attention.h"
#include "engine/nn/batch_norm.h"
#include "engine/nn/clip_grad.h"
#include "engine/nn/container.h"
#include "engine/nn/conv.h"
#include "engine/nn/dropout.h"
#include "engine/nn/embedding.h"
#include "engine/nn/init.h"
#include "engine/nn/layer_norm.h"
#include "engine/nn/linear.h"
#include "engine/nn/loss.h"
#include "engine/nn/module.h"

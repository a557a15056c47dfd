#pragma once
// Every model (docs/models.md): DCGAN generator and discriminator, the MAE, the
// Fashion-MNIST classifier, the papers' recipes. Included by <nanoddp.h>.
#include "models/classifier.h"
#include "models/dcgan.h"
#include "models/mae.h"
#include "models/recipes.h"

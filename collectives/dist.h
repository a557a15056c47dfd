#pragma once
// nd::dist: data parallelism on top of the engine (docs/distributed.md).
// One include for process groups, the watchdog, DistributedDataParallel and its
// communication hooks, DistributedSampler, SyncBatchNorm and ZeroRedundancyOptimizer;
// <nanoddp.h> includes it.
#include "collectives/comm_hooks.h"
#include "collectives/ddp.h"
#include "collectives/local_process_group.h"
#include "collectives/powersgd.h"
#include "collectives/process_group.h"
#include "collectives/sampler.h"
#include "collectives/sync_batch_norm.h"
#include "collectives/watchdog.h"
#include "collectives/zero.h"

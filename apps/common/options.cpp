#include "common/options.h"

namespace app {

void add_common_flags(Flags& flags, CommonOptions& o, bool has_batch_norm) {
  o.flags = &flags;
  flags.add("--device", &o.device, "cpu or cuda (cuda:N)", "D");
  flags.add("--steps", &o.steps, "training steps (optimizer updates); 0 with --resume only evaluates", 0);
  flags.add("--batch-size", &o.batch_size, "global batch, split evenly over the ranks");
  flags.add("--lr", &o.lr, "learning rate");
  flags.add("--out", &o.out, "output folder: metrics.jsonl, PNGs, ckpt/ (default out/<app>)", "DIR");
  flags.add("--resume", &o.resume, "continue from DIR/ckpt/latest.safetensors");
  flags.add("--overwrite", &o.overwrite,
            "DIR holds a run (metrics.jsonl or ckpt/latest.safetensors): delete its files and start again");
  flags.add("--seed", &o.seed, "seed of the weights, the data order and the noise", 0);
  flags.add("--data", &o.data, "training data: a folder of Fashion-MNIST/MNIST IDX files (the default), and for the "
            "image apps an image folder (one subfolder per class), CIFAR-10/100 binaries or tar shards (a .tar, a "
            "brace pattern 'train-{000..127}.tar' or a folder of them)", "DIR");
  flags.add("--log-every", &o.log_every, "steps between log lines / metrics.jsonl entries");
  flags.add("--sample-every", &o.sample_every, "steps between sample PNGs");
  flags.add("--ckpt-every", &o.ckpt_every, "steps between checkpoints (one is also written at the end)");
  flags.add("--exit-after", &o.exit_after,
            "stop right after this step and its checkpoint, as if killed (tests --resume; 0: off)", 0);
  if (has_batch_norm) flags.add("--sync-bn", &o.sync_bn, "SyncBatchNorm: BatchNorm statistics over all ranks");
  flags.add("--amp", &o.amp,
            "mixed precision: bf16 operands, f32 accumulation in the GEMMs, convolutions and attention; "
            "on the CPU a slower reference");
  flags.add_choice("--amp-dtype", &o.amp_dtype, kAmpDtypes,
                   "--amp's operands: bf16 (default) or f16 (with loss scaling, a GradScaler)", "T");
  flags.add("--no-tensorboard", &o.no_tensorboard, "no TensorBoard event files in DIR (written by default)");
  flags.add_choice("--comm-hook", &o.comm_hook, kCommHooks,
                   "DDP gradient communication: none (f32 all-reduce), bf16, fp16, or powersgd (low-rank compression)",
                   "H");
  flags.add("--powersgd-rank", &o.powersgd_rank, "--comm-hook powersgd: rank of the gradient approximation", 1);
  flags.add("--zero", &o.zero,
            "ZeRO: shard each optimizer's state over the ranks (ZeroRedundancyOptimizer); the same training");
}

int64_t World::reduce(int64_t value, nd::dist::ReduceOp op) const {
  if (size == 1) return value;
  nd::Tensor flag = nd::full({1}, static_cast<double>(value), nd::TensorOptions(nd::kInt64));
  nd::dist::world()->allreduce(flag, {op})->wait();
  return flag.data_ptr<int64_t>()[0];
}

World world() {
  const auto pg = nd::dist::world();
  return World{pg->rank(), pg->size()};
}

}  // namespace app

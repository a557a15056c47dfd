// train_gan_mae: the nanoddp side of docs/porting.md, the same program as
// train_gan_mae.py beside it, in the same order: a DCGAN (G + D, Adam) and an MAE (AdamW +
// cosine schedule) trained together on Fashion-MNIST under DistributedDataParallel, with
// SyncBatchNorm, optional mixed precision (--amp, bf16; --amp-dtype f16 adds loss scaling)
// and a checkpoint that --resume continues from. Only the public API (<nanoddp.h>).
//
// Run alone (a world of one process):  ./build/examples/porting/train_gan_mae --steps 5
// or with ranks:                        mpirun -np 2 ./build/examples/porting/train_gan_mae
// CI runs it for a few steps, then resumes from its checkpoint (examples/CMakeLists.txt).
#include <nanoddp.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

namespace {

using nd::Tensor;
namespace models = nd::models;

constexpr int64_t kNz = 64, kNgf = 32, kNdf = 32;  // the .py's NZ, NGF, NDF

struct Args {
  int64_t steps = 200;
  int64_t batch_size = 64;  // global: split evenly over the ranks
  std::string device = "cpu";
  std::string data = nd::data::kFashionMnistDir;
  std::string out = "out/train_gan_mae";
  bool resume = false;
  bool amp = false;
  std::string amp_dtype = "bf16";
};

// argparse's --help.
constexpr const char* kUsage =
    "usage: train_gan_mae [--steps N] [--batch-size N] [--device D] [--data DIR] [--out DIR] [--resume]\n"
    "                     [--amp] [--amp-dtype bf16|f16]\n"
    "A DCGAN and an MAE trained together on Fashion-MNIST under DistributedDataParallel\n"
    "(docs/porting.md); alone or under mpirun.\n"
    "  --steps N          training steps (default 200)\n"
    "  --batch-size N     global batch, split evenly over the ranks (default 64)\n"
    "  --device D         cpu, cuda (this rank's GPU) or cuda:N (default cpu)\n"
    "  --data DIR         folder with the Fashion-MNIST IDX files (default /usr/share/datasets/fashion-mnist)\n"
    "  --out DIR          where DIR/ckpt.safetensors goes (default out/train_gan_mae)\n"
    "  --resume           continue from DIR/ckpt.safetensors\n"
    "  --amp              mixed precision (bf16 operands)\n"
    "  --amp-dtype T      --amp's operands: bf16 (default) or f16 (with loss scaling)\n"
    "  -h, --help         this text\n";

// argparse's part: the flags of the .py, nothing more (the apps use apps/common/flags.h,
// which is not public API).
Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    auto value = [&]() -> std::string {
      ND_CHECK(i + 1 < argc, flag, " needs a value");
      return argv[++i];
    };
    if (flag == "--steps") a.steps = std::stoll(value());
    else if (flag == "--batch-size") a.batch_size = std::stoll(value());
    else if (flag == "--device") a.device = value();
    else if (flag == "--data") a.data = value();
    else if (flag == "--out") a.out = value();
    else if (flag == "--resume") a.resume = true;
    else if (flag == "--amp") a.amp = true;
    else if (flag == "--amp-dtype") a.amp_dtype = value();
    else ND_CHECK(false, "unknown flag ", flag, " (flags: --steps --batch-size --device --data --out --resume --amp ",
                  "--amp-dtype; --help describes them)");
  }
  ND_CHECK(a.amp_dtype == "bf16" || a.amp_dtype == "f16", "--amp-dtype: expected bf16 or f16, found ", a.amp_dtype);
  return a;
}

int train(const Args& args) {
  // No init_process_group: the world exists on first use. Under mpirun it is MPI's
  // (ranks and the GPU per rank from MPI); started alone it is rank 0 of 1.
  const int rank = nd::dist::get_rank(), world_size = nd::dist::get_world_size();
  ND_CHECK(args.batch_size % world_size == 0, "--batch-size must divide by the world size ", world_size);
  const nd::Device device =
      args.device == "cuda" ? nd::Device(nd::kCUDA, nd::dist::local_rank()) : nd::Device(args.device);
  nd::cuda::check_device(device);  // one clear error when the build or the machine has no GPU
  const nd::ScalarType amp_dtype = args.amp_dtype == "f16" ? nd::kFloat16 : nd::kBFloat16;
  const std::string ckpt_path = args.out + "/ckpt.safetensors";
  std::filesystem::create_directories(args.out);

  nd::manual_seed(0);
  models::DCGANGenerator G(kNz, kNgf);
  models::DCGANDiscriminator D(kNdf);
  models::MAE M(models::MAEConfig::tiny());
  models::dcgan_init(*G);
  models::dcgan_init(*D);
  // On any device: on the CPU the statistics travel over MPI.
  nd::nn::convert_sync_batchnorm(G.ptr());
  nd::nn::convert_sync_batchnorm(D.ptr());
  G->to(device);
  D->to(device);
  M->to(device);
  // The name goes into messages ("bucket 0 of DDP model 'D'", unused 'D.main.5.weight').
  // default_group: MPI for CPU tensors, NCCL for a GPU's, none for one GPU alone.
  const auto ddp = nd::dist::DistributedDataParallelOptions().process_group(nd::dist::default_group(device));
  nd::dist::DistributedDataParallel g(G, "G", ddp);
  nd::dist::DistributedDataParallel d(D, "D", ddp);
  nd::dist::DistributedDataParallel m(M, "MAE", ddp);
  nd::optim::Adam opt_g(G->parameters(), nd::optim::AdamOptions(2e-4).betas({0.5, 0.999}));
  nd::optim::Adam opt_d(D->parameters(), nd::optim::AdamOptions(2e-4).betas({0.5, 0.999}));
  nd::optim::AdamW opt_m(M->parameters(), nd::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.05));
  nd::optim::CosineAnnealingLR sched_m(opt_m, /*T_max=*/args.steps);
  nd::optim::GradScaler scaler(nd::optim::GradScalerOptions().enabled(args.amp && amp_dtype == nd::kFloat16));

  // Everything a resume needs, by name; save_train_state adds the RNG state.
  nd::TrainState state{{{"G", G.get()}, {"D", D.get()}, {"MAE", M.get()}},
                       {{"G", &opt_g}, {"D", &opt_d}, {"MAE", &opt_m}},
                       {{"MAE", &sched_m}},
                       /*step=*/0,
                       {{"amp", &scaler}},
                       /*stateful=*/{}};
  if (args.resume) nd::load_train_state(ckpt_path, state);  // each tensor onto its parameter's device
  const int64_t start = state.step;

  const nd::data::Dataset data = nd::data::load_fashion_mnist(args.data, /*train=*/true);
  const nd::dist::DistributedSampler sampler(data.images.size(0), world_size, rank, /*shuffle=*/true, /*seed=*/0,
                                             /*drop_last=*/true);
  nd::data::DataLoader loader(data, nd::data::DataLoaderOptions(args.batch_size / world_size)
                                        .drop_last(true)
                                        .sampler([sampler](int64_t epoch) {  // set_epoch, done by the loader
                                          auto s = sampler;
                                          s.set_epoch(static_cast<uint64_t>(epoch));
                                          return s.indices();
                                        }));
  loader.set_epoch(start / loader.size());  // a resumed run restarts the epoch it stopped in

  auto bce = [](const Tensor& logits, double target) {
    return nd::binary_cross_entropy_with_logits(logits, nd::full(logits.sizes(), target, logits.options()));
  };
  // bf16 (or f16) GEMMs, convolutions and attention while it lives; the backward keeps
  // each op's forward precision, so the guard may span backward too.
  const nd::AutocastGuard autocast(device.type, args.amp, amp_dtype);

  for (int64_t step = start + 1; step <= args.steps; ++step) {
    std::optional<nd::data::Batch> batch = loader.next();
    if (!batch) batch = loader.next();  // the epoch ended; this call starts the next one
    const Tensor real = batch->images.to(device);
    const Tensor z = nd::randn({real.size(0), kNz}, device);
    const Tensor noise = nd::rand({real.size(0), M->config.num_patches()});  // on the CPU, where masking runs

    const Tensor fake = g(z);
    // D called twice, then one backward through both calls.
    const Tensor loss_d = bce(d(real), 1.0) + bce(d(fake.detach()), 0.0);
    opt_d.zero_grad();
    scaler.scale(loss_d).backward();
    scaler.step(opt_d);

    const Tensor loss_g = bce(d(fake), 1.0);  // a fresh forward: D's step changed the weights it saves
    opt_g.zero_grad();
    scaler.scale(loss_g).backward();
    scaler.step(opt_g);

    const models::MAEOutput out = m(real, noise);  // a struct where PyTorch returns a tuple
    opt_m.zero_grad();
    scaler.scale(out.loss).backward();
    scaler.step(opt_m);
    scaler.update();  // once per iteration, after the three steps
    sched_m.step();

    if (rank == 0)
      std::printf("step %lld: loss_d %.4f loss_g %.4f loss_mae %.4f\n", static_cast<long long>(step), loss_d.item(),
                  loss_g.item(), out.loss.item());
  }
  if (rank == 0 && args.steps > start) {
    state.step = args.steps;
    nd::save_train_state(ckpt_path, state, {}, world_size);  // atomic: temp file, fsync, rename
    std::printf("checkpoint: %s (step %lld)\n", ckpt_path.c_str(), static_cast<long long>(args.steps));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return train(parse_args(argc, argv));
  } catch (const std::exception& e) {  // nd::Error: what was expected, what was found
    std::fprintf(stderr, "train_gan_mae: error: %s\n", e.what());
    return 1;
  }
}

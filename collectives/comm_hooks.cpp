#include "collectives/comm_hooks.h"

#include "engine/autograd.h"
#include "engine/error.h"

namespace nd::dist {

std::shared_ptr<FutureWork> FutureWork::completed(Tensor value, CollectiveInfo info) {
  std::shared_ptr<FutureWork> f(new FutureWork());
  f->info_ = std::move(info);
  f->value_ = std::move(value);
  f->done_ = true;
  return f;
}

std::shared_ptr<FutureWork> FutureWork::then(std::shared_ptr<Work> work, std::function<Tensor()> next) {
  ND_CHECK(work != nullptr, "FutureWork::then: expected a Work to continue, found none");
  std::shared_ptr<FutureWork> f(new FutureWork());
  f->info_ = work->info();
  f->work_ = std::move(work);
  f->next_ = std::move(next);
  f->purpose_ = CollectivePurpose::current();
  return f;
}

void FutureWork::wait() {
  if (!done_) {
    done_ = true;  // a failure is final too: wait() rethrows it, the continuation never reruns
    try {
      work_->wait();
      CollectivePurpose purpose(purpose_);
      value_ = next_();
    } catch (...) {
      error_ = std::current_exception();
    }
    work_.reset();
    next_ = nullptr;
  }
  if (error_) std::rethrow_exception(error_);
}

// Done only once waited for: the continuation runs on the waiting thread.
bool FutureWork::is_completed() { return done_; }

std::exception_ptr FutureWork::error() { return error_; }

const Tensor& FutureWork::value() {
  wait();
  return value_;
}

namespace {

ProcessGroup& group_of(ProcessGroup* process_group, const GradBucket& bucket) {
  return process_group ? *process_group : *bucket.process_group();
}

AllreduceOptions bucket_sum(const GradBucket& bucket) {
  AllreduceOptions opts;
  opts.op = ReduceOp::SUM;
  opts.bucket = static_cast<int64_t>(bucket.index());
  return opts;
}

std::shared_ptr<FutureWork> compress_hook(ProcessGroup* process_group, GradBucket& bucket, ScalarType wire) {
  ProcessGroup& pg = group_of(process_group, bucket);
  NoGradGuard no_grad;
  const Tensor buffer = bucket.buffer();
  // Divided before the cast: each rank's share then fits wherever the average does.
  const Tensor compressed = buffer.div(pg.size()).to(wire);
  auto work = pg.allreduce(compressed, bucket_sum(bucket));
  return FutureWork::then(std::move(work), [buffer, compressed] {
    NoGradGuard no_grad;
    buffer.copy_(compressed);
    return buffer;
  });
}

}  // namespace

std::shared_ptr<FutureWork> allreduce_hook(ProcessGroup* process_group, GradBucket& bucket) {
  ProcessGroup& pg = group_of(process_group, bucket);
  NoGradGuard no_grad;
  const Tensor buffer = bucket.buffer();
  buffer.div_(pg.size());
  auto work = pg.allreduce(buffer, bucket_sum(bucket));
  return FutureWork::then(std::move(work), [buffer] { return buffer; });
}

std::shared_ptr<FutureWork> fp16_compress_hook(ProcessGroup* process_group, GradBucket& bucket) {
  return compress_hook(process_group, bucket, kFloat16);
}

std::shared_ptr<FutureWork> bf16_compress_hook(ProcessGroup* process_group, GradBucket& bucket) {
  return compress_hook(process_group, bucket, kBFloat16);
}

std::string comm_hook_name(std::shared_ptr<FutureWork> (*hook)(ProcessGroup*, GradBucket&)) {
  if (hook == &allreduce_hook) return "allreduce_hook";
  if (hook == &fp16_compress_hook) return "fp16_compress_hook";
  if (hook == &bf16_compress_hook) return "bf16_compress_hook";
  return "a custom hook";
}

}  // namespace nd::dist

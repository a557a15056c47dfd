#include "collectives/local_process_group.h"

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/ops/common.h"

namespace nd::dist {

namespace {
// The one rank's contribution copied into `dst`, a write in place like the real backends.
void copy_into(const char* op, const Tensor& dst, const Tensor& src) {
  NoGradGuard no_grad;
  dst.detach().copy_(src.detach());
  ops::bump_version(dst, op);
}
}  // namespace

std::shared_ptr<Work> LocalProcessGroup::done(const char* op, const Tensor& t, int64_t bucket) {
  CollectiveInfo info;
  info.op = op;
  info.sequence = sequence_++;
  if (t.defined()) {
    info.numel = t.numel();
    info.dtype = t.dtype();
  }
  info.bucket = bucket;
  info.purpose = CollectivePurpose::current();
  auto work = std::make_shared<AsyncWork>(std::move(info));
  work->mark_done();
  return work;
}

std::shared_ptr<Work> LocalProcessGroup::allreduce(const Tensor& tensor, const AllreduceOptions& options) {
  detail::check_tensor("allreduce", tensor, device_, backend());
  detail::check_reducible("allreduce", tensor);
  ops::bump_version(tensor, "allreduce");
  return done("allreduce", tensor, options.bucket);
}

std::shared_ptr<Work> LocalProcessGroup::broadcast(const Tensor& tensor, int root) {
  detail::check_tensor("broadcast", tensor, device_, backend());
  ND_CHECK(root == 0, "broadcast: root ", root, " is not a rank of a world of size 1");
  ops::bump_version(tensor, "broadcast");
  return done("broadcast", tensor);
}

std::shared_ptr<Work> LocalProcessGroup::allgather(const std::vector<Tensor>& outputs, const Tensor& input) {
  detail::check_tensor("allgather", input, device_, backend());
  detail::check_count("allgather", outputs.size(), 1, "output");
  detail::check_tensor("allgather", outputs[0], device_, backend());
  detail::check_same_dtype("allgather", input, outputs[0], "output");
  ND_CHECK(outputs[0].numel() == input.numel(), "allgather: outputs[0] must hold rank 0's input of ", input.numel(),
           " elements, found ", outputs[0].describe());
  copy_into("allgather", outputs[0], input.view(outputs[0].sizes()));
  return done("allgather", input);
}

std::shared_ptr<Work> LocalProcessGroup::reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                                                        ReduceOp) {
  detail::check_tensor("reduce_scatter", output, device_, backend());
  detail::check_reducible("reduce_scatter", output);
  detail::check_count("reduce_scatter", inputs.size(), 1, "input");
  detail::check_tensor("reduce_scatter", inputs[0], device_, backend());
  detail::check_same_dtype("reduce_scatter", output, inputs[0], "input");
  ND_CHECK(inputs[0].numel() == output.numel(), "reduce_scatter: inputs[0] must have the output's ",
           output.numel(), " elements, found ", inputs[0].describe());
  copy_into("reduce_scatter", output, inputs[0].view(output.sizes()));
  return done("reduce_scatter", output);
}

std::shared_ptr<Work> LocalProcessGroup::barrier() { return done("barrier", Tensor()); }

}  // namespace nd::dist

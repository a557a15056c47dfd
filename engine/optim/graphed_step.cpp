#include "engine/optim/graphed_step.h"

#include <utility>

#include "engine/error.h"
#include "engine/factories.h"

namespace nd::cuda {

namespace {

// "[6, 8] f32 on cuda:0": what a replay fixes of a tensor.
std::string layout(const Shape& shape, ScalarType dtype, const Device& device) {
  return shape_str(shape) + " " + dtype_name(dtype) + " on " + device.str();
}

std::string layout(const Tensor& t) { return layout(t.sizes(), t.dtype(), t.device()); }

}  // namespace

GraphedStep::GraphedStep(Step step, std::vector<optim::Optimizer*> optimizers, int warmup)
    : step_(std::move(step)), optimizers_(std::move(optimizers)), warmup_(warmup) {
  ND_CHECK(warmup >= 1, "GraphedStep: expected warmup >= 1 (the warm-up calls create the optimizers' state, which the "
           "capture reads), found ", warmup);
  for (size_t i = 0; i < optimizers_.size(); ++i)
    ND_CHECK(optimizers_[i] != nullptr, "GraphedStep: optimizer ", i, " is null");
}

int64_t GraphedStep::num_nodes() const { return graph_ ? graph_->num_nodes() : 0; }

GraphedStep::OptimizerRecord GraphedStep::record(const optim::Optimizer& optimizer) {
  OptimizerRecord r;
  for (const optim::OptimizerParamGroup& g : optimizer.param_groups()) {
    for (const Tensor& p : g.params()) {
      r.params.push_back(p);
      r.data.push_back(p.data_ptr());
      r.requires_grad.push_back(p.requires_grad());
    }
    r.options.push_back(g.options().to_map());
  }
  r.state_generation = optimizer.state_generation();
  return r;
}

void GraphedStep::check_inputs(const std::vector<Tensor>& inputs) const {
  if (static_inputs_.empty()) {  // the first call fixes them
    ND_CHECK(!inputs.empty(), "GraphedStep: expected at least one input tensor, found none");
    for (size_t i = 0; i < inputs.size(); ++i) {
      ND_CHECK(inputs[i].defined(), "GraphedStep: input ", i, " is an undefined tensor");
      ND_CHECK(inputs[i].is_cuda() && inputs[i].device() == inputs[0].device(), "GraphedStep: expected every input on ",
               inputs[0].is_cuda() ? inputs[0].device().str() : std::string("one CUDA device"), ", found input ", i,
               " ", inputs[i].describe());
    }
    return;
  }
  ND_CHECK(inputs.size() == static_inputs_.size(), "GraphedStep: the step was captured with ", static_inputs_.size(),
           " input(s), found ", inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& s = static_inputs_[i];
    ND_CHECK(inputs[i].defined(), "GraphedStep: input ", i, " is an undefined tensor");
    ND_CHECK(inputs[i].sizes() == s.sizes() && inputs[i].dtype() == s.dtype() && inputs[i].device() == s.device(),
             "GraphedStep: input ", i, " ", inputs[i].describe(), " is ", layout(inputs[i]),
             ", but the step was captured for ", layout(s), " (a replay reads the captured shapes: make a new "
             "GraphedStep for another shape)");
  }
}

void GraphedStep::check_optimizers() const {
  for (size_t o = 0; o < optimizers_.size(); ++o) {
    const optim::Optimizer& opt = *optimizers_[o];
    const OptimizerRecord& was = records_[o];
    const OptimizerRecord now = record(opt);
    ND_CHECK(now.params.size() == was.params.size(), "GraphedStep: ", opt.name(), " holds ", now.params.size(),
             " parameter(s), but the step was captured with ", was.params.size(),
             " (a replay updates the captured parameters only: make a new GraphedStep)");
    for (size_t k = 0; k < now.params.size(); ++k) {
      const Tensor &p = now.params[k], &q = was.params[k];
      ND_CHECK(p.impl_ptr() == q.impl_ptr() && now.data[k] == was.data[k] && p.sizes() == q.sizes() &&
                   p.dtype() == q.dtype(),
               "GraphedStep: ", opt.name(), "'s parameter ", k, " is ", p.describe(), " at ", now.data[k],
               ", but the step was captured with ", q.describe(), " at ", was.data[k],
               " (a replay updates the captured parameters' memory only: make a new GraphedStep)");
      ND_CHECK(now.requires_grad[k] == was.requires_grad[k], "GraphedStep: ", opt.name(), "'s parameter ", k, " ",
               p.describe(), now.requires_grad[k] ? " requires grad" : " does not require grad",
               ", but did ", was.requires_grad[k] ? "" : "not ", "at the capture (a replay computes and applies the "
               "captured gradients only: make a new GraphedStep)");
    }
    ND_CHECK(now.state_generation == was.state_generation, "GraphedStep: ", opt.name(),
             " loaded a state after the capture (load_state_dict makes new state tensors, which a replay would not "
             "see: make a new GraphedStep after loading)");
    ND_CHECK(now.options.size() == was.options.size(), "GraphedStep: ", opt.name(), " has ", now.options.size(),
             " parameter group(s), but the step was captured with ", was.options.size());
    for (size_t g = 0; g < now.options.size(); ++g)
      for (const auto& [name, value] : was.options[g]) {
        const double found = now.options[g].at(name);
        ND_CHECK(found == value, "GraphedStep: ", opt.name(), "'s parameter group ", g, " has ", name, " ", found,
                 ", but the step was captured with ", value, " (the captured launches hold it by value: make a new "
                 "GraphedStep after changing it)");
      }
  }
}

std::vector<Tensor> GraphedStep::operator()(const std::vector<Tensor>& inputs) {
  check_inputs(inputs);
  if (graph_) check_optimizers();
  if (static_inputs_.empty())
    for (const Tensor& x : inputs) static_inputs_.push_back(empty(x.sizes(), x.options()));
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].data_ptr() != static_inputs_[i].data_ptr()) static_inputs_[i].copy_(inputs[i]);
  if (calls_++ < warmup_) return step_(static_inputs_);
  if (!graph_) {
    records_.clear();
    for (const optim::Optimizer* opt : optimizers_) records_.push_back(record(*opt));
    auto graph = std::make_unique<Graph>(static_inputs_.front().device().index);
    graph->capture_begin();
    try {
      outputs_ = step_(static_inputs_);
    } catch (...) {
      graph.reset();  // ends the capture
      throw;
    }
    graph->capture_end();
    graph_ = std::move(graph);
  }
  graph_->replay();
  return outputs_;
}

}  // namespace nd::cuda

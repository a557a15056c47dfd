#include "scale_model/workload.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

namespace nd::scale {

namespace {

DdpModel ddp_model(const std::string& name, nn::Module& module) {
  DdpModel m{name, {}, {}};
  for (const Tensor& p : module.parameters())
    if (p.requires_grad()) m.params.push_back(p);
  m.buffers = module.buffers();
  return m;
}

// The dtype dtype_name calls `name`; else an error at `where` listing the names.
ScalarType dtype_named(const std::string& name, const std::string& where) {
  std::string names;
  for (const ScalarType t : {kFloat32, kFloat64, kBFloat16, kFloat16, kInt64, kInt32, kUInt8, kBool}) {
    if (name == dtype_name(t)) return t;
    names += std::string(names.empty() ? "" : ", ") + dtype_name(t);
  }
  throw Error(where + ": expected a dtype (" + names + "), found '" + name + "'");
}

DdpModel shapes_model(const std::string& path) {
  std::ifstream in(path);
  ND_CHECK(in.good(), "shapes: cannot read ", path);
  DdpModel m{"model", {}, {}};
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    std::istringstream words(line.substr(0, line.find('#')));
    std::string kind;
    if (!(words >> kind)) continue;
    std::vector<std::string> rest;
    for (std::string word; words >> word;) rest.push_back(word);
    auto size = [&](const std::string& word) {
      size_t used = 0;
      int64_t v = -1;
      try {
        v = std::stoll(word, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      ND_CHECK(used == word.size() && v >= 1, path, ":", number, ": expected sizes >= 1, found '", word, "'");
      return v;
    };
    if (kind == "param" && !rest.empty()) {
      Shape sizes;
      for (const std::string& word : rest) sizes.push_back(size(word));
      m.params.push_back(empty(sizes));
    } else if (kind == "buffer" && rest.size() == 2) {
      const int64_t bytes = size(rest[0]);
      const ScalarType t = dtype_named(rest[1], path + ":" + std::to_string(number));
      const auto e = static_cast<int64_t>(element_size(t));
      ND_CHECK(bytes % e == 0, path, ":", number, ": ", bytes, " bytes is not a whole number of ", dtype_name(t),
               " elements (", e, " bytes each)");
      m.buffers.push_back(empty({bytes / e}, t));
    } else {
      throw Error(path + ":" + std::to_string(number) +
                  ": expected 'param D0 D1 ...' or 'buffer BYTES DTYPE', found '" + line + "'");
    }
  }
  ND_CHECK(!m.params.empty(), "shapes: ", path, " names no parameter ('param D0 D1 ...')");
  return m;
}

}  // namespace

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Recorder::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count() - t0_;
}

void Recorder::ready(size_t model, size_t param) {
  if (current_) current_->ready.push_back({model, param, now()});
}

void Recorder::backward(const Tensor& loss) {
  run_.backwards.emplace_back();
  current_ = &run_.backwards.back();
  current_->start = now();
  loss.backward();
  current_->end = now();
  current_ = nullptr;
}

void Recorder::optimizer(const std::function<void()>& step) {
  const double start = now();
  step();
  run_.optimizer.emplace_back(start, now());
}

std::string workload_names() {
  return "dcgan28, dcgan32, dcgan64 (models::DCGANConfig), mae-tiny, mae-small, "
         "mae-mae_vit_{base,large}_patch16_dec512d8b, mae-mae_vit_huge_patch14_dec512d8b (models::MAEConfig), "
         "shapes:PATH";
}

Workload make_workload(const std::string& name, int64_t batch, int64_t profile_batch) {
  ND_CHECK(batch >= 0 && profile_batch >= 0,
           "make_workload: expected batches >= 0 (0: the app's default), found ", batch, " and ", profile_batch);
  Workload w;
  w.name = name;
  auto sink = std::make_shared<Recorder*>(nullptr);
  manual_seed(0);
  Generator gen{1, 0};
  if (name.rfind("dcgan", 0) == 0) {
    const models::DCGANConfig config = models::DCGANConfig::by_name(name);
    w.batch = batch > 0 ? batch : 64;
    struct State {
      models::DCGANGenerator G;
      models::DCGANDiscriminator D;
      std::unique_ptr<optim::Adam> opt_g, opt_d;
      Tensor real, z;
    };
    auto s = std::make_shared<State>(State{models::DCGANGenerator(config), models::DCGANDiscriminator(config), nullptr,
                                           nullptr, {}, {}});
    models::dcgan_init(*s->G);
    models::dcgan_init(*s->D);
    s->opt_g = std::make_unique<optim::Adam>(s->G->parameters(), optim::AdamOptions(2e-4).betas({0.5, 0.999}));
    s->opt_d = std::make_unique<optim::Adam>(s->D->parameters(), optim::AdamOptions(2e-4).betas({0.5, 0.999}));
    const int64_t n = profile_batch > 0 ? profile_batch : w.batch;
    s->real = rand({n, config.nc, config.image_size, config.image_size}, kFloat32, &gen) * 2.0 - 1.0;
    s->z = randn({n, config.nz}, kFloat32, &gen);
    w.models = {ddp_model("G", *s->G), ddp_model("D", *s->D)};
    w.step = [s](Recorder& r) {
      auto bce = [](const Tensor& logits, double target) {
        return binary_cross_entropy_with_logits(logits, target > 0.5 ? ones_like(logits) : zeros_like(logits));
      };
      const Tensor fake = s->G(s->z);
      s->opt_d->zero_grad();
      r.backward(bce(s->D(s->real), 1.0) + bce(s->D(fake.detach()), 0.0));
      r.optimizer([&] { s->opt_d->step(); });
      s->opt_g->zero_grad();
      r.backward(bce(s->D(fake), 1.0));
      r.optimizer([&] { s->opt_g->step(); });
    };
  } else if (name.rfind("mae-", 0) == 0) {
    const models::MAEConfig config = models::MAEConfig::by_name(name.substr(4));
    w.batch = batch > 0 ? batch : 128;
    struct State {
      models::MAE mae;
      std::unique_ptr<optim::AdamW> opt;
      Tensor images;
    };
    auto s = std::make_shared<State>(State{models::MAE(config), nullptr, {}});
    s->opt = std::make_unique<optim::AdamW>(s->mae->parameters(),
                                           optim::AdamWOptions(1.5e-4).betas({0.9, 0.95}).weight_decay(0.05));
    s->images = rand({profile_batch > 0 ? profile_batch : w.batch, config.in_chans, config.img_size, config.img_size}, kFloat32, &gen) * 2.0 - 1.0;
    w.models = {ddp_model("MAE", *s->mae)};
    w.step = [s](Recorder& r) {
      s->opt->zero_grad();
      r.backward(s->mae(s->images).loss);
      r.optimizer([&] { s->opt->step(); });
    };
  } else if (name.rfind("shapes:", 0) == 0) {
    w.models = {shapes_model(name.substr(7))};
    w.batch = batch;
    return w;  // nothing to run or hook
  } else {
    throw Error("unknown model '" + name + "': expected " + workload_names());
  }
  for (size_t m = 0; m < w.models.size(); ++m)
    for (size_t i = 0; i < w.models[m].params.size(); ++i)
      w.models[m].params[i].register_post_accumulate_grad_hook([sink, m, i](const Tensor&) {
        if (Recorder* r = *sink) r->ready(m, i);
      });
  w.sink = sink;
  return w;
}

Profile profile_workload(Workload& w, int steps, int warmup) {
  ND_CHECK(steps >= 1 && warmup >= 0, "profile_workload: expected steps >= 1 and warmup >= 0, found ", steps, " and ",
           warmup);
  ND_CHECK(w.step, "profile_workload: ", w.name, " has no step to run (synthetic_profile gives one)");
  std::shared_ptr<Recorder*> sink = w.sink;
  std::vector<Profile> runs;
  for (int i = 0; i < warmup + steps; ++i) {
    Recorder r;
    r.t0_ = 0;
    r.t0_ = r.now();
    *sink = &r;
    w.step(r);
    r.run_.step = r.now();
    *sink = nullptr;
    if (i >= warmup) runs.push_back(std::move(r.run_));
  }
  // Medians, event by event; the order of the first run's events (the same gradients every step).
  Profile out = runs[0];
  std::vector<double> v;
  auto med = [&](auto&& get) {
    v.clear();
    for (const Profile& p : runs) v.push_back(get(p));
    return median(v);
  };
  out.step = med([](const Profile& p) { return p.step; });
  for (size_t b = 0; b < out.backwards.size(); ++b) {
    out.backwards[b].start = med([&](const Profile& p) { return p.backwards.at(b).start; });
    out.backwards[b].end = med([&](const Profile& p) { return p.backwards.at(b).end; });
    for (Profile::Ready& e : out.backwards[b].ready) {
      e.at = med([&](const Profile& p) {
        for (const Profile::Ready& x : p.backwards.at(b).ready)
          if (x.model == e.model && x.param == e.param) return x.at;
        return p.backwards.at(b).end;
      });
    }
  }
  for (size_t k = 0; k < out.optimizer.size(); ++k) {
    out.optimizer[k].first = med([&](const Profile& p) { return p.optimizer.at(k).first; });
    out.optimizer[k].second = med([&](const Profile& p) { return p.optimizer.at(k).second; });
  }
  return out;
}

Profile synthetic_profile(const Workload& w, double backward_fraction) {
  ND_CHECK(backward_fraction > 0 && backward_fraction <= 1, "synthetic_profile: expected a backward fraction in (0, ",
           "1], found ", backward_fraction);
  Profile p;
  p.step = 1;
  p.backwards.push_back({1 - backward_fraction, 1, {}});
  for (size_t m = 0; m < w.models.size(); ++m)
    for (size_t i = w.models[m].params.size(); i-- > 0;) p.backwards[0].ready.push_back({m, i, 1});
  spread_ready_by_bytes(p, w);
  return p;
}

void spread_ready_by_bytes(Profile& profile, const Workload& w) {
  for (Profile::Backward& b : profile.backwards) {
    double total = 0, so_far = 0;
    for (const Profile::Ready& r : b.ready) total += static_cast<double>(w.models[r.model].params[r.param].numel());
    for (Profile::Ready& r : b.ready) {
      so_far += static_cast<double>(w.models[r.model].params[r.param].numel());
      r.at = b.start + (b.end - b.start) * so_far / total;
    }
  }
}

std::vector<std::vector<size_t>> bucket_plan(const Workload& w, const Profile& profile, size_t model,
                                             double bucket_cap_mb, double first_bucket_cap_mb, ScalarType dtype) {
  const std::vector<Tensor>& params = w.models.at(model).params;
  std::vector<size_t> order;
  std::vector<bool> seen(params.size(), false);
  for (const Profile::Backward& b : profile.backwards) {
    bool any = false;
    for (const Profile::Ready& e : b.ready) {
      if (e.model != model || seen[e.param]) continue;
      order.push_back(e.param);
      seen[e.param] = any = true;
    }
    if (any) break;
  }
  for (size_t i = params.size(); i-- > 0;)
    if (!seen[i]) order.push_back(i);
  // Gradients of `dtype`: plan_buckets reads only sizes and dtypes.
  std::vector<Tensor> like;
  for (const Tensor& p : params) like.push_back(p.dtype() == dtype ? p : empty(p.sizes(), dtype));
  return dist::plan_buckets(
      like, order,
      dist::DistributedDataParallelOptions().bucket_cap_mb(bucket_cap_mb).first_bucket_cap_mb(first_bucket_cap_mb));
}

}  // namespace nd::scale

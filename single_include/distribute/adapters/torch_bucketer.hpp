// distribute 0.1.0: <distribute/adapters/torch_bucketer.hpp> for the single-header edition.
// SPDX-License-Identifier: Apache-2.0
//
// GENERATED FILE, DO NOT EDIT. It is produced from include/distribute/ by
//   python3 tools/amalgamate.py
// Edit the headers under include/ and regenerate.
// GradientBucketer: all-reduces a libtorch model's gradients while backward is still computing
// them, as PyTorch's DistributedDataParallel does. Include after libtorch, with
// <distribute/adapters/torch.hpp>.
//
//   ds::adapters::torch::GradientBucketer bucketer(model->parameters(), {.bytes_per_pack = 4 << 20});
//   strategy.run([&](ds::ReplicaContext& ctx) {      // one bucketer per replica's model
//     bucketer.prepare(ctx);                          // the next backward's gradients are all-reduced...
//     loss.backward();                                // ...bucket by bucket, as autograd produces them
//     bucketer.finish();                              // waits; .grad() holds the averaged gradients
//     optimizer.step();
//   });
//
// The parameters are laid out once, in reverse order (roughly the order backward produces their
// gradients), into buckets of `bytes_per_pack` (a bucket is closed once it holds at least that
// many bytes; one dtype per bucket). A hook after each parameter's gradient accumulation copies
// .grad() into its bucket; a full bucket's all-reduce starts at once (ReplicaContext::
// all_reduce_async), in bucket order, so that every replica and worker starts the same collectives
// in the same order whatever order its gradients come in. finish() starts the buckets still open,
// with zeros for parameters that got no gradient in this step (unused parameters do not hang the
// step; their .grad() is then defined and holds the other replicas' average), waits for all of
// them and copies the results back into .grad().
//
// Gradient accumulation: backward passes made while the bucketer is not prepared only accumulate
// into .grad() as usual; prepare() before the last one, and the accumulated sums are reduced.
// With `wire` set to bfloat16 or float16, buckets are sent in that dtype (half or a quarter of the
// bytes; the library sums in float32 and rounds once per hop) and converted back on the way into
// .grad(). Results equal a synchronous ctx.batch_all_reduce of the same .grad() tensors.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <fmt/format.h>

#include <distribute/adapters/torch.hpp>
#include <distribute/distribute.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace adapters::torch {

struct BucketerOptions {
  /// A bucket is closed once it holds at least this many bytes (of the wire dtype). 0: one bucket.
  std::size_t bytes_per_pack = std::size_t{25} << 20;
  /// Mean (DDP's average over the replicas in sync) or Sum.
  ReduceOp op = ReduceOp::Mean;
  /// The dtype gradients travel in: unset keeps each parameter's own; c10::kBFloat16 or c10::kHalf
  /// compress floating-point gradients for the wire.
  std::optional<c10::ScalarType> wire = std::nullopt;
};

class GradientBucketer {
 public:
  /// `parameters`: the model's (leaf tensors that require grad), on the CPU.
  explicit GradientBucketer(std::vector<at::Tensor> parameters, BucketerOptions options = {})
      : state_(std::make_shared<State>()) {
    state_->options = options;
    if (options.op != ReduceOp::Mean && options.op != ReduceOp::Sum)
      throw InvalidArgument(fmt::format("GradientBucketer: op must be MEAN or SUM, got {}", to_string(options.op)));
    if (options.wire && *options.wire != c10::kBFloat16 && *options.wire != c10::kHalf && *options.wire != c10::kFloat)
      throw InvalidArgument(fmt::format("GradientBucketer: wire dtype must be bfloat16, float16 or float32, got {}",
                                        c10::toString(*options.wire)));
    if (parameters.empty()) throw InvalidArgument("GradientBucketer: no parameters");
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      const at::Tensor& p = parameters[i];
      if (!p.defined() || !p.requires_grad() || !p.is_leaf())
        throw InvalidArgument(fmt::format("GradientBucketer: parameter {} is not a leaf tensor that requires grad", i));
      if (!p.device().is_cpu())
        throw InvalidArgument(fmt::format("GradientBucketer: parameter {} is on {}; the bucketer reduces CPU tensors",
                                          i, p.device().str()));
      to_dtype(p.scalar_type());  // refuses dtypes the collectives cannot carry, with the message
    }
    layout(std::move(parameters));
    install_hooks();
  }

  GradientBucketer(GradientBucketer&&) = default;
  GradientBucketer& operator=(GradientBucketer&&) = default;
  ~GradientBucketer() {
    if (state_) state_->ctx = nullptr;  // the hooks stay on the accumulators and find nothing armed
  }

  /// Arms the hooks: the gradients the next backward pass accumulates are all-reduced through `ctx`
  /// (this replica's context) as they become ready. Call it inside the step, before that backward.
  void prepare(ReplicaContext& ctx) {
    State& s = *state_;
    if (s.ctx) throw InvalidArgument("GradientBucketer::prepare: already prepared (call finish() first)");
    s.ctx = &ctx;
    for (auto& b : s.buckets) {
      b.ready = 0;
      b.started = false;
      b.handle.reset();
    }
    for (auto& slot : s.slots) slot.ready = false;
    s.next = 0;
  }

  /// Starts what is left (zeros for parameters without a gradient), waits for every bucket and
  /// writes the reduced gradients into .grad(). A peer's failure or a timeout is thrown here.
  void finish() {
    State& s = *state_;
    if (!s.ctx) throw InvalidArgument("GradientBucketer::finish: not prepared (call prepare(ctx) before backward)");
    std::exception_ptr first_error;
    try {
      at::NoGradGuard no_grad;
      for (std::size_t k = s.next; k < s.buckets.size(); ++k) {
        // A parameter without a gradient in this pass sends what .grad() holds (an earlier pass's
        // accumulation), else zeros.
        for (const std::size_t i : s.buckets[k].slots) {
          if (!s.slots[i].ready) fill(s, i);
        }
        start(s, k);
      }
      s.next = s.buckets.size();
      for (auto& b : s.buckets) {
        at::Tensor reduced = b.handle->wait();
        b.handle.reset();
        for (const std::size_t i : b.slots) {
          Slot& slot = s.slots[i];
          at::Tensor part = reduced.narrow(0, static_cast<std::int64_t>(slot.offset), slot.param.numel());
          at::Tensor grad = slot.param.mutable_grad();
          if (!grad.defined()) {
            slot.param.mutable_grad() = part.to(slot.param.scalar_type()).view_as(slot.param).clone();
          } else {
            grad.copy_(part.view_as(grad));
          }
        }
      }
    } catch (...) {
      first_error = std::current_exception();
    }
    // Whatever happened, the step is over for the bucketer: handles not waited for are dropped
    // (their errors also reach the replica's next collective).
    for (auto& b : s.buckets) b.handle.reset();
    s.ctx = nullptr;
    if (first_error) std::rethrow_exception(first_error);
  }

  /// The buckets' sizes in elements (for tests and tuning).
  std::vector<std::size_t> bucket_elements() const {
    std::vector<std::size_t> out;
    for (const auto& b : state_->buckets) out.push_back(b.elements);
    return out;
  }

 private:
  struct Slot {
    at::Tensor param;
    std::size_t bucket = 0;
    std::size_t offset = 0;  // elements into the bucket
    bool ready = false;
  };
  struct Bucket {
    std::vector<std::size_t> slots;
    std::size_t elements = 0;
    c10::ScalarType wire = c10::kFloat;
    std::size_t ready = 0;
    bool started = false;
    at::Tensor data;
    std::optional<CollectiveHandle<at::Tensor>> handle;
  };
  // Shared with the hooks, which libtorch keeps on the parameters' gradient accumulators.
  struct State {
    BucketerOptions options;
    std::vector<Slot> slots;
    std::vector<Bucket> buckets;
    std::vector<std::shared_ptr< ::torch::autograd::Node>> accumulators;  // kept alive: they carry the hooks
    ReplicaContext* ctx = nullptr;  // armed between prepare() and finish()
    std::size_t next = 0;           // the first bucket not started
  };

  c10::ScalarType wire_dtype(c10::ScalarType param) const {
    const auto& wire = state_->options.wire;
    if (wire && at::isFloatingType(param)) return *wire;
    return param;
  }

  void layout(std::vector<at::Tensor> parameters) {
    State& s = *state_;
    const std::size_t n = parameters.size();
    s.slots.resize(n);
    Bucket current;
    std::size_t bytes = 0;
    auto close = [&] {
      if (current.slots.empty()) return;
      current.data = at::zeros({static_cast<std::int64_t>(current.elements)}, at::TensorOptions().dtype(current.wire));
      s.buckets.push_back(std::move(current));
      current = Bucket{};
      bytes = 0;
    };
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = n - 1 - k;  // reverse order: about the order backward produces them
      Slot& slot = s.slots[i];
      slot.param = parameters[i];
      const c10::ScalarType wire = wire_dtype(slot.param.scalar_type());
      if (!current.slots.empty() && current.wire != wire) close();
      current.wire = wire;
      slot.bucket = s.buckets.size();
      slot.offset = current.elements;
      current.slots.push_back(i);
      current.elements += static_cast<std::size_t>(slot.param.numel());
      bytes += static_cast<std::size_t>(slot.param.numel()) * c10::elementSize(wire);
      if (s.options.bytes_per_pack > 0 && bytes >= s.options.bytes_per_pack) close();
    }
    close();
  }

  void install_hooks() {
    std::weak_ptr<State> weak = state_;
    for (std::size_t i = 0; i < state_->slots.size(); ++i) {
      auto accumulator = ::torch::autograd::impl::grad_accumulator(state_->slots[i].param);
      if (!accumulator) throw InvalidArgument(fmt::format("GradientBucketer: parameter {} has no gradient accumulator", i));
      accumulator->add_post_hook(std::make_unique<::torch::autograd::utils::LambdaPostHook>(
          [weak, i](const ::torch::autograd::variable_list& outputs, const ::torch::autograd::variable_list&) {
            if (auto s = weak.lock()) on_gradient(*s, i);
            return outputs;
          }));
      state_->accumulators.push_back(std::move(accumulator));
    }
  }

  // After parameter i's gradient was accumulated into its .grad().
  static void on_gradient(State& s, std::size_t i) {
    if (!s.ctx) return;  // not prepared: an accumulation pass
    Slot& slot = s.slots[i];
    if (slot.ready) return;  // a second gradient in one pass (a parameter used twice) is already in .grad
    Bucket& b = s.buckets[slot.bucket];
    if (b.started) return;
    {
      at::NoGradGuard no_grad;
      fill(s, i);
    }
    slot.ready = true;
    ++b.ready;
    // Buckets start in order, so that every replica starts the same collectives in the same order.
    while (s.next < s.buckets.size() && s.buckets[s.next].ready == s.buckets[s.next].slots.size()) start(s, s.next++);
  }

  // Parameter i's .grad() (zeros where it has none) into its place in its bucket, in the wire dtype.
  static void fill(State& s, std::size_t i) {
    Slot& slot = s.slots[i];
    at::Tensor dst = s.buckets[slot.bucket].data.narrow(0, static_cast<std::int64_t>(slot.offset), slot.param.numel());
    const at::Tensor& grad = slot.param.grad();
    if (grad.defined()) {
      dst.copy_(grad.reshape({-1}));
    } else {
      dst.zero_();
    }
  }

  static void start(State& s, std::size_t k) {
    Bucket& b = s.buckets[k];
    if (b.started) return;
    b.started = true;
    b.handle.emplace(s.ctx->all_reduce_async(s.options.op, at::Tensor(b.data)));
  }

  std::shared_ptr<State> state_;
};

}  // namespace adapters::torch
DISTRIBUTE_END_NAMESPACE

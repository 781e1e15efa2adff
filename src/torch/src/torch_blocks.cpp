// Finding a sequence of blocks in a TorchScript forward graph (torch_blocks.h), and running
// it block by block. The graph of a saved module keeps each submodule call as a
// prim::CallMethod on a prim::GetAttr path from self, so the chain is read off the graph: no
// tracing, no sample input.
#include "torch_blocks.h"

#include <unordered_map>
#include <utility>

namespace ds::torch {

namespace {

namespace jit = ::torch::jit;

struct NotAChain {};  // thrown inside the analysis, caught by find_block_chain

// One forward graph read as: the calls of the chain, then the result step.
struct Scan {
  std::vector<BlockCall> calls;
  jit::Value* last = nullptr;     // the last call's output (forward's input before any call)
  jit::Value* targets = nullptr;  // forward's targets argument (the loss form)
  jit::Value* output = nullptr;   // what forward returns
  std::vector<jit::Node*> constants, rest;  // rest: the nodes after the calls
  std::shared_ptr<jit::Graph> graph;        // keeps the nodes alive
};

bool is_module(const jit::Value* v) {
  const auto cls = v->type()->cast<c10::ClassType>();
  return cls && cls->is_module();
}

std::string join(const std::string& path, const std::string& name) { return path.empty() ? name : path + "." + name; }

// A call of the chain: forward(previous output) or forward(previous output, targets).
bool is_chain_call(const jit::Node* n, const Scan& s, bool known_module) {
  const auto args = n->inputs();
  return known_module && n->s(c10::attr::name) == "forward" && n->outputs().size() == 1 &&
         n->output()->type()->kind() == c10::TypeKind::TensorType && (args.size() == 2 || args.size() == 3) &&
         args[1] == s.last && (args.size() == 2 || (s.targets && args[2] == s.targets));
}

Scan scan_forward(const jit::Module& module, const std::string& prefix) {
  Scan s;
  const auto method = module.find_method("forward");
  if (!method) throw NotAChain{};
  s.graph = method->graph();
  const auto inputs = s.graph->inputs();
  if (inputs.size() < 2 || inputs.size() > 3 || s.graph->outputs().size() != 1) throw NotAChain{};
  s.last = inputs[1];
  if (inputs.size() == 3) s.targets = inputs[2];
  s.output = s.graph->outputs()[0];
  std::unordered_map<const jit::Value*, std::pair<std::string, jit::Module>> modules{{inputs[0], {prefix, module}}};
  for (jit::Node* n : s.graph->nodes()) {
    if (n->kind() == c10::prim::Constant) {
      s.constants.push_back(n);
      continue;
    }
    const bool on_module = n->inputs().size() > 0 && modules.count(n->input(0)) > 0;
    if (s.rest.empty() && n->kind() == c10::prim::GetAttr && on_module && is_module(n->output())) {
      const auto& [path, parent] = modules.at(n->input(0));
      const std::string name = n->s(c10::attr::name);
      modules[n->output()] = {join(path, name), parent.attr(name).toModule()};
    } else if (s.rest.empty() && n->kind() == c10::prim::CallMethod && is_chain_call(n, s, on_module)) {
      const auto& [path, called] = modules.at(n->input(0));
      s.calls.push_back({path, called, n->inputs().size() == 3, kNoGroup});
      s.last = n->output();
    } else {
      s.rest.push_back(n);
    }
  }
  if (s.calls.empty()) throw NotAChain{};
  return s;
}

// A call whose module's own forward is a chain with nothing after it (nn.Sequential) is
// replaced by that chain's calls, recursively.
std::vector<BlockCall> split_calls(const std::vector<BlockCall>& calls) {
  std::vector<BlockCall> out;
  for (const BlockCall& c : calls) {
    try {
      const Scan inner = scan_forward(c.module, c.path);
      const bool pure = !c.with_targets && !inner.targets && inner.rest.empty() && inner.output == inner.last;
      if (!pure) throw NotAChain{};
      for (BlockCall& sub : split_calls(inner.calls)) out.push_back(std::move(sub));
    } catch (const NotAChain&) {
      out.push_back(c);
    }
  }
  return out;
}

// One group per call with parameters, in call order; they must tile named_parameters().
std::vector<ParamGroup> block_groups(std::vector<BlockCall>& calls, const std::vector<std::string>& names) {
  std::vector<ParamGroup> groups;
  std::size_t next = 0;
  for (BlockCall& c : calls) {
    const std::string prefix = c.path + ".";
    std::size_t count = 0;
    while (next + count < names.size() && names[next + count].rfind(prefix, 0) == 0) ++count;
    if (count == 0) {  // none here: it must have none at all (not ones elsewhere in the order)
      for (const auto& name : names)
        if (name.rfind(prefix, 0) == 0) throw NotAChain{};
      continue;
    }
    c.group = groups.size();
    groups.push_back({c.path, next, count});
    next += count;
  }
  if (next != names.size()) throw NotAChain{};  // parameters outside the blocks, or out of order
  return groups;
}

// forward's nodes after the calls as a function of (last output[, targets]); null when
// forward returns the last output itself. Anything else they use (self, an earlier output,
// the inputs) makes it not a chain.
std::shared_ptr<jit::GraphFunction> result_step(const Scan& s) {
  if (s.rest.empty() && s.output == s.last) return nullptr;
  auto g = std::make_shared<jit::Graph>();
  std::unordered_map<const jit::Value*, jit::Value*> env;
  env[s.last] = g->addInput("x")->setType(s.last->type());
  if (s.targets) env[s.targets] = g->addInput("targets")->setType(s.targets->type());
  const auto lookup = [&env](jit::Value* v) {
    const auto it = env.find(v);
    if (it == env.end()) throw NotAChain{};
    return it->second;
  };
  for (const auto* nodes : {&s.constants, &s.rest}) {
    for (jit::Node* n : *nodes) {
      jit::Node* copy = g->appendNode(g->createClone(n, lookup));
      for (std::size_t i = 0; i < n->outputs().size(); ++i) env[n->outputs()[i]] = copy->outputs()[i];
    }
  }
  g->registerOutput(lookup(s.output));
  return std::make_shared<jit::GraphFunction>(c10::QualifiedName("ds.block_chain_result"), g, nullptr);
}

}  // namespace

std::optional<BlockChain> find_block_chain(const jit::Module& root, bool loss_form,
                                           const std::vector<std::string>& param_names) {
  try {
    const Scan top = scan_forward(root, "");
    if (loss_form != (top.targets != nullptr)) throw NotAChain{};
    BlockChain chain;
    chain.calls = split_calls(top.calls);
    chain.groups = block_groups(chain.calls, param_names);
    chain.result = result_step(top);
    return chain;
  } catch (const NotAChain&) {
    return std::nullopt;
  }
}

at::Tensor run_block_chain(const BlockChain& chain, const at::Tensor& inputs, const at::Tensor& targets,
                           GroupHooks* hooks, const BlockRan& ran) {
  // The arguments of a call: x, and targets where it takes them.
  const auto arguments = [&targets](const at::Tensor& x, bool with_targets) {
    std::vector<c10::IValue> args;
    args.reserve(2);
    args.emplace_back(x);
    if (with_targets) args.emplace_back(targets);
    return args;
  };
  at::Tensor x = inputs;
  for (const BlockCall& c : chain.calls) {
    std::vector<c10::IValue> args = arguments(x, c.with_targets);
    jit::Module block = c.module;  // a handle: forward() is not const
    if (c.group == kNoGroup) {
      x = block.forward(std::move(args)).toTensor();
      continue;
    }
    {
      GroupUse use(hooks, c.group, Pass::Forward);
      x = block.forward(std::move(args)).toTensor();
    }
    if (ran) ran(c.group, x);
  }
  if (!chain.result) return x;
  return (*chain.result)(arguments(x, targets.defined())).toTensor();
}

}  // namespace ds::torch

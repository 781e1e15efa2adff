// PipeEngine (ds/pipe/pipe_engine.h): the grid's communicators, the stage and its engine
// (here), and the schedules' execution (pipe_execute.cpp).
#include "ds/pipe/pipe_engine.h"

#include <algorithm>
#include <sstream>

#include "ds/config/parse.h"
#include "ds/core/error.h"
#include "ds/core/log.h"
#include "ds/mpi/mpi_comm.h"
#include "ds/pipe/layer_weights.h"
#include "ds/pipe/schedule.h"
#include "pipe_impl.h"

namespace ds::pipe {

namespace {

}  // namespace

PipeEngine::PipeEngine(config::DsConfig cfg, const ModelFactory& make_model, MPI_Comm world, Module* initial_values)
    : world_comm_(std::make_shared<MpiComm>(world)), grid_(world_comm_->size(), cfg.pipeline.stages),
      impl_(std::make_unique<Impl>()) {
  coord_ = grid_.coord_of(world_comm_->rank());
  // The batch rule for the data-parallel size, with the errors naming what does not divide.
  config::resolve_batch_sizes(cfg, grid_.data_parallel_size());
  pipe_batch(grid_, cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps);
  impl_->micro_batches = int(cfg.gradient_accumulation_steps);

  // Partition the model's layers (from a probe instance: the stage's instances come after).
  std::unique_ptr<Module> probe = make_model();
  LayerSequence* seq = layer_sequence_of(*probe);
  DS_CHECK(seq != nullptr, cfg.source << ": pipeline.stages " << cfg.pipeline.stages
                                      << ": the model is not a layer sequence; pipeline parallelism splits the built-in "
                                         "gpt and llama (or a model implementing ds/core/layer_sequence.h)");
  const std::vector<ParamInfo> params = probe->parameters();
  const std::vector<LayerInfo> infos = layer_infos(*seq, params);
  for (const LayerInfo& l : infos) layer_names_.push_back(l.name);
  bounds_ = partition_layers(infos, grid_.stages(), PartitionMethod::parse(cfg.pipeline.partition_method));
  const std::vector<TiedWeight> tied = seq->tied_weights();
  impl_->bounds = bounds_;

  // One instance per pipe buffer of the train schedule (the inference schedule needs 2).
  const int buffers = std::max(train_schedule(impl_->micro_batches, grid_.stages(), coord_.stage).num_pipe_buffers,
                               inference_schedule(1, grid_.stages(), coord_.stage).num_pipe_buffers);
  std::vector<std::unique_ptr<Module>> instances;
  instances.push_back(std::move(probe));
  while (int(instances.size()) < buffers) instances.push_back(make_model());
  impl_->stage = std::make_unique<StageModule>(std::move(instances), std::size_t(bounds_[std::size_t(coord_.stage)]),
                                               std::size_t(bounds_[std::size_t(coord_.stage) + 1]));
  impl_->slots.resize(std::size_t(buffers));
  impl_->stage->set_initial_values(initial_values);

  // Communicators: the stage's data-parallel group, this rank's pipe (rank = stage), p2p on it.
  impl_->data_comm = world_comm_->split(coord_.stage, coord_.data);
  auto pipe_comm = world_comm_->split(coord_.data, coord_.stage);
  impl_->link = std::make_unique<PeerLink>(pipe_comm->mpi_comm());
  impl_->pipe_comm = std::move(pipe_comm);
  impl_->world_link = std::make_unique<PeerLink>(world);
  const std::vector<LayerSpec> specs = seq->layers();
  std::size_t param = 0, dense = 0;
  for (int s = 0; s < grid_.stages(); ++s) {
    impl_->stage_offsets.push_back(dense);
    const LayerSpec& last = specs[std::size_t(bounds_[std::size_t(s) + 1] - 1)];
    for (; param < last.first + last.count; ++param) dense += params[param].numel();
  }
  impl_->stage_offsets.push_back(dense);
  impl_->stage_id = coord_.stage;
  impl_->stages = grid_.stages();

  PipelineStage side{impl_->pipe_comm, coord_.stage, grid_.stages(), world_comm_, params, 0};
  for (std::size_t i = 0; i < impl_->stage->first_param(); ++i) side.dense_offset += params[i].numel();
  impl_->engine = std::make_unique<Engine>(cfg, *impl_->stage, impl_->data_comm, nullptr, nullptr, side);
  impl_->tied = std::make_unique<TiedSync>(tied, bounds_, coord_.stage, *impl_->stage, *impl_->link);
  impl_->stage->set_before_shared_ready([t = impl_->tied.get()](std::size_t i) { t->receive_gradients(i); });
  impl_->tied->sync_values();  // users start from the owner's initial values
  DS_INFO("pipeline: " << grid_.stages() << " stages x " << grid_.data_parallel_size() << " data-parallel, "
                       << describe_stages() << "; " << impl_->micro_batches
                       << " micro-batches per step");
}

PipeEngine::~PipeEngine() = default;

std::string PipeEngine::describe_stages() const {
  std::ostringstream os;
  for (std::size_t s = 0; s + 1 < bounds_.size(); ++s) {
    if (s > 0) os << " | ";
    os << "stage " << s << ": " << layer_names_[std::size_t(bounds_[s])];
    if (bounds_[s + 1] - bounds_[s] > 1) os << " .. " << layer_names_[std::size_t(bounds_[s + 1] - 1)];
  }
  return os.str();
}

Engine& PipeEngine::engine() const { return *impl_->engine; }

std::vector<float> PipeEngine::gather_model_fp32() const {
  constexpr int kTagWeights = 128;
  std::vector<float> stage = impl_->engine->gather_params_fp32();  // collective over the stage's group
  const std::vector<std::size_t>& at = impl_->stage_offsets;
  if (world_comm_->rank() != 0) {
    if (coord_.data == 0) impl_->world_link->isend(stage.data(), stage.size() * sizeof(float), 0, kTagWeights).wait();
    return {};
  }
  std::vector<float> whole(at.back());
  std::copy(stage.begin(), stage.end(), whole.begin());
  for (int s = 1; s < grid_.stages(); ++s)
    impl_->world_link->recv(whole.data() + at[std::size_t(s)], (at[std::size_t(s) + 1] - at[std::size_t(s)]) * sizeof(float),
                            grid_.rank_of({s, 0}), kTagWeights);
  return whole;
}

void PipeEngine::save_checkpoint(const std::string& save_dir, std::optional<std::string> tag,
                                 const io::StateValue& client_state) {
  impl_->engine->save_checkpoint(save_dir, std::move(tag), client_state);
}

std::optional<std::pair<std::string, io::StateValue>> PipeEngine::load_checkpoint(const std::string& load_dir,
                                                                                 std::optional<std::string> tag,
                                                                                 const LoadOptions& options) {
  auto loaded = impl_->engine->load_checkpoint(load_dir, std::move(tag), options);
  if (loaded) impl_->tied->sync_values();  // the users' copies of tied weights: the loaded values
  return loaded;
}

}  // namespace ds::pipe

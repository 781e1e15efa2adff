// Checks of --save_dir made before training starts, so that a directory that cannot take
// checkpoints fails the job at once, naming the path, instead of at the first save after
// all the training.
#pragma once

#include <cstdint>
#include <string>

namespace ds::train {

// Local (every rank, no communication): `dir` exists or can be created, is a directory (not
// a file, not a symlink to nowhere), and this process can create files in it (not read-only,
// permissions). Creates `dir` when missing, as the first save would. ds::Error naming it.
void check_save_dir(const std::string& dir);

// What the run will save: global_step<N> for every N in (start_step, total_steps] that is a
// multiple of save_interval (0: none), and global_step<total_steps>.
struct SavePlan {
  std::int64_t start_step = 0;
  std::int64_t total_steps = 0;
  std::int64_t save_interval = 0;
  std::uint64_t checkpoint_bytes = 0;  // expected size of one checkpoint on disk
};

// After a resume, before the first step: no tag the run will save exists in `dir` already
// (a save never overwrites one), and `dir` has room for one checkpoint. ds::Error naming the
// path, the tag or the sizes.
void check_save_plan(const std::string& dir, const SavePlan& plan);

// The 16-bit model save (stage3_gather_16bit_weights_on_model_save) writes `output`
// (<save_dir>/model.safetensors), replacing what is there: refused when that is a file
// --init_from reads -- the file itself, or a file in the --init_from directory -- compared by
// device and inode, so another spelling of the path or a hard link is caught too. ds::Error
// naming both paths.
void check_model_save_target(const std::string& output, const std::string& init_from);

}  // namespace ds::train

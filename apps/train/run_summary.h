// What rank 0 prints before the first step (model, data, batch) and after the last (the
// summary: throughput, final losses, memory).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ds/engine/engine.h"
#include "job.h"
#include "report.h"

namespace ds::train {

// `bf16_gemm_line`: the kernels.cpu_bf16_gemm line, or empty when it does not apply.
void print_run_header(const Job& j, const Engine& engine, int world_size, std::int64_t start_step,
                      const std::string& bf16_gemm_line);

// The losses the summary reports: the last few steps' train losses and the final validation loss.
struct FinalLosses {
  std::vector<double> recent_train;
  std::optional<double> validation;
};

// Collective (the peak resident memory is the largest over the ranks); rank 0 prints.
void print_summary(const Job& j, Engine& engine, const Reporter& rep, std::int64_t start_step,
                   const FinalLosses& losses, bool rank0);

}  // namespace ds::train

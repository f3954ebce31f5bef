// The step's assembly: one pipeline stage's step cost out of the framework recipes (megatron.h,
// hf.h), its layers, fixed memory, LM head and loss, collectives and host-link rates.
#include "planner/frameworks/step_cost.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "planner/cost/communication.h"
#include "planner/cost/pipeline_layout.h"
#include "planner/frameworks/hf.h"
#include "planner/frameworks/megatron.h"

namespace stowage::planner {
namespace {

double Rate(const HardwareProfile& hw, uint64_t chunk, bool d2h) {
  double rate = d2h ? hw.d2h_bytes_per_second : hw.h2d_bytes_per_second;
  // The table's entry for the largest chunk size not above `chunk` caps the rate.
  for (const ChunkBandwidth& c : hw.chunk_bandwidth) {
    if (c.chunk_bytes <= chunk) {
      rate = std::min(d2h ? hw.d2h_bytes_per_second : hw.h2d_bytes_per_second,
                      d2h ? c.d2h_bytes_per_second : c.h2d_bytes_per_second);
    }
  }
  return rate;
}

}  // namespace

absl::StatusOr<StepCost> BuildStepCost(const ModelConfig& m, const HardwareProfile& hw,
                                       const RunSettings& run, int stage) {
  if (absl::Status s = ValidateModel(m); !s.ok()) return s;
  if (absl::Status s = ValidateHardwareProfile(hw); !s.ok()) return s;
  if (absl::Status s = ValidateRun(m, run); !s.ok()) return s;
  // Note [Pipeline] (planner/search/pipeline.cc): this stage's layers, embedding on the first, head
  // on the last.
  if (absl::Status s = ValidatePipeline(m, run); !s.ok()) return s;
  if (stage < 0 || stage >= run.pp) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", stage, " is not a stage of --pp ", run.pp));
  }
  absl::StatusOr<std::vector<LayerRange>> split = VirtualStageLayers(m, run);
  if (!split.ok()) return split.status();
  const bool first_stage = stage == 0, last_stage = stage == run.pp - 1;
  StepCost c;
  c.stage = stage;
  c.chunks = StageChunks(*split, run.pp, run.vpp, stage);
  c.model = m.name;
  c.model_parameters = ModelParameters(m);
  c.run = run;
  c.mtp_layers = TrainedMtpLayers(m, run);
  c.model_mtp_layers = m.mtp_layers;
  c.hardware = hw;
  c.tokens_per_rank =
      run.seq_len * static_cast<uint64_t>(run.micro_batch) / static_cast<uint64_t>(run.cp);
  const double tokens = static_cast<double>(c.tokens_per_rank);
  const bool hf = run.framework == Framework::kHf;
  if (hf) {
    if (absl::Status s = ValidateHfRun(m, run); !s.ok()) return s;
  }
  for (size_t k = 0; k < c.chunks.size(); ++k) {
    const int in_flight =
        InFlightMicrobatches(run.schedule, run.pp, run.vpp, run.microbatches, stage, k);
    for (int i = c.chunks[k].first_layer; i < c.chunks[k].end(); ++i) {
      if (i >= m.num_layers()) {  // Note [MTP layers] in megatron.cc
        absl::StatusOr<LayerCost> mtp =
            BuildMegatronMtpLayer(m, hw, run, i - m.num_layers(), tokens);
        if (!mtp.ok()) return mtp.status();
        c.layers.push_back(*std::move(mtp));
      } else if (hf) {
        c.layers.push_back(BuildHfLayer(m, hw, run, i, tokens));
      } else {
        absl::StatusOr<LayerCost> layer = BuildMegatronLayer(m, hw, run, i, tokens);
        if (!layer.ok()) return layer.status();
        c.layers.push_back(*std::move(layer));
      }
      c.layers.back().in_flight_microbatches = in_flight;
    }
  }
  // Fixed memory, the LM head and loss and the embedding: the megatron recipe's, which the hf
  // recipe's adjust.
  if (absl::Status s = ApplyMegatronStep(m, hw, run, c); !s.ok()) return s;
  if (hf) ApplyHfStep(m, hw, run, c);
  if (!first_stage) c.embedding_seconds = 0, c.embedding_grad_bytes = 0;
  if (!last_stage) {
    c.tail_seconds = 0, c.tail_bytes = 0, c.tail_grad_bytes = 0, c.held_logits_bytes = 0;
  }
  if (hf) ApplyHfDataParallel(run, c);
  c.comm = BuildStepComm(m, hw, run, c.layers, stage);
  for (size_t i = 0; i < c.layers.size(); ++i) {
    c.layers[i].forward_comm_seconds = c.comm.layers[i].forward_exposed_seconds;
    c.layers[i].backward_comm_seconds = c.comm.layers[i].backward_exposed_seconds;
    c.layers[i].recompute_comm_seconds = c.comm.layers[i].recompute_exposed_seconds;
  }

  c.copy_chunk_bytes = 16ull << 20;
  // Every rank of a node runs this schedule, so each copy of this rank runs while the GPUs
  // sharing its host link copy too: the link's share is the rate (HardwareProfile::
  // SharedHostLinkRate).
  c.d2h_bytes_per_second = hw.SharedHostLinkRate(Rate(hw, c.copy_chunk_bytes, true));
  c.h2d_bytes_per_second = hw.SharedHostLinkRate(Rate(hw, c.copy_chunk_bytes, false));
  const double bidir_scale_d = hw.bidir_d2h_bytes_per_second / hw.d2h_bytes_per_second;
  const double bidir_scale_h = hw.bidir_h2d_bytes_per_second / hw.h2d_bytes_per_second;
  c.bidir_d2h_bytes_per_second = c.d2h_bytes_per_second * std::min(1.0, bidir_scale_d);
  c.bidir_h2d_bytes_per_second = c.h2d_bytes_per_second * std::min(1.0, bidir_scale_h);
  if (absl::Status s = CheckStepCostBounds(c); !s.ok()) return s;
  return c;
}

}  // namespace stowage::planner

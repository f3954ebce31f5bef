// The `pipeline` section of a layer profile: reader, writer and the run its stages plan under.
#include "planner/frameworks/profile_pipeline.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace stowage::planner {
namespace {

constexpr uint64_t kMaxBytes = uint64_t{1} << 56;  // as the rest of the profile reader

}  // namespace

absl::Status ReadProfileFixed(const json::Object& fixed, FixedMemory& out) {
  const json::Range<uint64_t> bytes{0, kMaxBytes};
  if (absl::Status s = fixed.Read("weights", out.weights, bytes); !s.ok()) return s;
  for (auto [key, field] : {std::pair<const char*, uint64_t*>{"gradients", &out.gradients},
                            {"optimizer", &out.optimizer},
                            {"other", &out.other}}) {
    if (absl::Status s = fixed.ReadOptional(key, *field, bytes); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<ProfilePipeline> ReadProfilePipeline(const json::Object& root, size_t num_layers) {
  auto o = root.Child("pipeline");
  if (!o.ok()) return o.status();
  if (absl::Status s = o->OnlyKeys({"pp", "vpp", "gpus", "stages"}); !s.ok()) return s;
  ProfilePipeline p;
  // A one-stage profile has no `pipeline`.
  if (absl::Status s = o->Read("pp", p.pp, {2, kPlanMaxPipelineStages}); !s.ok()) return s;
  if (absl::Status s = o->Read("vpp", p.vpp, {1, kPlanMaxVirtualStages}); !s.ok()) return s;
  p.gpus = p.pp;
  if (absl::Status s =
          o->ReadOptional("gpus", p.gpus, json::Range<int>{p.pp, kPlanMaxParallelSize});
      !s.ok())
    return s;
  if (p.gpus % p.pp != 0) {
    return o->Invalid("gpus", absl::StrCat("a multiple of pp (", p.pp,
                                           "): the job's ranks, pp stages of gpus / pp each"));
  }
  auto stages = o->Array("stages");
  if (!stages.ok()) return stages.status();
  if ((*stages)->size() != static_cast<size_t>(p.pp)) {
    return o->Invalid("stages", absl::StrCat("exactly pp (", p.pp, ") entries, one per stage; got ",
                                             (*stages)->size()));
  }
  const int n = static_cast<int>(num_layers);
  // Each chunk's object, for the coverage check's errors: [stage][chunk].
  std::vector<std::vector<json::Object>> chunk_objects(p.pp);
  for (int s = 0; s < p.pp; ++s) {
    const std::string path = absl::StrCat("pipeline.stages[", s, "]");
    auto stage = json::Object::Of((**stages)[s], root.source(), path);
    if (!stage.ok()) return stage.status();
    if (absl::Status st = stage->OnlyKeys({"stage", "chunks", "fixed_bytes", "model_parameters"});
        !st.ok())
      return st;
    ProfileStage ps;
    if (absl::Status st = stage->Read("stage", ps.stage, {s, s}); !st.ok()) return st;
    auto chunks = stage->Array("chunks");
    if (!chunks.ok()) return chunks.status();
    if ((*chunks)->size() != static_cast<size_t>(p.vpp)) {
      return stage->Invalid("chunks", absl::StrCat("exactly vpp (", p.vpp, ") model chunks; got ",
                                                   (*chunks)->size()));
    }
    for (int c = 0; c < p.vpp; ++c) {
      auto chunk =
          json::Object::Of((**chunks)[c], root.source(), absl::StrCat(path, ".chunks[", c, "]"));
      if (!chunk.ok()) return chunk.status();
      if (absl::Status st = chunk->OnlyKeys({"first_layer", "num_layers"}); !st.ok()) return st;
      LayerRange r;
      if (absl::Status st = chunk->Read("first_layer", r.first_layer, {0, n}); !st.ok()) return st;
      if (absl::Status st = chunk->Read("num_layers", r.num_layers, {0, n}); !st.ok()) return st;
      ps.chunks.push_back(r);
      chunk_objects[s].push_back(*chunk);
    }
    auto fixed = stage->Child("fixed_bytes");
    if (!fixed.ok()) return fixed.status();
    if (absl::Status st = ReadProfileFixed(*fixed, ps.fixed); !st.ok()) return st;
    if (absl::Status st = stage->ReadOptional("model_parameters", ps.model_parameters,
                                              json::Range<uint64_t>{0, kMaxBytes});
        !st.ok())
      return st;
    p.stages.push_back(std::move(ps));
  }
  // The virtual stages v = c x pp + s, in order, are contiguous and cover layers 0..n-1.
  int next = 0;
  const int virtual_stages = p.pp * p.vpp;
  for (int v = 0; v < virtual_stages; ++v) {
    const int s = v % p.pp, c = v / p.pp;
    const LayerRange& r = p.stages[s].chunks[c];
    if (r.first_layer != next) {
      return chunk_objects[s][c].Invalid(
          "first_layer", absl::StrCat(next, ": virtual stage ", v, " (chunk ", c, " of stage ", s,
                                      ") starts where virtual stage ", v - 1,
                                      " ends (the virtual stages in order cover layers 0 to ",
                                      n - 1, " exactly, without gap or overlap)"));
    }
    if (r.end() > n || (v == virtual_stages - 1 && r.end() != n)) {
      return chunk_objects[s][c].Invalid(
          "num_layers", absl::StrCat(n - next, ": the last virtual stage (", v,
                                     ") ends at the profile's last layer (layers has ", n, ")"));
    }
    next = r.end();
  }
  return p;
}

json::Json ProfilePipelineToJson(const ProfilePipeline& p) {
  json::Json stages = json::Json::array();
  for (const ProfileStage& s : p.stages) {
    json::Json chunks = json::Json::array();
    for (const LayerRange& r : s.chunks) {
      chunks.push_back({{"first_layer", r.first_layer}, {"num_layers", r.num_layers}});
    }
    json::Json stage = {{"stage", s.stage},
                        {"chunks", chunks},
                        {"fixed_bytes",
                         {{"weights", s.fixed.weights},
                          {"gradients", s.fixed.gradients},
                          {"optimizer", s.fixed.optimizer},
                          {"other", s.fixed.other}}}};
    if (s.model_parameters > 0) stage["model_parameters"] = s.model_parameters;
    stages.push_back(std::move(stage));
  }
  return {{"pp", p.pp}, {"vpp", p.vpp}, {"gpus", p.gpus}, {"stages", stages}};
}

absl::StatusOr<RunSettings> ProfileRunSettings(const std::optional<ProfilePipeline>& pipeline,
                                               int microbatches, std::string_view field) {
  RunSettings run;
  run.tp = run.cp = run.ep = 1;
  run.gpus = pipeline.has_value() ? pipeline->gpus : 1;
  run.pp = pipeline.has_value() ? pipeline->pp : 1;
  run.vpp = pipeline.has_value() ? pipeline->vpp : 1;
  run.schedule = run.vpp > 1 ? PipelineSchedule::kInterleaved : PipelineSchedule::k1F1B;
  run.microbatches = microbatches;
  const std::string name(field);
  if (microbatches < 1 || microbatches > kPlanMaxMicrobatches) {
    return absl::InvalidArgumentError(absl::StrCat(name, " is ", microbatches, "; allowed: 1 to ",
                                                   kPlanMaxMicrobatches,
                                                   " (microbatches per step)"));
  }
  // ValidatePipeline's rule (planner/cost/pipeline_layout.h): Megatron-Core's interleaved schedule
  // runs the microbatches in groups of pp.
  if (run.schedule == PipelineSchedule::kInterleaved && microbatches % run.pp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " is ", microbatches, "; allowed: a multiple of the profile's pipeline.pp (", run.pp,
        "): with pipeline.vpp ", run.vpp,
        " the interleaved schedule runs the microbatches in groups of pp"));
  }
  if (absl::Status s = CheckPipelineRun(run.schedule, run.pp, run.vpp, run.microbatches); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", s.message()));
  }
  return run;
}

}  // namespace stowage::planner

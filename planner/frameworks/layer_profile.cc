#include "planner/frameworks/layer_profile.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/checked_math.h"
#include "base/json_reader.h"
#include "planner/cost/run_settings.h"
#include "planner/frameworks/profile_pipeline.h"

namespace stowage::planner {
namespace {

// Note [Measured layers]
// A profile is what the Python layer measured running each layer alone (stowage.profile). The
// analytic cost model's terms map onto it as follows, so EvaluateOption, the simulator and the
// optimizer treat a measured layer exactly as a modelled one:
//  - saved: the measured saved tensors (the offload_saved rule: distinct, non-parameter), each
//    with the child module whose rerun regenerates it; a module's saved_bytes is the sum of
//    its tensors, its seconds the module's measured forward time. "input" is the layer's input
//    when the layer saves it.
//  - the layer's own bytes during its forward are its input plus forward_peak_bytes (measured
//    over what was allocated before, the input included there); the forward transient is what
//    that exceeds the saved tensors and the output by, on top of all of them (EvaluateOption's
//    FFN moment of the forward: its FFN transient sits on both parts' saved tensors, so a
//    rerun's forward, a recompute's and the keep forward read the same measured level).
//  - the backward is EvaluateOption's moments read off one measured step: its start (every saved
//    tensor, the output's and input's gradients, no weight gradient made: the FFN moment with
//    no FFN transient, ffn_peak_grad_bytes 0) and its measured peak. At that peak the backward
//    has released backward_peak_released_bytes of the saved tensors (the FFN part's place:
//    EvaluateOption's backward runs it first and does not count it at the attention moment, so
//    it becomes ffn_saved_bytes; measured layers are never chunked, so nothing divides it) and
//    made backward_peak_grad_bytes of its gradients (attn_peak_grad_bytes). The own bytes there
//    are backward_peak_bytes plus the input when the layer saved it (the input was counted in
//    "before"); the attention transient is what they exceed the saved tensors still held, the
//    output's gradient and the input's gradient by. Both transients are clamped at 0: a layer
//    that saves its own output would otherwise count it twice. A version-1 profile states
//    neither: nothing released and every gradient at the peak, as its figures were measured.
//  - checkpoint_held_bytes: what the layer's checkpoint holds beyond its input until its
//    backward ends when the layer is recomputed (Note [Recompute moment] in cost_model.cc; the
//    simulator holds it in the loss and above too, Note [Checkpoint-held inputs]: stowage.
//    hf_profile measures it as what the decoder hands the layer and frees by the forward's end);
//    checkpoint_held_group: layers of one group hold the same tensors, counted once (hf_profile:
//    layers handed the same ones share a group: a layer type's mask);
//    its forward_peak_bytes count it while the forward runs (transformers' masks: made before
//    the first layer, freed when the forward ends, so not in fixed_bytes.other).
//  - no FFN part: a measured layer is one unit, so chunking does not apply (chunk count 1) and
//    recompute reruns the whole forward (forward_seconds).
//  - the tail is the loss: its bytes are the last layer's output plus loss.peak_bytes (the
//    output is no layer's resident bytes once that layer's forward ends), its seconds
//    loss.seconds; there is no embedding. Of them, loss.held_logits_bytes stay to the step's
//    end (StepCost::held_logits_bytes: BackwardHeldBytes holds them through every layer's
//    backward and at the end, where the embedding's gradient is made).
//  - fixed memory counts in the peak (weights, gradients, optimizer state, the sample input), so
//    a GPU budget is the whole device as for a config.
// Layer 0's input is the sample input, also fixed memory: counting it again in layer 0 errs on
// the side of a higher peak, never a lower one.
//  - gradients_in_backward (eager PyTorch, stowage.hf_profile): no gradients in fixed memory;
//    loss.grad_bytes from the end of the loss, each layer's backward_peak_grad_bytes at its
//    backward's peak and all its grad_bytes from its backward's end (Note [Gradient timing] in
//    cost_model.cc), embedding.grad_bytes at the end (StepCost::gradients_in_backward).
//  - a time given as op work becomes OpSeconds(work, hardware) on the hardware planned for; a
//    profile without a link copies at the hardware's rates.

constexpr uint64_t kMaxBytes = uint64_t{1} << 56;  // 64 PiB: any larger is a unit mix-up
constexpr double kMaxSeconds = 1e6;
constexpr double kMaxRate = 1e15;

template <typename T>
json::Range<T> Upto(T max) {
  return {T{0}, max};
}

constexpr double kMaxWork = 1e24;  // FLOPs or bytes of one pass: far beyond any step

// The op work at `key` (an object of OpWork fields, each optional, 0 when absent).
absl::Status ReadWork(const json::Object& o, const std::string& key, OpWork& out) {
  auto w = o.Child(key);
  if (!w.ok()) return w.status();
  for (auto [name, field] : {std::pair<const char*, double*>{"gemm_flops", &out.gemm_flops},
                             {"fp32_gemm_flops", &out.fp32_gemm_flops},
                             {"attention_forward_flops", &out.attention_forward_flops},
                             {"attention_backward_flops", &out.attention_backward_flops},
                             {"grouped_gemm_flops", &out.grouped_gemm_flops},
                             {"torch_grouped_mm_flops", &out.torch_grouped_mm_flops},
                             {"tokens_per_expert", &out.tokens_per_expert},
                             {"elementwise_bytes", &out.elementwise_bytes},
                             {"kernels", &out.kernels}}) {
    if (absl::Status s = w->ReadOptional(name, *field, Upto(kMaxWork)); !s.ok()) return s;
  }
  if ((out.grouped_gemm_flops > 0 || out.torch_grouped_mm_flops > 0) &&
      !(out.tokens_per_expert > 0)) {
    return w->Invalid("tokens_per_expert",
                      "a number above 0 when grouped_gemm_flops or torch_grouped_mm_flops is "
                      "(the grouped GEMM rate depends on it)");
  }
  return absl::OkStatus();
}

// A time given as `<prefix>seconds` or as `<prefix>work`, exactly one of them.
absl::Status ReadTime(const json::Object& o, const std::string& prefix, double& seconds,
                      std::optional<OpWork>& work) {
  const std::string work_key = prefix + "work";
  if (!o.Has(work_key)) return o.Read(prefix + "seconds", seconds, Upto(kMaxSeconds));
  if (o.Has(prefix + "seconds")) {
    return o.Invalid(prefix + "seconds",
                     absl::StrCat("absent when '", work_key, "' gives the time as op work"));
  }
  work.emplace();
  return ReadWork(o, work_key, *work);
}

json::Json WorkToJson(const OpWork& w) {
  return {{"gemm_flops", w.gemm_flops},
          {"fp32_gemm_flops", w.fp32_gemm_flops},
          {"attention_forward_flops", w.attention_forward_flops},
          {"attention_backward_flops", w.attention_backward_flops},
          {"grouped_gemm_flops", w.grouped_gemm_flops},
          {"torch_grouped_mm_flops", w.torch_grouped_mm_flops},
          {"tokens_per_expert", w.tokens_per_expert},
          {"elementwise_bytes", w.elementwise_bytes},
          {"kernels", w.kernels}};
}

void WriteTime(json::Json& j, const std::string& prefix, double seconds,
               const std::optional<OpWork>& work) {
  if (work.has_value()) {
    j[prefix + "work"] = WorkToJson(*work);
  } else {
    j[prefix + "seconds"] = seconds;
  }
}

// A field schema version 2 added: refused in a version-1 profile (whose figures keep the
// meaning they had), optional from version 2 on; `out` keeps its default when absent.
absl::Status ReadAddedInVersion2(const json::Object& o, const std::string& key, int version,
                                 uint64_t& out) {
  if (version < 2 && o.Has(key)) {
    return o.Invalid(key, "absent in a schema_version 1 profile (schema_version 2 added it)");
  }
  return o.ReadOptional(key, out, Upto(kMaxBytes));
}

absl::Status ReadLayer(const json::Json& value, const std::string& source, int index, int version,
                       bool gradients_in_backward, ProfileLayer& out) {
  const std::string path = absl::StrCat("layers[", index, "]");
  auto layer = json::Object::Of(value, source, path);
  if (!layer.ok()) return layer.status();
  const json::Object& o = *layer;
  if (absl::Status s = o.Read("index", out.index, {index, index}); !s.ok()) return s;
  if (absl::Status s = o.Read("type", out.type); !s.ok()) return s;
  for (auto [key, field] : {std::pair<const char*, uint64_t*>{"input_bytes", &out.input_bytes},
                            {"output_bytes", &out.output_bytes},
                            {"forward_peak_bytes", &out.forward_peak_bytes},
                            {"backward_peak_bytes", &out.backward_peak_bytes}}) {
    if (absl::Status s = o.Read(key, *field, Upto(kMaxBytes)); !s.ok()) return s;
  }
  if (absl::Status s = ReadTime(o, "forward_", out.forward_seconds, out.forward_work); !s.ok())
    return s;
  if (absl::Status s = ReadTime(o, "backward_", out.backward_seconds, out.backward_work); !s.ok())
    return s;
  if (absl::Status s = o.ReadOptional("grad_bytes", out.grad_bytes, Upto(kMaxBytes)); !s.ok())
    return s;
  if (out.grad_bytes > 0 && !gradients_in_backward) {
    return o.Invalid("grad_bytes",
                     "0 unless the profile's gradients_in_backward is true (otherwise the "
                     "gradients are fixed_bytes.gradients)");
  }
  // Absent: every gradient at the peak (backward_peak_bytes net of all of them), as in version 1.
  out.backward_peak_grad_bytes = out.grad_bytes;
  if (absl::Status s =
          ReadAddedInVersion2(o, "backward_peak_grad_bytes", version, out.backward_peak_grad_bytes);
      !s.ok())
    return s;
  if (out.backward_peak_grad_bytes > out.grad_bytes) {
    return o.Invalid("backward_peak_grad_bytes",
                     absl::StrCat("at most the layer's grad_bytes (", out.grad_bytes,
                                  "): the gradients its backward has made by its peak"));
  }
  if (absl::Status s = ReadAddedInVersion2(o, "backward_peak_released_bytes", version,
                                           out.backward_peak_released_bytes);
      !s.ok())
    return s;
  if (absl::Status s =
          ReadAddedInVersion2(o, "checkpoint_held_bytes", version, out.checkpoint_held_bytes);
      !s.ok())
    return s;
  if (version < 2 && o.Has("checkpoint_held_group")) {
    return o.Invalid("checkpoint_held_group",
                     "absent in a schema_version 1 profile (schema_version 2 added it)");
  }
  // A group per kind of shared input a checkpoint holds: no more groups than layers (100000).
  if (absl::Status s = o.ReadOptional("checkpoint_held_group", out.checkpoint_held_group,
                                      json::Range<int>{0, 100000});
      !s.ok())
    return s;

  if (o.Has("modules")) {
    auto modules = o.Array("modules");
    if (!modules.ok()) return modules.status();
    if ((*modules)->size() > static_cast<size_t>(kMaxProfileModules)) {
      return o.Invalid("modules", absl::StrCat("at most ", kMaxProfileModules,
                                               " modules (selective recompute tries every "
                                               "subset); list the ones that save the most"));
    }
    std::set<std::string> names;
    for (size_t m = 0; m < (*modules)->size(); ++m) {
      auto module =
          json::Object::Of((**modules)[m], source, absl::StrCat(path, ".modules[", m, "]"));
      if (!module.ok()) return module.status();
      ProfileModule pm;
      if (absl::Status s = module->Read("name", pm.name); !s.ok()) return s;
      if (pm.name.empty() || !names.insert(pm.name).second) {
        return module->Invalid("name", "a non-empty name, unique within the layer");
      }
      if (absl::Status s = ReadTime(*module, "", pm.seconds, pm.work); !s.ok()) return s;
      out.modules.push_back(std::move(pm));
    }
  }

  auto saved = o.Array("saved");
  if (!saved.ok()) return saved.status();
  std::set<std::string> tensor_names;
  uint64_t total = 0;
  for (size_t t = 0; t < (*saved)->size(); ++t) {
    auto tensor = json::Object::Of((**saved)[t], source, absl::StrCat(path, ".saved[", t, "]"));
    if (!tensor.ok()) return tensor.status();
    ProfileSavedTensor st;
    if (absl::Status s = tensor->Read("name", st.name); !s.ok()) return s;
    if (st.name.empty() || !tensor_names.insert(st.name).second) {
      return tensor->Invalid("name", "a non-empty name, unique within the layer");
    }
    if (absl::Status s = tensor->Read("bytes", st.bytes, Upto(kMaxBytes)); !s.ok()) return s;
    if (absl::Status s = tensor->ReadOptional("module", st.module); !s.ok()) return s;
    if (!st.module.empty() &&
        std::none_of(out.modules.begin(), out.modules.end(),
                     [&](const ProfileModule& m) { return m.name == st.module; })) {
      return tensor->Invalid("module",
                             absl::StrCat("\"\" or one of the names in ", path, ".modules"));
    }
    if (st.name == "input" && st.bytes != out.input_bytes) {
      return tensor->Invalid("bytes", absl::StrCat("the layer's input_bytes (", out.input_bytes,
                                                   ") for the tensor named \"input\""));
    }
    auto sum = CheckedAdd(total, st.bytes);
    if (!sum.has_value() || *sum > kMaxBytes) {
      return tensor->Invalid("bytes", "a total over the layer's saved tensors of at most 2^56");
    }
    total = *sum;
    out.saved.push_back(std::move(st));
  }
  if (out.backward_peak_released_bytes > total) {
    return o.Invalid("backward_peak_released_bytes",
                     absl::StrCat("at most the layer's saved bytes (", total,
                                  "): those its backward has released by its peak"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LayerProfileSet> ParseProfileJson(std::string_view text, std::string_view source) {
  const std::string src(source);
  auto parsed = json::Parse(text, source);
  if (!parsed.ok()) return parsed.status();
  auto root = json::Object::Of(*parsed, src);
  if (!root.ok()) return root.status();
  const json::Object& o = *root;
  LayerProfileSet p;
  std::string format;
  if (absl::Status s = o.Read("format", format); !s.ok()) return s;
  if (format != kProfileFormat) {
    return o.Invalid("format", absl::StrCat("\"", kProfileFormat, "\""));
  }
  if (absl::Status s = o.Read("schema_version", p.schema_version,
                              {kOldestProfileSchemaVersion, kProfileSchemaVersion});
      !s.ok())
    return s;
  if (absl::Status s = o.ReadOptional("generator", p.generator); !s.ok()) return s;
  if (absl::Status s = o.ReadOptional("device", p.device); !s.ok()) return s;
  if (absl::Status s = o.Read("measured_memory", p.measured_memory); !s.ok()) return s;
  if (absl::Status s = o.Read("tokens", p.tokens, {1, kMaxBytes}); !s.ok()) return s;
  if (o.Has("framework")) {
    std::string name;
    if (absl::Status s = o.Read("framework", name); !s.ok()) return s;
    auto f = ParseFramework(name);
    if (!f.ok())
      return o.Invalid("framework", "\"megatron\" or \"hf\" (whose code the layers ran)");
    p.framework = *f;
  }
  if (o.Has("optimizer")) {
    std::string name;
    if (absl::Status s = o.Read("optimizer", name); !s.ok()) return s;
    auto k = ParseOptimizerKind(name);
    if (!k.ok()) return o.Invalid("optimizer", "\"adam\", \"sgd\" or \"none\"");
    p.optimizer = *k;
  }
  if (o.Has("grad_dtype")) {
    std::string name;
    if (absl::Status s = o.Read("grad_dtype", name); !s.ok()) return s;
    if (name != "bf16" && name != "fp32") return o.Invalid("grad_dtype", "\"bf16\" or \"fp32\"");
    p.grad_bytes = name == "bf16" ? 2 : 4;
  }
  if (absl::Status s = o.ReadOptional("model_parameters", p.model_parameters, Upto(kMaxBytes));
      !s.ok())
    return s;

  auto fixed = o.Child("fixed_bytes");
  if (!fixed.ok()) return fixed.status();
  if (absl::Status s = ReadProfileFixed(*fixed, p.fixed); !s.ok()) return s;

  auto loss = o.Child("loss");
  if (!loss.ok()) return loss.status();
  if (absl::Status s = loss->Read("peak_bytes", p.loss_peak_bytes, Upto(kMaxBytes)); !s.ok())
    return s;
  if (absl::Status s = ReadTime(*loss, "", p.loss_seconds, p.loss_work); !s.ok()) return s;
  if (absl::Status s =
          ReadAddedInVersion2(*loss, "held_logits_bytes", p.schema_version, p.held_logits_bytes);
      !s.ok())
    return s;
  if (p.held_logits_bytes > p.loss_peak_bytes) {
    return loss->Invalid("held_logits_bytes",
                         absl::StrCat("at most loss.peak_bytes (", p.loss_peak_bytes,
                                      "): the part of the loss's bytes the caller holds"));
  }
  if (absl::Status s = o.ReadOptional("gradients_in_backward", p.gradients_in_backward); !s.ok())
    return s;
  if (absl::Status s = loss->ReadOptional("grad_bytes", p.loss_grad_bytes, Upto(kMaxBytes));
      !s.ok())
    return s;
  if (o.Has("embedding")) {
    auto embedding = o.Child("embedding");
    if (!embedding.ok()) return embedding.status();
    if (absl::Status s =
            embedding->ReadOptional("grad_bytes", p.embedding_grad_bytes, Upto(kMaxBytes));
        !s.ok())
      return s;
    if (absl::Status s = ReadTime(*embedding, "", p.embedding_seconds, p.embedding_work); !s.ok())
      return s;
  }
  if (!p.gradients_in_backward && (p.loss_grad_bytes > 0 || p.embedding_grad_bytes > 0)) {
    return o.Invalid("gradients_in_backward",
                     "true when loss.grad_bytes or embedding.grad_bytes is given (gradients "
                     "created in backward)");
  }

  // A profile measured off the GPU (stowage.hf_profile) has no link: the hardware's rates apply.
  p.has_link = o.Has("link");
  auto link = p.has_link ? o.Child("link") : absl::StatusOr<json::Object>(o);
  if (!link.ok()) return link.status();
  if (p.has_link) {
    const json::Range<double> rate{1, kMaxRate};
    if (absl::Status s = link->Read("d2h_bytes_per_second", p.d2h_bytes_per_second, rate); !s.ok())
      return s;
    if (absl::Status s = link->Read("h2d_bytes_per_second", p.h2d_bytes_per_second, rate); !s.ok())
      return s;
    p.bidir_d2h_bytes_per_second = p.d2h_bytes_per_second;
    p.bidir_h2d_bytes_per_second = p.h2d_bytes_per_second;
    if (absl::Status s =
            link->ReadOptional("bidir_d2h_bytes_per_second", p.bidir_d2h_bytes_per_second, rate);
        !s.ok())
      return s;
    if (absl::Status s =
            link->ReadOptional("bidir_h2d_bytes_per_second", p.bidir_h2d_bytes_per_second, rate);
        !s.ok())
      return s;
    if (absl::Status s = link->ReadOptional("copy_chunk_bytes", p.copy_chunk_bytes,
                                            json::Range<uint64_t>{1, uint64_t{1} << 40});
        !s.ok())
      return s;
  }

  auto layers = o.Array("layers");
  if (!layers.ok()) return layers.status();
  if ((*layers)->empty()) return o.Invalid("layers", "at least one layer");
  if ((*layers)->size() > 100000) return o.Invalid("layers", "at most 100000 layers");
  for (size_t i = 0; i < (*layers)->size(); ++i) {
    ProfileLayer layer;
    if (absl::Status s = ReadLayer((**layers)[i], src, static_cast<int>(i), p.schema_version,
                                   p.gradients_in_backward, layer);
        !s.ok())
      return s;
    p.layers.push_back(std::move(layer));
  }
  if (o.Has("pipeline")) {
    if (p.schema_version < 3) {
      return o.Invalid("pipeline", absl::StrCat("absent in a schema_version ", p.schema_version,
                                                " profile (schema_version 3 added it)"));
    }
    auto pipeline = ReadProfilePipeline(o, p.layers.size());
    if (!pipeline.ok()) return pipeline.status();
    p.pipeline = *std::move(pipeline);
  }
  // Every byte figure of the step together stays far inside the simulator's 64-bit sums.
  uint64_t total = 0;
  bool overflow = false;
  auto add = [&](uint64_t bytes) {
    auto sum = CheckedAdd(total, bytes);
    overflow |= !sum.has_value() || *sum > kMaxBytes;
    if (!overflow) total = *sum;
  };
  for (uint64_t b : {p.fixed.weights, p.fixed.gradients, p.fixed.optimizer, p.fixed.other,
                     p.loss_peak_bytes, p.loss_grad_bytes, p.embedding_grad_bytes}) {
    add(b);
  }
  if (p.pipeline.has_value()) {
    for (const ProfileStage& st : p.pipeline->stages) {
      for (uint64_t b : {st.fixed.weights, st.fixed.gradients, st.fixed.optimizer, st.fixed.other})
        add(b);
    }
  }
  for (const ProfileLayer& l : p.layers) {
    for (uint64_t b : {l.input_bytes, l.output_bytes, l.forward_peak_bytes, l.backward_peak_bytes,
                       l.grad_bytes, l.checkpoint_held_bytes})
      add(b);
    for (const ProfileSavedTensor& t : l.saved) add(t.bytes);
  }
  if (overflow) {
    return o.Invalid("layers",
                     "byte figures (fixed, loss and every layer's) that sum to at most "
                     "2^56 (64 PiB)");
  }
  return p;
}

absl::StatusOr<LayerProfileSet> ReadProfileFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("layer profile '", path, "' cannot be read"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseProfileJson(text.str(), absl::StrCat("layer profile ", path));
}

std::string ProfileToJson(const LayerProfileSet& p) {
  json::Json j;
  j["format"] = kProfileFormat;
  j["schema_version"] = kProfileSchemaVersion;  // written in the current format
  j["generator"] = p.generator;
  j["device"] = p.device;
  j["measured_memory"] = p.measured_memory;
  j["tokens"] = p.tokens;
  if (p.framework.has_value()) j["framework"] = FrameworkName(*p.framework);
  if (p.optimizer.has_value()) j["optimizer"] = OptimizerKindName(*p.optimizer);
  if (p.grad_bytes > 0) j["grad_dtype"] = p.grad_bytes == 2 ? "bf16" : "fp32";
  if (p.model_parameters > 0) j["model_parameters"] = p.model_parameters;
  j["fixed_bytes"] = {{"weights", p.fixed.weights},
                      {"gradients", p.fixed.gradients},
                      {"optimizer", p.fixed.optimizer},
                      {"other", p.fixed.other}};
  j["loss"] = {{"peak_bytes", p.loss_peak_bytes}};
  WriteTime(j["loss"], "", p.loss_seconds, p.loss_work);
  j["loss"]["held_logits_bytes"] = p.held_logits_bytes;
  if (p.gradients_in_backward) {
    j["gradients_in_backward"] = true;
    j["loss"]["grad_bytes"] = p.loss_grad_bytes;
  }
  if (p.gradients_in_backward || p.embedding_seconds > 0 || p.embedding_work.has_value()) {
    j["embedding"] = {{"grad_bytes", p.embedding_grad_bytes}};
    WriteTime(j["embedding"], "", p.embedding_seconds, p.embedding_work);
  }
  if (p.has_link) {
    j["link"] = {{"d2h_bytes_per_second", p.d2h_bytes_per_second},
                 {"h2d_bytes_per_second", p.h2d_bytes_per_second}};
    // 0 (not measured) is written as absent, which the reader takes as the one-way rate.
    if (p.bidir_d2h_bytes_per_second > 0) {
      j["link"]["bidir_d2h_bytes_per_second"] = p.bidir_d2h_bytes_per_second;
    }
    if (p.bidir_h2d_bytes_per_second > 0) {
      j["link"]["bidir_h2d_bytes_per_second"] = p.bidir_h2d_bytes_per_second;
    }
    j["link"]["copy_chunk_bytes"] = p.copy_chunk_bytes;
  }
  json::Json layers = json::Json::array();
  for (const ProfileLayer& l : p.layers) {
    json::Json saved = json::Json::array();
    for (const ProfileSavedTensor& t : l.saved) {
      saved.push_back({{"name", t.name}, {"bytes", t.bytes}, {"module", t.module}});
    }
    json::Json modules = json::Json::array();
    for (const ProfileModule& m : l.modules) {
      json::Json module = {{"name", m.name}};
      WriteTime(module, "", m.seconds, m.work);
      modules.push_back(std::move(module));
    }
    json::Json layer = {{"index", l.index},
                        {"type", l.type},
                        {"input_bytes", l.input_bytes},
                        {"output_bytes", l.output_bytes},
                        {"forward_peak_bytes", l.forward_peak_bytes},
                        {"backward_peak_bytes", l.backward_peak_bytes}};
    WriteTime(layer, "forward_", l.forward_seconds, l.forward_work);
    WriteTime(layer, "backward_", l.backward_seconds, l.backward_work);
    if (p.gradients_in_backward) {
      layer["grad_bytes"] = l.grad_bytes;
      layer["backward_peak_grad_bytes"] = l.backward_peak_grad_bytes;
    }
    layer["backward_peak_released_bytes"] = l.backward_peak_released_bytes;
    layer["checkpoint_held_bytes"] = l.checkpoint_held_bytes;
    layer["checkpoint_held_group"] = l.checkpoint_held_group;
    layer["modules"] = modules;
    layer["saved"] = saved;
    layers.push_back(std::move(layer));
  }
  j["layers"] = layers;
  if (p.pipeline.has_value()) j["pipeline"] = ProfilePipelineToJson(*p.pipeline);
  return j.dump(2) + "\n";
}

HardwareProfile HardwareForProfile(const LayerProfileSet& profile) {
  HardwareProfile hw;
  hw.name = profile.device.empty() ? "profiled device" : profile.device;
  hw.source = profile.measured_memory ? "measured" : "estimated";
  hw.d2h_bytes_per_second = profile.d2h_bytes_per_second;
  hw.h2d_bytes_per_second = profile.h2d_bytes_per_second;
  hw.bidir_d2h_bytes_per_second = profile.bidir_d2h_bytes_per_second;
  hw.bidir_h2d_bytes_per_second = profile.bidir_h2d_bytes_per_second;
  hw.host_bytes_per_numa_node = 0;  // unknown
  hw.gpus_per_numa_node = 1;
  return hw;
}

namespace {

double Seconds(double measured, const std::optional<OpWork>& work, const HardwareProfile& hw) {
  return work.has_value() ? OpSeconds(*work, hw) : measured;
}

// Note [Measured layers]: one measured layer as the cost model's terms.
LayerCost MeasuredLayerCost(const ProfileLayer& pl, const HardwareProfile& hardware) {
  auto sat = [](uint64_t a, uint64_t b) { return a > b ? a - b : 0; };
  LayerCost l;
  l.ffn_chunkable = false;  // measured as it ran: unchunked
  l.index = pl.index;
  l.type = pl.type;
  l.input_bytes = pl.input_bytes;
  l.output_bytes = pl.output_bytes;
  for (const ProfileSavedTensor& t : pl.saved) {
    l.saved.push_back({t.name, t.module, t.bytes});
    l.saved_bytes += t.bytes;
  }
  for (const ProfileModule& m : pl.modules) {
    RecomputeModule rm{m.name, 0, Seconds(m.seconds, m.work, hardware), false};
    for (const ProfileSavedTensor& t : pl.saved) {
      if (t.module == m.name) rm.saved_bytes += t.bytes;
    }
    // A module that regenerates nothing is never worth rerunning.
    if (rm.saved_bytes > 0) l.modules.push_back(rm);
  }
  // The layer's own bytes, split into the terms EvaluateOption adds.
  const uint64_t own_forward = pl.input_bytes + pl.forward_peak_bytes;
  const uint64_t own_backward = pl.backward_peak_bytes + (SavesInput(l) ? pl.input_bytes : 0);
  l.ffn_forward_transient = sat(own_forward, l.saved_bytes + l.output_bytes);
  l.ffn_saved_bytes = pl.backward_peak_released_bytes;
  l.attn_backward_transient =
      sat(own_backward, l.saved_bytes - l.ffn_saved_bytes + l.output_bytes + l.input_bytes);
  l.forward_seconds = Seconds(pl.forward_seconds, pl.forward_work, hardware);
  l.backward_seconds = Seconds(pl.backward_seconds, pl.backward_work, hardware);
  l.grad_bytes = pl.grad_bytes;
  l.attn_peak_grad_bytes = pl.backward_peak_grad_bytes;
  l.ffn_peak_grad_bytes = 0;  // the backward's start: none made yet
  l.checkpoint_held_bytes = pl.checkpoint_held_bytes;
  l.checkpoint_held_group = pl.checkpoint_held_group;
  return l;
}

}  // namespace

// Note [Pipelined profiles]
// A profile measured on every stage of a Megatron-Core pipeline (stowage.megatron.profile on
// every rank) lists every layer in global order, each measured on the rank that runs it, and in
// `pipeline` where each ran: stage s holds chunks c = 0..vpp-1, virtual stage c x pp + s (Note
// [Pipeline stages] in stowage/plan.h), and its own fixed memory. A stage's step cost is what
// BuildStepCost makes of a model's stage (planner/frameworks/step_cost.h), from the measured
// terms: the stage's layers in chunk order with their global indices, each holding its chunk's
// InFlightMicrobatches, the stage's fixed_bytes (the profile's top-level ones are the whole
// model's and are not planned with), the embedding's time and gradients on stage 0, the loss
// (tail bytes: the last layer's output plus loss.peak_bytes; its time, held logits and gradients)
// on the last. The schedule is Megatron-Core's choice for vpp (interleaved when vpp > 1, else
// 1F1B); tp, cp and ep are 1, since a rank's measurement is already its shards, and nothing is
// charged for collectives (StepCost::comm stays empty, as for a one-stage profile). The messages
// between stages are the hidden states a virtual stage receives (ProfileMessageBytes).
absl::StatusOr<StepCost> BuildStageStepCostFromProfile(const LayerProfileSet& p,
                                                       const HardwareProfile& hardware,
                                                       const RunSettings& run, int stage) {
  if (p.layers.empty()) {
    return absl::InvalidArgumentError(
        "layer profile: field 'layers' is empty; allowed: at "
        "least one layer");
  }
  const bool pipelined = run.pp > 1;
  if (pipelined &&
      (!p.pipeline.has_value() || p.pipeline->pp != run.pp || p.pipeline->vpp != run.vpp ||
       p.pipeline->stages.size() != static_cast<size_t>(run.pp))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer profile: run pp ", run.pp, " x vpp ", run.vpp,
        " is not the pipeline the profile was measured on (",
        p.pipeline.has_value() ? absl::StrCat("pp ", p.pipeline->pp, " x vpp ", p.pipeline->vpp)
                               : std::string("one stage"),
        "); allowed: the profile's own (ProfileRunSettings)"));
  }
  if (stage < 0 || stage >= run.pp) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer profile: stage ", stage, " is not a stage of pp ", run.pp));
  }
  const int n = static_cast<int>(p.layers.size());
  const ProfileStage* own = pipelined ? &p.pipeline->stages[stage] : nullptr;
  const bool first_stage = stage == 0, last_stage = stage == run.pp - 1;
  // Op work becomes seconds on the hardware planned for, by the one time model (op_time.h).
  bool has_work = p.loss_work.has_value() || p.embedding_work.has_value();
  for (const ProfileLayer& pl : p.layers) {
    has_work |= pl.forward_work.has_value() || pl.backward_work.has_value();
    for (const ProfileModule& m : pl.modules) has_work |= m.work.has_value();
  }
  if (has_work && !(hardware.dense_bf16_flops > 0 && hardware.hbm_bytes_per_second > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer profile: its times are op work (measured off the GPU) and hardware '", hardware.name,
        "' has no compute rates (dense_bf16_flops, hbm_bytes_per_second); allowed: a hardware "
        "profile with them (--hardware)"));
  }
  StepCost c;
  c.stage = stage;
  c.chunks = pipelined ? own->chunks : std::vector<LayerRange>{{0, n}};
  c.model = absl::StrCat(p.layers.size(), " x ", p.layers.front().type);
  c.hardware = hardware;
  c.hardware.source = p.measured_memory ? "measured" : "estimated";
  c.run.seq_len = p.tokens;
  c.run.micro_batch = 1;
  c.run.tp = c.run.cp = c.run.ep = 1;
  c.run.gpus = run.gpus;
  c.run.pp = run.pp;
  c.run.vpp = run.vpp;
  c.run.schedule = run.schedule;
  c.run.microbatches = run.microbatches;
  c.run.sharding = Sharding::kNoShard;
  c.tokens_per_rank = p.tokens;
  c.fixed = pipelined ? own->fixed : p.fixed;
  // What ran, as the profile states it (the summary and the plan's run.framework report it).
  const uint64_t parameters =
      own != nullptr && own->model_parameters > 0 ? own->model_parameters : p.model_parameters;
  c.profile = StepCost::ProfileStated{.framework = p.framework.has_value(),
                                      .optimizer = p.optimizer.has_value(),
                                      .grad_dtype = p.grad_bytes > 0,
                                      .parameters = parameters > 0};
  if (p.framework.has_value()) c.run.framework = *p.framework;
  if (p.optimizer.has_value()) c.run.optimizer = *p.optimizer;
  if (p.grad_bytes > 0) c.run.grad_bytes = p.grad_bytes;
  c.model_parameters = parameters;
  for (size_t k = 0; k < c.chunks.size(); ++k) {
    const int in_flight = InFlightMicrobatches(run.schedule, run.pp, run.vpp, run.microbatches,
                                               stage, static_cast<int>(k));
    // The reader's checks hold the chunks to the layers; a profile built in code is held too.
    for (int i = std::max(0, c.chunks[k].first_layer); i < c.chunks[k].end() && i < n; ++i) {
      LayerCost l = MeasuredLayerCost(p.layers[i], hardware);
      l.index = i;  // the global layer index, as BuildStepCost's
      l.in_flight_microbatches = in_flight;
      c.layers.push_back(std::move(l));
    }
  }
  c.gradients_in_backward = p.gradients_in_backward;
  if (last_stage) {
    c.tail_bytes = p.layers.back().output_bytes + p.loss_peak_bytes;
    c.held_logits_bytes = p.held_logits_bytes;
    c.tail_seconds = Seconds(p.loss_seconds, p.loss_work, hardware);
    c.tail_grad_bytes = p.loss_grad_bytes;
  }
  if (first_stage) {
    c.embedding_seconds = Seconds(p.embedding_seconds, p.embedding_work, hardware);
    c.embedding_grad_bytes = p.embedding_grad_bytes;
  }
  if (p.has_link) {
    c.copy_chunk_bytes = p.copy_chunk_bytes;
    c.d2h_bytes_per_second = p.d2h_bytes_per_second;
    c.h2d_bytes_per_second = p.h2d_bytes_per_second;
    c.bidir_d2h_bytes_per_second = std::min(p.bidir_d2h_bytes_per_second, p.d2h_bytes_per_second);
    c.bidir_h2d_bytes_per_second = std::min(p.bidir_h2d_bytes_per_second, p.h2d_bytes_per_second);
  } else {
    if (!(hardware.d2h_bytes_per_second > 0) || !(hardware.h2d_bytes_per_second > 0)) {
      return absl::InvalidArgumentError(
          "layer profile: field 'link' is absent (measured off the GPU) and the hardware "
          "profile has no copy rates; allowed: a profile with 'link', or a hardware profile "
          "(--hardware) with d2h and h2d rates");
    }
    c.d2h_bytes_per_second = hardware.d2h_bytes_per_second;
    c.h2d_bytes_per_second = hardware.h2d_bytes_per_second;
    const double bidir_d2h = hardware.bidir_d2h_bytes_per_second > 0
                                 ? hardware.bidir_d2h_bytes_per_second
                                 : hardware.d2h_bytes_per_second;
    const double bidir_h2d = hardware.bidir_h2d_bytes_per_second > 0
                                 ? hardware.bidir_h2d_bytes_per_second
                                 : hardware.h2d_bytes_per_second;
    c.bidir_d2h_bytes_per_second = std::min(bidir_d2h, c.d2h_bytes_per_second);
    c.bidir_h2d_bytes_per_second = std::min(bidir_h2d, c.h2d_bytes_per_second);
  }
  // What the simulator and optimizer assume of any step (README "Limits"): the sums above are
  // rechecked there, so a profile whose sizes wrap is refused rather than planned.
  if (absl::Status s = CheckStepCostBounds(c); !s.ok()) return s;
  return c;
}

absl::StatusOr<std::vector<StepCost>> BuildStageStepCostsFromProfile(const LayerProfileSet& p,
                                                                     const HardwareProfile& hw,
                                                                     const RunSettings& run) {
  std::vector<StepCost> stages;
  for (int s = 0; s < run.pp; ++s) {
    absl::StatusOr<StepCost> step = BuildStageStepCostFromProfile(p, hw, run, s);
    if (!step.ok()) return step.status();
    stages.push_back(*std::move(step));
  }
  return stages;
}

absl::StatusOr<StepCost> BuildStepCostFromProfile(const LayerProfileSet& p,
                                                  const HardwareProfile& hardware) {
  // One stage of every layer, one microbatch.
  absl::StatusOr<RunSettings> run = ProfileRunSettings(std::nullopt, 1, "microbatches");
  if (!run.ok()) return run.status();
  return BuildStageStepCostFromProfile(p, hardware, *run, 0);
}

double ProfileMessageBytes(const LayerProfileSet& p) {
  if (!p.pipeline.has_value()) return 0;
  double bytes = 0;
  const int virtual_stages = p.pipeline->pp * p.pipeline->vpp;
  for (int v = 1; v < virtual_stages; ++v) {
    const LayerRange& r = p.pipeline->stages[v % p.pipeline->pp].chunks[v / p.pipeline->pp];
    if (r.first_layer < static_cast<int>(p.layers.size())) {
      bytes = std::max(bytes, static_cast<double>(p.layers[r.first_layer].input_bytes));
    }
  }
  return bytes;
}

uint64_t DefaultProfileHostBudget(const StepCost& step, const HardwareProfile* hardware) {
  if (hardware != nullptr) return hardware->DefaultHostBudgetPerGpu();
  uint64_t all = 0;
  for (const LayerCost& l : step.layers) {  // saturating: no limit is what it means
    const auto held =
        CheckedMul(l.saved_bytes, static_cast<uint64_t>(std::max(1, l.in_flight_microbatches)));
    const auto sum = held.has_value() ? CheckedAdd(all, *held) : std::nullopt;
    all = sum.value_or(~uint64_t{0});
  }
  return std::max<uint64_t>(all, 1);
}

}  // namespace stowage::planner

// A config body's fields as transformers reads them (hf_fields.h).
#include "planner/model/hf_fields.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/json_reader.h"
#include "base/status_macros.h"

namespace stowage::planner::hf_config {

using json::Json;

Fields::Fields(json::Object body, const Defaults* defaults, std::vector<std::string>* taken)
    : body_(std::move(body)), defaults_(defaults), taken_(taken) {
  if (defaults_ == nullptr) return;
  defaults_json_ = Json::parse(defaults_->json);
  const Json spellings = Json::parse(defaults_->attribute_map);
  for (auto it = spellings.begin(); it != spellings.end(); ++it) {
    spellings_.emplace_back(it.key(), it.value().get<std::string>());
  }
}

absl::Status Fields::CheckSpellings() const {
  for (const auto& [alias, field] : spellings_) {
    if (body_.Has(alias) && body_.Has(field) && body_.json().at(alias) != body_.json().at(field)) {
      return body_.Invalid(
          alias, absl::StrCat("one of '", alias, "' and '", field,
                              "', or both equal (transformers reads both into ", field, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::vector<int>>> Fields::Indices(const char* key, int layers) const {
  if (!body_.Has(key) || body_.json().at(key).is_null()) return std::nullopt;
  auto array = body_.Array(key);
  if (!array.ok()) return array.status();
  std::vector<int> out;
  for (size_t i = 0; i < (*array)->size(); ++i) {
    int v = 0;
    STOWAGE_RETURN_IF_ERROR(json::ReadValue((**array)[i], body_.source(),
                                            absl::StrCat(body_.PathOf(key), "[", i, "]"), v,
                                            json::Range<int>{0, layers}));
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<std::optional<std::vector<std::string>>> Fields::LayerTypes(int layers) const {
  const char* key = "layer_types";
  if (!body_.Has(key) || body_.json().at(key).is_null()) return std::nullopt;
  auto array = body_.Array(key);
  if (!array.ok()) return array.status();
  if (static_cast<int>((*array)->size()) != layers) {
    return body_.Invalid(key, absl::StrCat("a list with one entry per layer (num_hidden_layers ",
                                           layers, "); it has ", (*array)->size()));
  }
  std::vector<std::string> out(layers);
  for (int i = 0; i < layers; ++i) {
    STOWAGE_RETURN_IF_ERROR(json::ReadValue((**array)[i], body_.source(),
                                            absl::StrCat(body_.PathOf(key), "[", i, "]"), out[i]));
  }
  return out;
}

absl::Status Fields::BadLayerType(int i, const std::string& value, const char* allowed) const {
  return absl::InvalidArgumentError(
      absl::StrCat(body_.source(), ": field '", body_.PathOf("layer_types"), "[", i,
                   "]' has value \"", value, "\"; allowed: ", allowed));
}

const char* Fields::Spelling(const char* key) const {
  if (body_.Has(key)) return key;
  for (const auto& [alias, field] : spellings_) {
    if (field == key && body_.Has(alias)) return alias.c_str();
    if (alias == key && body_.Has(field)) return field.c_str();
  }
  return key;
}

}  // namespace stowage::planner::hf_config

// Reading a config body's fields as transformers does (planner/model/hf_config.cc): a field the
// config leaves out takes its configuration class's default (hf_families.h Defaults), either
// attribute_map spelling of a field is read, and the sizes a decoder may have are checked.
#ifndef STOWAGE_PLANNER_MODEL_HF_FIELDS_H_
#define STOWAGE_PLANNER_MODEL_HF_FIELDS_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/json_reader.h"
#include "base/status_macros.h"
#include "planner/model/hf_families.h"
#include "planner/model/model.h"

namespace stowage::planner::hf_config {

// Sizes a real decoder can have; far above any published model, far below what overflows the
// 64-bit parameter and byte counts.
inline constexpr json::Range<int> kDim{1, 1 << 24};
inline constexpr json::Range<int> kCount{0, 1 << 24};
inline constexpr json::Range<int> kLayers{1, kMaxLayers};  // what the planner plans (model.h)

// The config body's fields, falling back to transformers' defaults for absent ones.
class Fields {
 public:
  // `defaults`: the family's (null: none); every default taken is added to `taken` as
  // "key=value".
  Fields(json::Object body, const Defaults* defaults, std::vector<std::string>* taken);

  const json::Object& body() const { return body_; }
  bool Present(const char* key) const { return body_.Has(Spelling(key)); }
  // Present with a non-null value, or absent with a transformers default.
  bool Set(const char* key) const {
    key = Spelling(key);
    if (body_.Has(key)) return !body_.json().at(key).is_null();
    return defaults_json_.contains(key);
  }

  // Both spellings of one attribute given with different values: transformers would keep
  // whichever it happened to set last.
  absl::Status CheckSpellings() const;

  template <typename T, typename... R>
  absl::Status Get(const char* key, T& out, R... range) const {
    key = Spelling(key);
    if (body_.Has(key) && !body_.json().at(key).is_null()) return body_.Read(key, out, range...);
    if (!body_.Has(key) && defaults_json_.contains(key)) {
      STOWAGE_RETURN_IF_ERROR(
          json::ReadValue(defaults_json_.at(key), "transformers defaults", key, out, range...));
      taken_->push_back(absl::StrCat(key, "=", defaults_json_.at(key).dump()));
      return absl::OkStatus();
    }
    return body_.Missing(key);
  }
  // `out` keeps `fallback` when the field is null, or absent without a transformers default.
  template <typename T, typename... R>
  absl::Status GetOr(const char* key, T fallback, T& out, R... range) const {
    out = fallback;
    if (!Set(key)) return absl::OkStatus();
    return Get(key, out, range...);
  }

  // An optional array of layer indices (mlp_only_layers, moe_layers, ...).
  absl::StatusOr<std::optional<std::vector<int>>> Indices(const char* key, int layers) const;

  // layer_types when given: one string per layer.
  absl::StatusOr<std::optional<std::vector<std::string>>> LayerTypes(int layers) const;

  absl::Status BadLayerType(int i, const std::string& value, const char* allowed) const;

 private:
  // The spelling the body uses for `key`: its other attribute_map spelling when only that one
  // is present.
  const char* Spelling(const char* key) const;

  json::Object body_;
  const Defaults* defaults_;
  json::Json defaults_json_ = json::Json::object();
  std::vector<std::string>* taken_;
  std::vector<std::pair<std::string, std::string>> spellings_;
};

}  // namespace stowage::planner::hf_config

#endif  // STOWAGE_PLANNER_MODEL_HF_FIELDS_H_

// load_model: config, tensors, FP8 scales, then the family's model.
#include "core/error.h"
#include "model/layers.h"
#include "model/model.h"

namespace deepinfer {

std::unique_ptr<CausalLM> load_model(const std::filesystem::path& folder,
                                     const ModelLoadOptions& options, Ops& ops) {
  ModelConfig config = load_model_config(folder);
  auto store = std::make_unique<TensorStore>(folder, options.mode);
  if (config.weight_block_rows > 0)
    store->attach_block_scales(config.weight_block_rows, config.weight_block_cols);
  store->place_in(ops);
  if (config.family == ModelFamily::kDeepseekV4)
    return make_deepseek_v4_model(std::move(config), std::move(store), options, ops);
  if (config.is_deepseek())
    return make_deepseek_model(std::move(config), std::move(store), options, ops);
  return make_dense_model(std::move(config), std::move(store), options, ops);
}

std::unique_ptr<CausalLM> load_model(const std::filesystem::path& folder, LoadMode mode, Ops& ops) {
  ModelLoadOptions options;
  options.mode = mode;
  return load_model(folder, options, ops);
}

}  // namespace deepinfer

#include "strata/cuda/gpu_model.h"

#include <mutex>

#include "strata/cuda/device_model.h"
#include "strata/cuda/hybrid_moe.h"
#include "strata/cuda/prefill.h"

namespace strata::cuda {

GpuModel::GpuModel(const Model& model, const GpuSessionOptions& opt)
    : model_(model),
      opt_(opt),
      dm_(std::make_unique<DeviceModel>(
          model, opt.expert_slots,
          opt.expert_slots.empty() ? std::vector<int>{}
                                   : expert_cache_slots_per_layer(opt.expert_slots, opt.expert_cache_slots))) {
  if (!opt.expert_slots.empty()) hybrid_ = make_hybrid_moe(model, *dm_, opt);
}

GpuModel::~GpuModel() = default;

const DeviceModel& GpuModel::device_with_mtp() {
  std::lock_guard<std::mutex> lock(exclusive_);
  dm_->upload_mtp(model_);
  return *dm_;
}

GpuPrefill& GpuModel::prefill() {
  if (!prefill_) {
    PrefillOptions po;
    po.math = opt_.prefill_math;
    po.max_chunk = opt_.prefill_chunk;
    // The half copies are for all-GPU models: a hybrid plan gives that memory to experts.
    po.cache_dense_f16 = opt_.prefill_f16_cache && opt_.expert_slots.empty();
    prefill_ = std::make_unique<GpuPrefill>(*dm_, po);
  }
  return *prefill_;
}

std::shared_ptr<GpuModel> make_gpu_model(const Model& model, const GpuSessionOptions& opt) {
  return std::make_shared<GpuModel>(model, opt);
}

}  // namespace strata::cuda

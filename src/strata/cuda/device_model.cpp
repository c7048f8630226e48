#include "strata/cuda/device_model.h"

#include "strata/base/error.h"
#include "strata/cuda/cuda_check.h"
#include "strata/cuda/device_memory.h"
#include "strata/moe/gpu_support.h"
#include "strata/moe/placement.h"

namespace strata::cuda {

void* DeviceModel::alloc(size_t n) {
  void* p = device_alloc(n, cat("the weights (", bytes_, " bytes already uploaded)"));
  allocations_.push_back(p);
  bytes_ += n;
  return p;
}

DevMatrix upload_matrix(const WeightMatrix& w, const std::string& name, const std::function<void*(size_t)>& alloc) {
  if (!supported_type(w.type))
    fail("CUDA backend: tensor ", name, " has type ", type_traits(w.type).name,
         ", which the CUDA kernels do not support (supported: ", supported_type_names(), ")");
  DevMatrix d;
  d.type = w.type;
  d.n_rows = w.n_rows;
  d.n_cols = w.n_cols;
  d.row_bytes = row_bytes(w.type, w.n_cols);
  const size_t total = d.row_bytes * static_cast<size_t>(w.n_rows);
  uint8_t* dst = static_cast<uint8_t*>(alloc(total));
  check_cuda(cudaMemcpy2D(dst, d.row_bytes, w.data, w.row_stride, d.row_bytes, static_cast<size_t>(w.n_rows),
                          cudaMemcpyHostToDevice),
             name.c_str());
  d.data = dst;
  return d;
}

DevMatrix DeviceModel::upload(const WeightMatrix& w, const char* what, int layer) {
  return upload_matrix(w, layer >= 0 ? cat("blk.", layer, ".", what) : std::string(what),
                       [this](size_t n) { return alloc(n); });
}

DevMatrix DeviceModel::upload(const ExpertStack& s, const char* what, int layer, const std::vector<int>* slots,
                              int extra_slots) {
  const WeightMatrix& w = s.first;
  if (!supported_type(w.type))
    fail("CUDA backend: tensor blk.", layer, ".", what, " has type ", type_traits(w.type).name,
         ", which the CUDA kernels do not support (supported: ", supported_type_names(), ")");
  DevMatrix d;
  d.type = w.type;
  d.n_rows = w.n_rows;
  d.n_cols = w.n_cols;
  d.row_bytes = row_bytes(w.type, w.n_cols);
  d.expert_stride = d.row_bytes * static_cast<size_t>(w.n_rows);
  // With a slot map only the hot experts are uploaded, expert e to slot (*slots)[e].
  int n_hot = s.n_expert;
  if (slots) {
    n_hot = 0;
    for (int slot : *slots) n_hot += slot >= 0 ? 1 : 0;
  }
  d.n_expert = n_hot + extra_slots;
  const size_t total = d.expert_stride * static_cast<size_t>(d.n_expert);
  uint8_t* dst = static_cast<uint8_t*>(alloc(total));
  expert_bytes_ += total;
  for (int e = 0; e < s.n_expert; ++e) {
    const int slot = slots ? (*slots)[static_cast<size_t>(e)] : e;
    if (slot < 0) continue;
    const WeightMatrix we = s.expert(e);
    check_cuda(cudaMemcpy2D(dst + static_cast<size_t>(slot) * d.expert_stride, d.row_bytes, we.data, we.row_stride,
                            d.row_bytes, static_cast<size_t>(w.n_rows), cudaMemcpyHostToDevice),
               what);
  }
  d.data = dst;
  return d;
}

const float* upload_floats(const std::vector<float>& v, const std::function<void*(size_t)>& alloc) {
  float* dst = static_cast<float*>(alloc(v.size() * sizeof(float)));
  check_cuda(cudaMemcpy(dst, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), "upload vector");
  return dst;
}

const float* DeviceModel::upload(const std::vector<float>& v) {
  return upload_floats(v, [this](size_t n) { return alloc(n); });
}

std::vector<int> validate_expert_slots(const Model& model, const std::vector<std::vector<int>>& expert_slots) {
  const ModelWeights& w = model.weights();
  if (expert_slots.size() != w.layers.size())
    fail("expert slot map: ", expert_slots.size(), " layers given, the model has ", w.layers.size());
  std::vector<int> n_hot(w.layers.size(), 0);
  for (size_t il = 0; il < w.layers.size(); ++il) {
    const std::vector<int>& row = expert_slots[il];
    const int n_exp = w.layers[il].moe.gate.n_expert;
    if (static_cast<int>(row.size()) != n_exp)
      fail("expert slot map: layer ", il, " has ", row.size(), " entries, the layer has ", n_exp, " experts");
    n_hot[il] = hot_slot_count(row, il);
  }
  return n_hot;
}

DevLayer DeviceModel::upload_layer(const LayerWeights& L, const LayerSpec& spec, int l, const std::vector<int>* slots,
                                   int extra) {
  DevLayer D;
  D.kind = L.kind;
  D.attn_norm = upload(L.attn_norm);
  D.ffn_norm = upload(L.ffn_norm);
  if (is_attention(L.kind)) {
    D.attn.q = upload(L.attn.q, "attn_q.weight", l);
    D.attn.k = upload(L.attn.k, "attn_k.weight", l);
    D.attn.v = upload(L.attn.v, "attn_v.weight", l);
    D.attn.o = upload(L.attn.o, "attn_output.weight", l);
    if (config_.attn_gate != AttnGate::None) D.attn.gate = upload(L.attn.gate, "attn_gate.weight", l);
    D.attn.q_norm = upload(L.attn.q_norm);
    D.attn.k_norm = upload(L.attn.k_norm);
  } else {
    D.deltanet.qkv = upload(L.deltanet.qkv, "attn_qkv.weight", l);
    D.deltanet.gate = upload(L.deltanet.gate, "attn_gate.weight", l);
    D.deltanet.beta = upload(L.deltanet.beta, "ssm_beta.weight", l);
    D.deltanet.alpha = upload(L.deltanet.alpha, "ssm_alpha.weight", l);
    D.deltanet.out = upload(L.deltanet.out, "ssm_out.weight", l);
    D.deltanet.conv = upload(L.deltanet.conv);
    D.deltanet.a = upload(L.deltanet.a);
    D.deltanet.dt_bias = upload(L.deltanet.dt_bias);
    D.deltanet.norm = upload(L.deltanet.norm);
  }
  D.ffn = spec.ffn;
  if (D.ffn == FfnKind::Dense) {
    D.dense.gate = upload(L.dense.gate, "ffn_gate.weight", l);
    D.dense.up = upload(L.dense.up, "ffn_up.weight", l);
    D.dense.down = upload(L.dense.down, "ffn_down.weight", l);
    return D;
  }
  D.moe.router = upload(L.moe.router, "ffn_gate_inp.weight", l);
  if (!L.moe.selection_bias.empty()) D.moe.selection_bias = upload(L.moe.selection_bias);
  D.moe.gate = upload(L.moe.gate, "ffn_gate_exps.weight", l, slots, extra);
  D.moe.up = upload(L.moe.up, "ffn_up_exps.weight", l, slots, extra);
  D.moe.down = upload(L.moe.down, "ffn_down_exps.weight", l, slots, extra);
  D.moe.has_shared = L.moe.has_shared;
  D.moe.shared_gated = L.moe.shared_gated;
  if (L.moe.has_shared) {
    if (L.moe.shared_gated) D.moe.shared_gate_inp = upload(L.moe.shared_gate_inp, "ffn_gate_inp_shexp.weight", l);
    D.moe.shared_gate = upload(L.moe.shared_gate, "ffn_gate_shexp.weight", l);
    D.moe.shared_up = upload(L.moe.shared_up, "ffn_up_shexp.weight", l);
    D.moe.shared_down = upload(L.moe.shared_down, "ffn_down_shexp.weight", l);
  }
  return D;
}

DeviceModel::DeviceModel(const Model& model, const std::vector<std::vector<int>>& expert_slots,
                         const std::vector<int>& cache_slots)
    : config_(model.config()), expert_slots_(expert_slots) {
  require_gpu_support(config_);  // every GPU path is built on a DeviceModel
  const ModelWeights& w = model.weights();
  if (!expert_slots_.empty()) validate_expert_slots(model, expert_slots_);
  if (!cache_slots.empty() && (expert_slots_.empty() || cache_slots.size() != w.layers.size()))
    fail("expert cache slots: ", cache_slots.size(), " layers given, with ",
         expert_slots_.empty() ? "no slot map" : cat(w.layers.size(), " layers in the model"));
  try {
    token_embd = upload(w.token_embd, "token_embd.weight", -1);
    output = w.tied_output ? token_embd : upload(w.output, "output.weight", -1);
    output_norm = upload(w.output_norm);
    layers.resize(w.layers.size());
    for (size_t il = 0; il < w.layers.size(); ++il) {
      const std::vector<int>* slots = expert_slots_.empty() ? nullptr : &expert_slots_[il];
      const int extra = cache_slots.empty() ? 0 : cache_slots[il];
      layers[il] = upload_layer(w.layers[il], config_.layer(static_cast<int>(il)), static_cast<int>(il), slots, extra);
    }
  } catch (...) {
    for (void* p : allocations_) device_free(p);
    throw;
  }
}

void DeviceModel::upload_mtp(const Model& model) {
  if (hybrid()) fail("the MTP layer runs on the GPU next to an all-GPU model only (this one keeps experts on the CPU)");
  const ModelWeights& w = model.weights();
  for (size_t j = mtp.size(); j < w.mtp.size(); ++j) {
    const MtpWeights& m = w.mtp[j];
    const int l = config_.n_layer + static_cast<int>(j);  // the GGUF's block number of the MTP layer
    DevMtp D;
    D.layer = upload_layer(m.layer, config_.mtp_layer, l, nullptr, 0);
    D.eh_proj = upload(m.eh_proj, "nextn.eh_proj.weight", l);
    D.enorm = upload(m.enorm);
    D.hnorm = upload(m.hnorm);
    D.shared_head_norm = upload(m.shared_head_norm);
    mtp.push_back(D);
  }
}

DeviceModel::~DeviceModel() {
  for (void* p : allocations_) device_free(p);
}

}  // namespace strata::cuda

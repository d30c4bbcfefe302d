#include "sim/filler_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace evoke::sim {

void FillerAttention::Row(absl::Span<const float> queries, absl::Span<const float> keys,
                          absl::Span<const int64_t> positions, int64_t now, float scale,
                          std::vector<float>* weights) {
  const size_t n = positions.size();
  weights->assign(n, 0.0f);
  if (n == 0 || d_ == 0) return;
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(d_));
  const size_t n_queries = queries.size() / d_;
  logits_.resize(n);
  for (size_t qi = 0; qi < n_queries; ++qi) {
    const float* q = queries.data() + qi * d_;
    for (size_t i = 0; i < n; ++i) {
      const float* k = keys.data() + i * d_;
      float dot = 0;
      for (uint32_t j = 0; j < d_; ++j) dot += q[j] * k[j];
      logits_[i] = dot * inv_sqrt_d -
                   static_cast<float>(recency_ * static_cast<double>(now - positions[i]));
    }
    const float m = *std::max_element(logits_.begin(), logits_.end());
    double total = 0;
    for (float& x : logits_) {
      x = std::exp(x - m);
      total += x;
    }
    const float norm = static_cast<float>(scale / total);
    for (size_t i = 0; i < n; ++i) (*weights)[i] += logits_[i] * norm;
  }
}

}  // namespace evoke::sim

#include "policy/attention_stats.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace evoke::policy {

AttentionStats::AttentionStats(const Options& options) : options_(options) {
  options_.n_layers = std::max(1u, options_.n_layers);
  options_.n_heads = std::max(1u, options_.n_heads);
  options_.window = std::max(1u, options_.window);
  if (options_.pool_kernel == 0) options_.pool_kernel = 1;
  if (options_.pool_kernel % 2 == 0) ++options_.pool_kernel;
  rows_ = options_.n_layers * options_.n_heads;
}

AttentionStats::PerBlock& AttentionStats::Block(BlockHandle block) {
  std::unique_ptr<PerBlock>& slot = blocks_[block];
  if (slot == nullptr) {
    slot = std::make_unique<PerBlock>();
    slot->cumulative.assign(rows_, 0.0);
    slot->window.assign(rows_, 0.0);
    slot->ring.assign(static_cast<size_t>(options_.window) * rows_, 0.0f);
    slot->ring_all.assign(options_.window, 0.0f);
    slot->last_step = steps_;
  }
  return *slot;
}

void AttentionStats::MaxPool(absl::Span<const float> w) {
  // van Herk / Gil-Werman: with the row cut into segments of k tokens,
  // prefix_[i] is the max from i's segment start to i and suffix_[i] the max
  // from i to its segment end; a full window [lo, lo + k) spans at most two
  // segments, so its max is max(suffix_[lo], prefix_[lo + k - 1]). Windows
  // clipped at the row's ends are scanned directly.
  const size_t n = w.size();
  const size_t k = options_.pool_kernel;
  const size_t radius = k / 2;
  pooled_.resize(n);
  prefix_.resize(n);
  suffix_.resize(n);
  for (size_t start = 0; start < n; start += k) {
    const size_t end = std::min(n, start + k);
    prefix_[start] = w[start];
    for (size_t i = start + 1; i < end; ++i) prefix_[i] = std::max(prefix_[i - 1], w[i]);
    suffix_[end - 1] = w[end - 1];
    for (size_t i = end - 1; i > start; --i) suffix_[i - 1] = std::max(suffix_[i], w[i - 1]);
  }
  for (size_t i = 0; i < n; ++i) {
    const size_t lo = i >= radius ? i - radius : 0;
    const size_t hi = std::min(n - 1, i + radius);
    if (hi - lo + 1 == k) {
      pooled_[i] = std::max(suffix_[lo], prefix_[hi]);
    } else {
      float m = w[lo];
      for (size_t j = lo + 1; j <= hi; ++j) m = std::max(m, w[j]);
      pooled_[i] = m;
    }
  }
}

absl::Status AttentionStats::Observe(uint32_t layer, uint32_t head,
                                     absl::Span<const BlockHandle> block_of_token,
                                     absl::Span<const uint32_t> token_in_block,
                                     absl::Span<const float> weights) {
  if (layer >= options_.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer: ", layer, " is not below n_layers (", options_.n_layers, ")"));
  }
  if (head >= options_.n_heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("head: ", head, " is not below n_heads (", options_.n_heads, ")"));
  }
  const size_t n = weights.size();
  if (block_of_token.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("block_of_token: has ", block_of_token.size(),
                                                   " entries, weights ", n));
  }
  if (!token_in_block.empty() && token_in_block.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("token_in_block: has ", token_in_block.size(),
                                                   " entries, weights ", n));
  }
  if (layer == options_.token_layer) {
    for (size_t i = 0; i < token_in_block.size(); ++i) {
      if (token_in_block[i] >= kMaxBlockTokens) {
        return absl::InvalidArgumentError(absl::StrCat("token_in_block[", i, "]: ",
                                                       token_in_block[i], " is not below ",
                                                       kMaxBlockTokens));
      }
    }
  }
  // Max-pool the row over neighbouring tokens (SnapKV's kernel).
  const float* pooled = weights.data();
  if (options_.pool_kernel > 1 && n > 0) {
    MaxPool(weights);
    pooled = pooled_.data();
  }
  const bool want_tokens = layer == options_.token_layer && !token_in_block.empty();
  const uint32_t row = layer * options_.n_heads + head;
  const size_t slot = static_cast<size_t>(steps_ % options_.window);
  PerBlock* pb = nullptr;
  BlockHandle current = kNoBlock;
  double acc_c = 0, acc_w = 0;
  auto flush = [&] {
    if (pb == nullptr) return;
    pb->cumulative[row] += acc_c;
    pb->cumulative_all += acc_c;
    pb->window[row] += acc_w;
    pb->window_all += acc_w;
    pb->ring[slot * rows_ + row] += static_cast<float>(acc_w);
    pb->ring_all[slot] += static_cast<float>(acc_w);
    pb->last_step = steps_;
    acc_c = acc_w = 0;
  };
  for (size_t i = 0; i < n; ++i) {
    const BlockHandle b = block_of_token[i];
    if (b == kNoBlock) continue;
    if (b != current) {
      flush();
      pb = &Block(b);
      current = b;
    }
    acc_c += weights[i];
    acc_w += pooled[i];
    if (want_tokens) {
      const size_t at = static_cast<size_t>(token_in_block[i]) * options_.n_heads + head;
      if (pb->token_mass.size() <= at) {
        pb->token_mass.resize((static_cast<size_t>(token_in_block[i]) + 1) * options_.n_heads, 0.0f);
      }
      pb->token_mass[at] += weights[i];
    }
  }
  flush();
  return absl::OkStatus();
}

void AttentionStats::EndStep() {
  ++steps_;
  const uint64_t window = options_.window;
  const size_t slot = static_cast<size_t>(steps_ % window);
  for (auto& [handle, pb] : blocks_) {
    if (pb->last_step + window < steps_) continue;  // Its ring is all zero.
    if (pb->last_step + window == steps_) {
      // The last observed step leaves the window: nothing else is in it.
      std::fill(pb->ring.begin(), pb->ring.end(), 0.0f);
      std::fill(pb->ring_all.begin(), pb->ring_all.end(), 0.0f);
      std::fill(pb->window.begin(), pb->window.end(), 0.0);
      pb->window_all = 0;
      continue;
    }
    float* r = pb->ring.data() + slot * rows_;
    for (uint32_t i = 0; i < rows_; ++i) {
      pb->window[i] -= r[i];
      r[i] = 0;
    }
    pb->window_all -= pb->ring_all[slot];
    pb->ring_all[slot] = 0;
  }
}

void AttentionStats::Forget(BlockHandle block) { blocks_.erase(block); }

double AttentionStats::Sum(const std::vector<double>& v, double all, int32_t layer,
                           int32_t head) const {
  const int32_t n_layers = static_cast<int32_t>(options_.n_layers);
  const int32_t n_heads = static_cast<int32_t>(options_.n_heads);
  if (layer == CacheView::kAll && head == CacheView::kAll) return all;
  if (layer >= n_layers || head >= n_heads || layer < CacheView::kAll || head < CacheView::kAll) {
    return 0;
  }
  double total = 0;
  for (int32_t l = 0; l < n_layers; ++l) {
    if (layer != CacheView::kAll && l != layer) continue;
    for (int32_t h = 0; h < n_heads; ++h) {
      if (head != CacheView::kAll && h != head) continue;
      total += v[static_cast<size_t>(l) * n_heads + h];
    }
  }
  return total;
}

double AttentionStats::Cumulative(BlockHandle block, int32_t layer, int32_t head) const {
  auto it = blocks_.find(block);
  if (it == blocks_.end()) return 0;
  return Sum(it->second->cumulative, it->second->cumulative_all, layer, head);
}

double AttentionStats::Window(BlockHandle block, int32_t layer, int32_t head) const {
  auto it = blocks_.find(block);
  if (it == blocks_.end()) return 0;
  return Sum(it->second->window, it->second->window_all, layer, head);
}

absl::Span<const float> AttentionStats::TokenMass(BlockHandle block) const {
  auto it = blocks_.find(block);
  if (it == blocks_.end()) return {};
  return it->second->token_mass;
}

}  // namespace evoke::policy

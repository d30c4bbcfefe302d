// TokenBucket: a byte budget per second with a burst, for background work
// that must leave the foreground alone (tier 3's write-behind).
//
// Tokens accrue at `rate` bytes per second up to `burst`. Take(bytes, now)
// spends them and may leave the bucket in debt (a batch larger than the
// burst still goes, whole); Wait(now) says how long until the debt is paid
// and the next batch may start. Over any long stretch no more than
// rate x time + burst bytes are taken. Not thread-safe: its owner locks.
#ifndef EVOKE_COMMON_TOKEN_BUCKET_H_
#define EVOKE_COMMON_TOKEN_BUCKET_H_

#include <algorithm>
#include <cstdint>

#include "absl/time/time.h"

namespace evoke {

class TokenBucket {
 public:
  // rate 0: no limit (Wait is always zero).
  TokenBucket(uint64_t rate_bytes_per_s, uint64_t burst_bytes, absl::Time now)
      : rate_(static_cast<double>(rate_bytes_per_s)),
        burst_(static_cast<double>(std::max<uint64_t>(burst_bytes, 1))),
        tokens_(burst_),
        last_(now) {}

  bool limited() const { return rate_ > 0; }

  // How long from `now` until a batch may start (zero: now).
  absl::Duration Wait(absl::Time now) {
    if (!limited()) return absl::ZeroDuration();
    Refill(now);
    if (tokens_ >= 0) return absl::ZeroDuration();
    return absl::Seconds(-tokens_ / rate_);
  }

  // Take spends `bytes` (going into debt if there are fewer).
  void Take(uint64_t bytes, absl::Time now) {
    if (!limited()) return;
    Refill(now);
    tokens_ -= static_cast<double>(bytes);
  }

 private:
  void Refill(absl::Time now) {
    if (now > last_) {
      tokens_ = std::min(burst_, tokens_ + absl::ToDoubleSeconds(now - last_) * rate_);
      last_ = now;
    }
  }

  const double rate_;
  const double burst_;
  double tokens_;
  absl::Time last_;
};

}  // namespace evoke

#endif  // EVOKE_COMMON_TOKEN_BUCKET_H_

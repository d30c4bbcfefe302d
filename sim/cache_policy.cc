#include "sim/cache_policy.h"

#include <algorithm>
#include <limits>
#include <list>
#include <memory>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace evoke::sim {
namespace {

// Keys in recency order, most recent first.
class LruList {
 public:
  bool contains(uint64_t key) const { return where_.contains(key); }
  size_t size() const { return where_.size(); }
  bool empty() const { return where_.empty(); }
  void PushFront(uint64_t key) {
    order_.push_front(key);
    where_[key] = order_.begin();
  }
  void Touch(uint64_t key) { order_.splice(order_.begin(), order_, where_.at(key)); }
  bool Erase(uint64_t key) {
    auto it = where_.find(key);
    if (it == where_.end()) return false;
    order_.erase(it->second);
    where_.erase(it);
    return true;
  }
  uint64_t Back() const { return order_.back(); }
  uint64_t PopBack() {
    const uint64_t key = order_.back();
    Erase(key);
    return key;
  }

 private:
  std::list<uint64_t> order_;
  absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> where_;
};

// One online policy: Access returns whether the key was resident (a hit),
// and leaves at most `capacity` keys resident.
class Cache {
 public:
  virtual ~Cache() = default;
  virtual bool Access(const BlockAccess& a) = 0;
  virtual uint64_t resident() const = 0;
};

// With `by_turn`, evictions wait until the next turn starts (and Finish).
class Lru final : public Cache {
 public:
  Lru(uint64_t capacity, bool by_turn) : capacity_(capacity), by_turn_(by_turn) {}
  bool Access(const BlockAccess& a) override {
    if (by_turn_ && a.turn != turn_) Finish();
    turn_ = a.turn;
    const bool hit = list_.contains(a.key);
    if (hit) {
      list_.Touch(a.key);
    } else {
      list_.PushFront(a.key);
    }
    if (!by_turn_) Finish();
    return hit;
  }
  void Finish() {
    while (list_.size() > capacity_) list_.PopBack();
  }
  uint64_t resident() const override { return list_.size(); }

 private:
  const uint64_t capacity_;
  const bool by_turn_;
  uint32_t turn_ = 0;
  LruList list_;
};

// Segmented LRU: new keys enter probation; a hit there moves the key to
// protected, whose overflow goes back to probation's front; evictions take
// probation's tail (protected's when probation is empty).
class Slru {
 public:
  Slru(uint64_t capacity, double protected_fraction)
      : capacity_(capacity),
        protected_cap_(static_cast<uint64_t>(static_cast<double>(capacity) * protected_fraction)) {}
  bool contains(uint64_t key) const { return probation_.contains(key) || protected_.contains(key); }
  uint64_t size() const { return probation_.size() + protected_.size(); }
  uint64_t capacity() const { return capacity_; }
  void Hit(uint64_t key) {
    if (protected_.contains(key)) {
      protected_.Touch(key);
      return;
    }
    probation_.Erase(key);
    protected_.PushFront(key);
    while (protected_.size() > protected_cap_ && !protected_.empty()) {
      probation_.PushFront(protected_.PopBack());
    }
  }
  void Insert(uint64_t key) { probation_.PushFront(key); }
  // The key the next eviction takes (size() > 0).
  uint64_t Victim() const { return probation_.empty() ? protected_.Back() : probation_.Back(); }
  void Evict() {
    if (probation_.empty()) {
      protected_.PopBack();
    } else {
      probation_.PopBack();
    }
  }

 private:
  const uint64_t capacity_;
  const uint64_t protected_cap_;
  LruList probation_, protected_;
};

class SlruCache final : public Cache {
 public:
  explicit SlruCache(uint64_t capacity) : slru_(capacity, 0.8) {}
  bool Access(const BlockAccess& a) override {
    if (slru_.contains(a.key)) {
      slru_.Hit(a.key);
      return true;
    }
    slru_.Insert(a.key);
    if (slru_.size() > slru_.capacity()) slru_.Evict();
    return false;
  }
  uint64_t resident() const override { return slru_.size(); }

 private:
  Slru slru_;
};

// ARC as in Megiddo & Modha (FAST '03), figure 4.
class Arc final : public Cache {
 public:
  explicit Arc(uint64_t capacity) : c_(capacity) {}
  bool Access(const BlockAccess& a) override {
    const uint64_t x = a.key;
    if (t1_.contains(x) || t2_.contains(x)) {
      t1_.Erase(x);
      t2_.Erase(x);
      t2_.PushFront(x);
      return true;
    }
    if (b1_.contains(x)) {
      const double d = b1_.size() >= b2_.size() ? 1.0
                                                : static_cast<double>(b2_.size()) / b1_.size();
      p_ = std::min(static_cast<double>(c_), p_ + d);
      Replace(false);
      b1_.Erase(x);
      t2_.PushFront(x);
      return false;
    }
    if (b2_.contains(x)) {
      const double d = b2_.size() >= b1_.size() ? 1.0
                                                : static_cast<double>(b1_.size()) / b2_.size();
      p_ = std::max(0.0, p_ - d);
      Replace(true);
      b2_.Erase(x);
      t2_.PushFront(x);
      return false;
    }
    const uint64_t l1 = t1_.size() + b1_.size();
    const uint64_t total = l1 + t2_.size() + b2_.size();
    if (l1 == c_) {
      if (t1_.size() < c_) {
        b1_.PopBack();
        Replace(false);
      } else {
        t1_.PopBack();
      }
    } else if (l1 < c_ && total >= c_) {
      if (total == 2 * c_) b2_.PopBack();
      Replace(false);
    }
    t1_.PushFront(x);
    return false;
  }
  uint64_t resident() const override { return t1_.size() + t2_.size(); }

 private:
  void Replace(bool in_b2) {
    if (t1_.size() + t2_.size() < c_) return;  // Room yet.
    const double t1 = static_cast<double>(t1_.size());
    if (!t1_.empty() && (t1 > p_ || (in_b2 && t1 == p_))) {
      b1_.PushFront(t1_.PopBack());
    } else if (!t2_.empty()) {
      b2_.PushFront(t2_.PopBack());
    } else {
      b1_.PushFront(t1_.PopBack());
    }
  }
  const uint64_t c_;
  double p_ = 0;
  LruList t1_, t2_, b1_, b2_;
};

// W-TinyLFU (Einziger, Friedman, Manes): a 1% LRU window in front of an
// SLRU main area; a key the window pushes out enters main only if it was
// seen more often than main's victim. Frequencies are exact counts halved
// every 10 x capacity accesses (the sketch approximates these).
class TinyLfu final : public Cache {
 public:
  explicit TinyLfu(uint64_t capacity)
      : window_cap_(std::max<uint64_t>(1, capacity / 100)),
        main_(capacity - std::min(capacity, std::max<uint64_t>(1, capacity / 100)), 0.8),
        sample_(10 * std::max<uint64_t>(1, capacity)) {}
  bool Access(const BlockAccess& a) override {
    const uint64_t x = a.key;
    Count(x);
    if (window_.contains(x)) {
      window_.Touch(x);
      return true;
    }
    if (main_.contains(x)) {
      main_.Hit(x);
      return true;
    }
    window_.PushFront(x);
    if (window_.size() > window_cap_) {
      const uint64_t candidate = window_.PopBack();
      if (main_.size() < main_.capacity()) {
        main_.Insert(candidate);
      } else if (main_.capacity() > 0 && Frequency(candidate) > Frequency(main_.Victim())) {
        main_.Evict();
        main_.Insert(candidate);
      }
    }
    return false;
  }
  uint64_t resident() const override { return window_.size() + main_.size(); }

 private:
  void Count(uint64_t key) {
    ++freq_[key];
    if (++seen_ < sample_) return;
    seen_ = 0;
    for (auto it = freq_.begin(); it != freq_.end();) {
      it->second /= 2;
      if (it->second == 0) {
        freq_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  uint32_t Frequency(uint64_t key) const {
    auto it = freq_.find(key);
    return it == freq_.end() ? 0 : it->second;
  }
  const uint64_t window_cap_;
  LruList window_;
  Slru main_;
  const uint64_t sample_;
  uint64_t seen_ = 0;
  absl::flat_hash_map<uint64_t, uint32_t> freq_;
};

// LRU over owners (sessions; each prompt is its own owner): evict from the
// owner whose last access is oldest, its least recent block first.
class SessionLru final : public Cache {
 public:
  explicit SessionLru(uint64_t capacity) : capacity_(capacity) {}
  bool Access(const BlockAccess& a) override {
    Owner& o = owners_[a.owner];
    if (o.tick != 0) by_age_.erase({o.tick, a.owner});
    o.tick = ++tick_;
    by_age_.insert({o.tick, a.owner});
    if (o.blocks.contains(a.key)) {
      o.blocks.Touch(a.key);
      return true;
    }
    o.blocks.PushFront(a.key);
    if (++resident_ > capacity_) Evict();
    return false;
  }
  uint64_t resident() const override { return resident_; }

 private:
  struct Owner {
    uint64_t tick = 0;
    LruList blocks;
  };
  void Evict() {
    for (auto it = by_age_.begin(); it != by_age_.end(); ++it) {
      Owner& o = owners_[it->second];
      if (o.blocks.empty()) continue;
      o.blocks.PopBack();
      --resident_;
      return;
    }
  }
  const uint64_t capacity_;
  uint64_t tick_ = 0;
  uint64_t resident_ = 0;
  absl::flat_hash_map<uint32_t, Owner> owners_;
  std::set<std::pair<uint64_t, uint32_t>> by_age_;
};

CacheSimResult SimulateOptimal(const std::vector<BlockAccess>& accesses, uint64_t capacity) {
  constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  std::vector<uint64_t> next(accesses.size(), kNever);
  absl::flat_hash_map<uint64_t, uint64_t> later;
  for (size_t i = accesses.size(); i-- > 0;) {
    auto [it, fresh] = later.try_emplace(accesses[i].key, i);
    if (!fresh) {
      next[i] = it->second;
      it->second = i;
    }
  }
  CacheSimResult r;
  absl::flat_hash_map<uint64_t, uint64_t> held;  // key -> its next use.
  std::set<std::pair<uint64_t, uint64_t>> by_next;
  for (size_t i = 0; i < accesses.size(); ++i) {
    const BlockAccess& a = accesses[i];
    if (a.write) {
      ++r.writes;
    } else {
      ++r.reads;
    }
    auto it = held.find(a.key);
    if (it != held.end()) {
      if (!a.write) ++r.hits;
      by_next.erase({it->second, a.key});
      held.erase(it);
    }
    if (next[i] == kNever || capacity == 0) continue;  // Never read again: bypass.
    if (held.size() >= capacity) {
      auto far = std::prev(by_next.end());
      if (far->first <= next[i]) continue;  // Everything held is needed sooner.
      held.erase(far->second);
      by_next.erase(far);
    }
    held[a.key] = next[i];
    by_next.insert({next[i], a.key});
    r.max_resident = std::max<uint64_t>(r.max_resident, held.size());
  }
  return r;
}

}  // namespace

std::vector<BlockAccess> AgentTraceAccesses(const AgentTrace& trace) {
  std::vector<BlockAccess> out;
  const uint32_t sessions = trace.options.sessions;
  for (uint32_t n = 0; n < trace.turns.size(); ++n) {
    const AgentTurn& t = trace.turns[n];
    for (uint32_t i = 0; i < trace.options.prompt_blocks; ++i) {
      out.push_back({(uint64_t{1} << 63) | (uint64_t{t.prompt} << 32) | i, n,
                     sessions + t.prompt, t.time_s, false});
    }
    for (uint32_t i = 0; i < t.context_blocks + t.new_blocks; ++i) {
      out.push_back({(uint64_t{t.session} << 32) | i, n, t.session, t.time_s,
                     i >= t.context_blocks});
    }
  }
  return out;
}

absl::StatusOr<CachePolicyKind> ParseCachePolicy(const std::string& name) {
  for (CachePolicyKind k : {CachePolicyKind::kLru, CachePolicyKind::kSlru, CachePolicyKind::kArc,
                            CachePolicyKind::kTinyLfu, CachePolicyKind::kSessionLru,
                            CachePolicyKind::kLruTurns, CachePolicyKind::kOptimal}) {
    if (CachePolicyName(k) == name) return k;
  }
  return absl::InvalidArgumentError(
      "policy: " + name + " is not lru, slru, arc, w-tinylfu, session-lru, lru-turns or optimal");
}

std::string CachePolicyName(CachePolicyKind kind) {
  switch (kind) {
    case CachePolicyKind::kLru: return "lru";
    case CachePolicyKind::kSlru: return "slru";
    case CachePolicyKind::kArc: return "arc";
    case CachePolicyKind::kTinyLfu: return "w-tinylfu";
    case CachePolicyKind::kSessionLru: return "session-lru";
    case CachePolicyKind::kLruTurns: return "lru-turns";
    case CachePolicyKind::kOptimal: return "optimal";
  }
  return "?";
}

CacheSimResult SimulateCache(const std::vector<BlockAccess>& accesses, CachePolicyKind kind,
                             uint64_t capacity) {
  if (kind == CachePolicyKind::kOptimal) return SimulateOptimal(accesses, capacity);
  std::unique_ptr<Cache> cache;
  switch (kind) {
    case CachePolicyKind::kLru: cache = std::make_unique<Lru>(capacity, false); break;
    case CachePolicyKind::kLruTurns: cache = std::make_unique<Lru>(capacity, true); break;
    case CachePolicyKind::kSlru: cache = std::make_unique<SlruCache>(capacity); break;
    case CachePolicyKind::kArc: cache = std::make_unique<Arc>(capacity); break;
    case CachePolicyKind::kTinyLfu: cache = std::make_unique<TinyLfu>(capacity); break;
    case CachePolicyKind::kSessionLru: cache = std::make_unique<SessionLru>(capacity); break;
    case CachePolicyKind::kOptimal: break;
  }
  CacheSimResult r;
  for (const BlockAccess& a : accesses) {
    const bool hit = capacity > 0 && cache->Access(a);
    if (a.write) {
      ++r.writes;
    } else {
      ++r.reads;
      r.hits += hit;
    }
    r.max_resident = std::max(r.max_resident, cache->resident());
  }
  return r;
}

}  // namespace evoke::sim

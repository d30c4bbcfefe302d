#include "storage/remote/rados_store.h"

#include <rados/librados.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace evoke {
namespace {

constexpr char kRecordAttr[] = "evoke.rec";

absl::Status FromErrno(int rv, absl::string_view what) {
  if (rv >= 0) return absl::OkStatus();
  const int e = -rv;
  const std::string msg = absl::StrCat(what, ": ", std::strerror(e));
  switch (e) {
    case ENOENT: return absl::NotFoundError(msg);
    case EEXIST: return absl::AlreadyExistsError(msg);
    case ETIMEDOUT: return absl::DeadlineExceededError(msg);
    case ENOSPC:
    case EDQUOT: return absl::ResourceExhaustedError(msg);
    case EACCES:
    case EPERM: return absl::PermissionDeniedError(msg);
    case ENODATA: return absl::DataLossError(absl::StrCat(what, ": the object has no record"));
    default: return absl::UnavailableError(msg);
  }
}

// One asynchronous operation: what it needs alive until it completes.
struct Op {
  librados::AioCompletion* completion = nullptr;
  librados::ObjectWriteOperation write;
  librados::ObjectReadOperation read;
  librados::bufferlist data, record;
  int data_rv = 0, record_rv = 0;
  uint64_t size = 0;
  time_t mtime = 0;
};

class RadosObjectStore final : public ObjectStore {
 public:
  explicit RadosObjectStore(const RadosOptions& options) : options_(options) {}
  ~RadosObjectStore() override {
    ioctxs_.clear();
    if (base_ != nullptr) base_.reset();
    if (rados_ != nullptr) rados_->shutdown();
  }

  std::string Describe() const override { return absl::StrCat("rados pool ", options_.pool); }
  bool connected() const override { return connected_.load(std::memory_order_acquire); }

  absl::Status Connect() override {
    absl::MutexLock lock(&connect_mu_);
    if (connected()) return absl::OkStatus();
    auto rados = std::make_unique<librados::Rados>();
    int rv = rados->init2(options_.user.c_str(), "ceph", 0);
    if (rv < 0) {
      return FromErrno(rv, absl::StrCat("--remote-user ", options_.user));
    }
    rv = rados->conf_read_file(options_.conf_path.c_str());
    if (rv < 0) {
      rados->shutdown();
      return absl::InvalidArgumentError(absl::StrCat(
          "--remote-conf ", options_.conf_path, ": cannot read it: ", std::strerror(-rv)));
    }
    const std::string secs = absl::StrCat(std::max<int64_t>(
        1, static_cast<int64_t>(std::ceil(absl::ToDoubleSeconds(options_.op_timeout)))));
    for (const char* key : {"rados_osd_op_timeout", "rados_mon_op_timeout",
                            "client_mount_timeout"}) {
      rados->conf_set(key, secs.c_str());
    }
    if (!options_.keyring.empty()) rados->conf_set("keyring", options_.keyring.c_str());
    rv = rados->connect();
    if (rv == -EACCES || rv == -EPERM) {
      rados->shutdown();
      return absl::PermissionDeniedError(absl::StrCat(
          "the cluster of --remote-conf ", options_.conf_path, " refused --remote-user ",
          options_.user, " (check --remote-keyring and its caps): ", std::strerror(-rv)));
    }
    if (rv < 0) {
      rados->shutdown();
      return absl::UnavailableError(absl::StrCat(
          "cannot reach the monitors named in --remote-conf ", options_.conf_path, ": ",
          std::strerror(-rv)));
    }
    auto base = std::make_unique<librados::IoCtx>();
    rv = rados->ioctx_create(options_.pool.c_str(), *base);
    if (rv < 0) {
      base.reset();
      rados->shutdown();
      if (rv == -ENOENT) {
        return absl::NotFoundError(absl::StrCat("--remote-pool ", options_.pool,
                                                ": no such pool in the cluster of ",
                                                options_.conf_path));
      }
      return FromErrno(rv, absl::StrCat("--remote-pool ", options_.pool));
    }
    // A full pool fails writes at once (ENOSPC, EDQUOT) instead of holding
    // them until the deadline: write-behind then drops and counts.
    base->set_pool_full_try();
    absl::MutexLock ctx(&ctx_mu_);
    rados_ = std::move(rados);
    base_ = std::move(base);
    connected_.store(true, std::memory_order_release);
    return absl::OkStatus();
  }

  std::vector<absl::Status> Write(absl::Span<const ObjectWrite> writes) override {
    return Run(writes.size(), [&](size_t i, Op& op, librados::IoCtx& io) {
      const ObjectWrite& w = writes[i];
      if (w.exclusive) op.write.create(true);
      op.data.append(w.data.data(), w.data.size());
      op.record.append(w.record.data(), w.record.size());
      op.write.write_full(op.data);
      op.write.setxattr(kRecordAttr, op.record);
      return io.aio_operate(w.key.name, op.completion, &op.write);
    }, [&](size_t i) -> const ObjectKey& { return writes[i].key; }, nullptr);
  }

  std::vector<ObjectRead> Read(absl::Span<const ObjectKey> keys,
                               uint64_t max_data_bytes) override {
    std::vector<ObjectRead> out(keys.size());
    const std::vector<absl::Status> statuses =
        ReadEach(keys, max_data_bytes, [&](size_t i, const ObjectReadView& v) {
          ObjectRead& r = out[i];
          r.record.assign(v.record.data(), v.record.size());
          r.data.reserve(v.data_bytes);
          for (absl::string_view piece : v.data) r.data.append(piece.data(), piece.size());
        });
    for (size_t i = 0; i < keys.size(); ++i) {
      out[i].status = statuses[i];
      if (!out[i].status.ok()) {
        out[i].data.clear();
        out[i].record.clear();
      }
    }
    return out;
  }

  std::vector<absl::Status> ReadEach(
      absl::Span<const ObjectKey> keys, uint64_t max_data_bytes,
      const std::function<void(size_t i, const ObjectReadView& read)>& got) override {
    // One byte past the limit tells an object over it, without reading it.
    const uint64_t want = std::min<uint64_t>(max_data_bytes, 1ull << 40) + 1;
    std::vector<absl::Status> refused(keys.size());
    std::vector<absl::string_view> pieces;
    std::vector<absl::Status> statuses = Run(
        keys.size(),
        [&](size_t i, Op& op, librados::IoCtx& io) {
          op.read.getxattr(kRecordAttr, &op.record, &op.record_rv);
          op.read.read(0, want, &op.data, &op.data_rv);
          return io.aio_operate(keys[i].name, op.completion, &op.read, nullptr);
        },
        [&](size_t i) -> const ObjectKey& { return keys[i]; },
        [&](size_t i, Op& op) {
          // Runs as each read completes, in order, while later ones are in
          // flight; the views point into the op's bufferlists.
          if (op.record_rv < 0) {
            refused[i] = FromErrno(op.record_rv, Name(keys[i]));
            return;
          }
          if (op.data.length() > max_data_bytes) {
            refused[i] = absl::FailedPreconditionError(absl::StrCat(
                Name(keys[i]), ": data is larger than ", max_data_bytes, " bytes (not read)"));
            return;
          }
          pieces.clear();
          for (const auto& p : op.data.buffers()) {
            if (p.length() > 0) pieces.emplace_back(p.c_str(), p.length());
          }
          const absl::string_view record =
              op.record.length() > 0
                  ? absl::string_view(op.record.c_str(), op.record.length())
                  : absl::string_view();
          got(i, ObjectReadView{pieces, op.data.length(), record});
        });
    for (size_t i = 0; i < keys.size(); ++i) {
      if (statuses[i].ok() && !refused[i].ok()) statuses[i] = refused[i];
    }
    return statuses;
  }

  std::vector<absl::StatusOr<uint64_t>> Stat(absl::Span<const ObjectKey> keys) override {
    std::vector<uint64_t> sizes(keys.size(), 0);
    const std::vector<absl::Status> got = Run(
        keys.size(),
        [&](size_t i, Op& op, librados::IoCtx& io) {
          return io.aio_stat(keys[i].name, op.completion, &op.size, &op.mtime);
        },
        [&](size_t i) -> const ObjectKey& { return keys[i]; },
        [&](size_t i, Op& op) { sizes[i] = op.size; });
    std::vector<absl::StatusOr<uint64_t>> out;
    out.reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      out.push_back(got[i].ok() ? absl::StatusOr<uint64_t>(sizes[i])
                                : absl::StatusOr<uint64_t>(got[i]));
    }
    return out;
  }

  std::vector<absl::Status> Exists(absl::Span<const ObjectKey> keys) override {
    return Run(keys.size(), [&](size_t i, Op& op, librados::IoCtx& io) {
      return io.aio_stat(keys[i].name, op.completion, &op.size, &op.mtime);
    }, [&](size_t i) -> const ObjectKey& { return keys[i]; }, nullptr);
  }

  std::vector<absl::Status> Remove(absl::Span<const ObjectKey> keys) override {
    std::vector<absl::Status> out = Run(keys.size(), [&](size_t i, Op& op, librados::IoCtx& io) {
      return io.aio_remove(keys[i].name, op.completion);
    }, [&](size_t i) -> const ObjectKey& { return keys[i]; }, nullptr);
    for (absl::Status& s : out) {
      if (s.code() == absl::StatusCode::kNotFound) s = absl::OkStatus();
    }
    return out;
  }

  absl::StatusOr<ObjectStoreUsage> Usage() override {
    if (!connected()) return absl::UnavailableError("not connected");
    std::list<std::string> pools{options_.pool};
    librados::stats_map stats;
    const int rv = rados_->get_pool_stats(pools, stats);
    if (rv < 0) return FromErrno(rv, "pool stats");
    auto it = stats.find(options_.pool);
    if (it == stats.end()) return absl::NotFoundError("pool stats: pool missing");
    return ObjectStoreUsage{it->second.num_bytes, it->second.num_objects};
  }

  absl::StatusOr<std::vector<ListedObject>> List(const std::string& cursor, size_t max,
                                                 std::string* next) override {
    next->clear();
    if (!connected()) return absl::UnavailableError("not connected");
    librados::IoCtx all;
    {
      absl::MutexLock lock(&ctx_mu_);
      all.dup(*base_);
    }
    all.set_namespace(librados::all_nspaces);
    librados::ObjectCursor start = all.object_list_begin();
    if (!cursor.empty() && !start.from_str(cursor)) {
      return absl::InvalidArgumentError(absl::StrCat("list cursor '", cursor, "' does not parse"));
    }
    std::vector<librados::ObjectItem> items;
    librados::ObjectCursor after;
    const int rv = all.object_list(start, all.object_list_end(), max, {}, &items, &after);
    if (rv < 0) return FromErrno(rv, absl::StrCat("listing pool ", options_.pool));
    if (!all.object_list_is_end(after)) *next = after.to_str();
    // Write times, many stats in flight. An object removed since it was
    // listed is left out.
    std::vector<ListedObject> out(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      out[i].key = ObjectKey{std::move(items[i].nspace), std::move(items[i].oid)};
    }
    std::vector<absl::Status> stats = Run(
        out.size(),
        [&](size_t i, Op& op, librados::IoCtx& io) {
          return io.aio_stat(out[i].key.name, op.completion, &op.size, &op.mtime);
        },
        [&](size_t i) -> const ObjectKey& { return out[i].key; },
        [&](size_t i, Op& op) { out[i].mtime = absl::FromTimeT(op.mtime); });
    std::vector<ListedObject> listed;
    listed.reserve(out.size());
    for (size_t i = 0; i < out.size(); ++i) {
      if (stats[i].code() == absl::StatusCode::kNotFound) continue;
      if (!stats[i].ok()) return stats[i];
      listed.push_back(std::move(out[i]));
    }
    return listed;
  }

 private:
  static std::string Name(const ObjectKey& key) {
    return absl::StrCat("object ", key.ns.empty() ? "" : key.ns + "/", key.name);
  }

  // IoCtxFor returns the handle of namespace `ns` (created once, then
  // shared: librados handles are thread-safe once their namespace is set).
  librados::IoCtx* IoCtxFor(const std::string& ns) {
    absl::MutexLock lock(&ctx_mu_);
    auto it = ioctxs_.find(ns);
    if (it != ioctxs_.end()) return it->second.get();
    auto io = std::make_unique<librados::IoCtx>();
    io->dup(*base_);
    io->set_namespace(ns);
    return ioctxs_.emplace(ns, std::move(io)).first->second.get();
  }

  // Run submits n operations, at most options_.inflight at a time, waits for
  // every one and returns their statuses; `done` sees each completed one.
  template <typename Submit, typename KeyOf>
  std::vector<absl::Status> Run(size_t n, Submit submit, KeyOf key_of,
                                std::function<void(size_t, Op&)> done) {
    std::vector<absl::Status> out(n);
    if (!connected()) {
      std::fill(out.begin(), out.end(), absl::UnavailableError("not connected"));
      return out;
    }
    std::vector<Op> ops(n);
    std::deque<size_t> pending;
    const size_t window = static_cast<size_t>(std::max(1, options_.inflight));
    auto finish = [&](size_t i) {
      Op& op = ops[i];
      op.completion->wait_for_complete();
      const int rv = op.completion->get_return_value();
      op.completion->release();
      op.completion = nullptr;
      out[i] = FromErrno(rv, Name(key_of(i)));
      if (out[i].ok() && done) done(i, op);
    };
    for (size_t i = 0; i < n; ++i) {
      if (pending.size() >= window) {
        finish(pending.front());
        pending.pop_front();
      }
      Op& op = ops[i];
      op.completion = librados::Rados::aio_create_completion();
      const int rv = submit(i, op, *IoCtxFor(key_of(i).ns));
      if (rv < 0) {
        op.completion->release();
        op.completion = nullptr;
        out[i] = FromErrno(rv, Name(key_of(i)));
        continue;
      }
      pending.push_back(i);
    }
    while (!pending.empty()) {
      finish(pending.front());
      pending.pop_front();
    }
    return out;
  }

  const RadosOptions options_;
  absl::Mutex connect_mu_;
  absl::Mutex ctx_mu_;
  std::atomic<bool> connected_{false};
  std::unique_ptr<librados::Rados> rados_;
  std::unique_ptr<librados::IoCtx> base_;
  absl::flat_hash_map<std::string, std::unique_ptr<librados::IoCtx>> ioctxs_;
};

}  // namespace

std::unique_ptr<ObjectStore> NewRadosObjectStore(const RadosOptions& options) {
  return std::make_unique<RadosObjectStore>(options);
}

}  // namespace evoke

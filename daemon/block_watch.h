// WatchHub: the WatchBlocks streams. Each watcher reads the engine's
// BlockEventLog from its own position, filtered by what its caller may see
// (namespaces, trust groups) and by what it asked for; one pump thread
// hands new events to every watcher that is not writing, and a watcher's
// OnWriteDone sends its next batch at once. A watcher whose write has been
// stuck while the log moved on by more than the log holds (it stopped
// reading) is cancelled; its resume token then reports what it lost.
#ifndef EVOKE_DAEMON_BLOCK_WATCH_H_
#define EVOKE_DAEMON_BLOCK_WATCH_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/access_policy.h"
#include "evoke/v1/kvtier.pb.h"
#include "storage/block_events.h"

namespace evoke {

struct WatchHubOptions {
  // Past it: RESOURCE_EXHAUSTED; one uid may hold a quarter of it (at
  // least one), so that no tenant takes them all.
  size_t max_watchers = 256;
  size_t backlog_events = 0;   // The log's capacity (for the drop rule).
  size_t max_batch = 256;      // Events per message.
};

class WatchHub {
 public:
  // `log` must outlive the hub.
  WatchHub(BlockEventLog* log, WatchHubOptions options);
  ~WatchHub();
  WatchHub(const WatchHub&) = delete;
  WatchHub& operator=(const WatchHub&) = delete;

  // Watch starts a stream for `caller` (the request already checked for
  // access by the service). The reactor owns itself until the stream ends.
  grpc::ServerWriteReactor<v1::BlockEvents>* Watch(grpc::CallbackServerContext* context,
                                                   std::shared_ptr<const Caller> caller,
                                                   const v1::WatchBlocksRequest& request);

  // CloseAll ends every stream (UNAVAILABLE) and refuses new ones.
  void CloseAll();

  size_t watchers() const;
  uint64_t dropped() const;

  class Watcher;

 private:
  void PumpLoop();
  void Forget(Watcher* w, uid_t uid, bool dropped);

  BlockEventLog* const log_;
  const WatchHubOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Watcher*, std::weak_ptr<Watcher>> watchers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uid_t, size_t> per_uid_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread pump_;  // Started with the first watcher.
};

// RefusedWatch: a stream that ends at once with `status` (not OK).
grpc::ServerWriteReactor<v1::BlockEvents>* RefusedWatch(const absl::Status& status);

// Resume tokens: the log's epoch and the next seq, 16 bytes.
std::string ResumeToken(uint64_t epoch, uint64_t seq);

}  // namespace evoke

#endif  // EVOKE_DAEMON_BLOCK_WATCH_H_

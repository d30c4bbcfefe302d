// ObjectStore: the object operations the remote tier needs from a shared
// store (Ceph RADOS in production: storage/remote/rados_store.h), in batches that
// run concurrently.
#ifndef EVOKE_STORAGE_REMOTE_OBJECT_STORE_H_
#define EVOKE_STORAGE_REMOTE_OBJECT_STORE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace evoke {

// An object is named within a namespace (a RADOS namespace: evoke's
// namespaces map onto them one to one, so one tenant's objects are never
// listed, read or written under another's name).
struct ObjectKey {
  std::string ns;
  std::string name;
};

// One object to write: its data and its record (a small attribute stored
// with it atomically).
struct ObjectWrite {
  ObjectKey key;
  absl::string_view data;    // Must stay valid until Write returns.
  absl::string_view record;  // Likewise.
  // Create only: when the object exists, nothing is written and the result
  // is ALREADY_EXISTS (content-addressed objects: the first writer wins,
  // every later one is a no-op).
  bool exclusive = false;
};

struct ObjectRead {
  absl::Status status;  // OK, NOT_FOUND, or the error.
  std::string data;
  std::string record;
};

// An object ReadEach read: views of the store's own buffers, valid only
// during the callback. The data may come in several pieces, in order.
struct ObjectReadView {
  absl::Span<const absl::string_view> data;
  uint64_t data_bytes = 0;
  absl::string_view record;
};

// One object found by List, with the time it was last written.
struct ListedObject {
  ObjectKey key;
  absl::Time mtime;
};

// Occupancy of the store (the pool), refreshed now and then.
struct ObjectStoreUsage {
  uint64_t bytes = 0;
  uint64_t objects = 0;
};

// Every call submits its operations at once (up to the store's limit in
// flight), waits for all of them and returns one status per operation. A
// store never blocks past its operation deadline: an operation that does
// not complete in time fails with DEADLINE_EXCEEDED. Other errors:
// UNAVAILABLE (not connected, connection lost), RESOURCE_EXHAUSTED (full,
// quota), NOT_FOUND, ALREADY_EXISTS (exclusive write of an existing object),
// PERMISSION_DENIED. Thread-safe.
class ObjectStore {
 public:
  virtual ~ObjectStore() = default;

  // For logs and Stat, e.g. "rados pool evoke".
  virtual std::string Describe() const = 0;

  // Connect (re)connects; the other calls fail UNAVAILABLE until it has
  // succeeded once. Blocks up to the connect deadline.
  virtual absl::Status Connect() = 0;
  virtual bool connected() const = 0;

  virtual std::vector<absl::Status> Write(absl::Span<const ObjectWrite> writes) = 0;
  // Read returns each object's data and record in one round trip. Data past
  // `max_data_bytes` is never read: such an object is FAILED_PRECONDITION,
  // with no data.
  virtual std::vector<ObjectRead> Read(absl::Span<const ObjectKey> keys,
                                       uint64_t max_data_bytes) = 0;
  // ReadEach reads as Read does, and hands each object read to `got` as it
  // completes, in the order of `keys`, while the reads after it are still
  // in flight (so that the caller's work on one overlaps the transfer of
  // the next), without copying its bytes out of the store's buffers.
  // Returns one status per key; `got` runs for the OK ones only. The
  // default reads everything with Read first.
  virtual std::vector<absl::Status> ReadEach(
      absl::Span<const ObjectKey> keys, uint64_t max_data_bytes,
      const std::function<void(size_t i, const ObjectReadView& read)>& got) {
    std::vector<ObjectRead> all = Read(keys, max_data_bytes);
    std::vector<absl::Status> out;
    out.reserve(all.size());
    for (size_t i = 0; i < all.size(); ++i) {
      out.push_back(all[i].status);
      if (!all[i].status.ok()) continue;
      const absl::string_view piece(all[i].data);
      got(i, ObjectReadView{absl::MakeConstSpan(&piece, 1), piece.size(), all[i].record});
    }
    return out;
  }
  // Stat returns each object's data size without reading it (NOT_FOUND for
  // an absent one).
  virtual std::vector<absl::StatusOr<uint64_t>> Stat(absl::Span<const ObjectKey> keys) = 0;
  // Exists checks presence without reading data.
  virtual std::vector<absl::Status> Exists(absl::Span<const ObjectKey> keys) = 0;
  // Remove deletes objects; absent ones are OK.
  virtual std::vector<absl::Status> Remove(absl::Span<const ObjectKey> keys) = 0;
  virtual absl::StatusOr<ObjectStoreUsage> Usage() = 0;
  // List pages through the objects of every namespace: up to `max` from
  // `cursor` ("" = the start), with their write times. `*next` is the
  // cursor of the next page, "" after the last. Objects written or removed
  // meanwhile may or may not be listed.
  virtual absl::StatusOr<std::vector<ListedObject>> List(const std::string& cursor, size_t max,
                                                         std::string* next) = 0;
};

}  // namespace evoke

#endif  // EVOKE_STORAGE_REMOTE_OBJECT_STORE_H_

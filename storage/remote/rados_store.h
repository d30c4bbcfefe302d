// RadosObjectStore: the ObjectStore over Ceph RADOS (librados, the official
// client). Built only with EVOKE_WITH_RADOS. Placement, replication and
// recovery are Ceph's; this file only maps evoke's batched calls onto
// librados' asynchronous operations.
#ifndef EVOKE_STORAGE_REMOTE_RADOS_STORE_H_
#define EVOKE_STORAGE_REMOTE_RADOS_STORE_H_

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "storage/remote/object_store.h"

namespace evoke {

struct RadosOptions {
  std::string conf_path;   // ceph.conf (monitors, auth). Required.
  std::string pool = "evoke";
  std::string user = "client.admin";
  std::string keyring;     // Empty: what ceph.conf says.
  // Deadline of every operation (rados_osd_op_timeout,
  // rados_mon_op_timeout, client_mount_timeout; whole seconds, at least 1).
  // librados' default is to wait forever.
  absl::Duration op_timeout = absl::Seconds(5);
  int inflight = 16;       // Operations in flight per call.
};

// NewRadosObjectStore returns a store that connects on Connect(). Errors of
// Connect name the option at fault: the conf path, the monitors, the pool.
std::unique_ptr<ObjectStore> NewRadosObjectStore(const RadosOptions& options);

}  // namespace evoke

#endif  // EVOKE_STORAGE_REMOTE_RADOS_STORE_H_

// Passing file descriptors over Unix sockets (SCM_RIGHTS), and the FdChannel
// registration protocol built on it (proto/evoke/v1/kvtier.proto,
// "FdChannel"): the client registers a sealed memfd, the daemon receives it,
// and the end-to-end tests send hostile requests, all with this one codec.
#ifndef EVOKE_COMMON_FD_PASSING_H_
#define EVOKE_COMMON_FD_PASSING_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace evoke {

// UniqueFd owns a file descriptor and closes it on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) Reset(std::exchange(o.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Release gives up ownership and returns the descriptor.
  int Release() { return std::exchange(fd_, -1); }
  // Reset closes the descriptor held (if any) and takes `fd`.
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

// ConnectUnixSocket returns a SOCK_STREAM socket (close-on-exec) connected to
// the Unix socket at `path`. INVALID_ARGUMENT when the path does not fit in
// sun_path; UNAVAILABLE "socket: <errno>" or "connect <path>: <errno>".
absl::StatusOr<UniqueFd> ConnectUnixSocket(const std::string& path);

// SendWithFds sends `data` (non-empty: the descriptors ride on its first
// byte) in ONE sendmsg whose ancillary data carries `fds` as SCM_RIGHTS (no
// ancillary data when `fds` is empty). MSG_NOSIGNAL: a closed peer is an
// error, not SIGPIPE. The caller keeps its own copies of `fds`.
// UNAVAILABLE "sendmsg: <errno>" when it fails or sends only part of `data`.
absl::Status SendWithFds(int sock, absl::string_view data, absl::Span<const int> fds);

// What ReceiveWithFds read.
struct ReceivedWithFds {
  // Up to the `size` bytes asked for: fewer when the peer closed, the
  // socket's receive timeout (SO_RCVTIMEO) passed or a read failed first.
  std::string data;
  // Every descriptor that arrived, in order, close-on-exec. They close with
  // this struct unless released.
  std::vector<UniqueFd> fds;
  // The kernel dropped descriptors that did not fit the room given
  // (MSG_CTRUNC): the sender sent more than `max_fds_per_read`.
  bool fds_truncated = false;
  // Why the read stopped short ("" when data is complete): "peer closed" or
  // the errno text (e.g. "Resource temporarily unavailable" on a timeout).
  std::string stopped;
};

// ReceiveWithFds reads up to `size` bytes from `sock` with as many recvmsg
// calls as it takes, collecting SCM_RIGHTS descriptors from each (room for
// `max_fds_per_read` per call). A sender's descriptors ride on the first
// bytes of its message, so later reads normally carry only data. Never
// fails: a short read is reported in the result (see `stopped`).
ReceivedWithFds ReceiveWithFds(int sock, size_t size, size_t max_fds_per_read = 4);

// ReceiveAvailable continues `into` toward `size` bytes with non-blocking
// reads (MSG_DONTWAIT), collecting descriptors as ReceiveWithFds does,
// until all have arrived (kComplete), nothing more has arrived yet
// (kWouldBlock), or the peer closed or a read failed (kStopped, with
// `into->stopped` set). For event loops: it never waits.
enum class ReceiveProgress { kComplete, kWouldBlock, kStopped };
ReceiveProgress ReceiveAvailable(int sock, size_t size, ReceivedWithFds* into,
                                 size_t max_fds_per_read = 4);

// ReadFull reads exactly `size` bytes. UNAVAILABLE "<what>: peer closed after
// N of M bytes" (or the errno text) when they do not all arrive.
absl::StatusOr<std::string> ReadFull(int sock, size_t size, absl::string_view what);

// ---------------------------------------------------------------------------
// The FdChannel protocol. A request is one message with one descriptor:
//   "EVKFD001"  8 bytes magic
//   lease_id    16 bytes
//   u64 size    little endian
// and the reply is u32 code, u64 region id, u32 length, then that many bytes
// of error message (all little endian).

inline constexpr char kFdChannelMagic[8] = {'E', 'V', 'K', 'F', 'D', '0', '0', '1'};
inline constexpr size_t kFdChannelRequestBytes = 8 + 16 + 8;
inline constexpr size_t kFdChannelReplyHeadBytes = 4 + 8 + 4;

// EncodeFdChannelRequest returns the request body for `lease_id` (16 bytes
// from LeaseGrant; other lengths are encoded as given, for tests) and the
// region's `size`.
std::string EncodeFdChannelRequest(absl::string_view lease_id, uint64_t size);

struct FdChannelRequest {
  std::string lease_id;
  uint64_t size = 0;
  UniqueFd fd;  // Set by ReceiveFdChannelRequest.
};

// DecodeFdChannelRequest parses a request body (fd unset). INVALID_ARGUMENT
// "request: short or timed out" when shorter than kFdChannelRequestBytes,
// "request: bad magic (want EVKFD001)" when the magic differs.
absl::StatusOr<FdChannelRequest> DecodeFdChannelRequest(absl::string_view body);

// ReceiveFdChannelRequest reads one request and its descriptor from `sock`
// (the caller bounds the wait with SO_RCVTIMEO). INVALID_ARGUMENT, checked in
// this order: "request: short or timed out", "request: bad magic (want
// EVKFD001)", "fd: exactly one file descriptor must come with the request
// (SCM_RIGHTS), got N" (" or more" appended when the kernel dropped some).
// Every received descriptor is closed on every error.
absl::StatusOr<FdChannelRequest> ReceiveFdChannelRequest(int sock);

// ParseFdChannelRequest checks what was received of a request, as
// ReceiveFdChannelRequest does, and takes its descriptor.
absl::StatusOr<FdChannelRequest> ParseFdChannelRequest(ReceivedWithFds received);

// EncodeFdChannelReply returns the reply carrying `status` and `region_id`.
std::string EncodeFdChannelReply(const absl::Status& status, uint64_t region_id);

// SendFdChannelReply writes the reply; best effort (a client that went away
// loses its answer, nothing else). With `nonblocking`, it never waits
// (MSG_DONTWAIT): a reply that does not fit the socket's buffer at once is
// cut short, which for a fresh connection cannot happen (a reply is a few
// hundred bytes).
void SendFdChannelReply(int sock, const absl::Status& status, uint64_t region_id,
                        bool nonblocking = false);

// The daemon's answer: its status (the code and message it sent) and, when
// OK, the new region's id.
struct FdChannelReply {
  absl::Status status;
  uint64_t region_id = 0;
};

// ReadFdChannelReply reads one reply. UNAVAILABLE "fd socket closed before
// replying" when its head does not arrive; a message cut short is kept as far
// as it arrived.
absl::StatusOr<FdChannelReply> ReadFdChannelReply(int sock);

// SendFdChannelRequest connects to the FdChannel at `path`, sends `body` with
// `fds` (exactly one for a valid request; tests send others), and reads the
// reply (also when the send failed because the daemon answered first and
// closed, e.g. too many connections). Errors (UNAVAILABLE) are about the
// exchange; the daemon's verdict is in the reply's status.
absl::StatusOr<FdChannelReply> SendFdChannelRequest(const std::string& path,
                                                    absl::string_view body,
                                                    absl::Span<const int> fds);

}  // namespace evoke

#endif  // EVOKE_COMMON_FD_PASSING_H_

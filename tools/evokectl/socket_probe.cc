#include "tools/evokectl/socket_probe.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace evoke::ctl {
namespace {

const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISFIFO(mode)) return "a named pipe";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "not a socket";
}

}  // namespace

absl::Status ProbeUnixSocket(const std::string& path) {
  const std::string head = absl::StrCat("cannot reach evoked at unix:", path, ": ");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == EACCES) {
      return absl::PermissionDeniedError(absl::StrCat(
          head, "permission denied on its directory (is this user in the socket's group?)"));
    }
    if (err == ENOENT || err == ENOTDIR) {
      return absl::UnavailableError(
          absl::StrCat(head, "no such socket (is it running? set --socket or EVOKE_SOCKET)"));
    }
    return absl::UnavailableError(absl::StrCat(head, std::strerror(err)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::UnavailableError(absl::StrCat(
        head, "it is ", KindOf(st.st_mode), ", not a socket (set --socket or EVOKE_SOCKET)"));
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::UnavailableError(absl::StrCat(head, "the path is longer than ",
                                               sizeof(addr.sun_path) - 1,
                                               " bytes, the most a Unix socket address holds"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat(head, "socket: ", std::strerror(errno)));
  // A non-blocking Unix-domain connect never waits for the listener: it
  // succeeds (queued in the backlog) or fails at once, refused or with
  // EAGAIN when the backlog is full (a blocking one would wait there).
  const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  ::close(fd);
  if (rc == 0) return absl::OkStatus();
  switch (err) {
    case ECONNREFUSED:
      return absl::UnavailableError(absl::StrCat(
          head, "nothing listens on it (a stale socket file: evoked stopped without removing "
                "it, or is not running)"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(absl::StrCat(
          head, "permission denied on the socket (is this user in the socket's group?)"));
    case EAGAIN:
      return absl::UnavailableError(
          absl::StrCat(head, "its listener's backlog is full (evoked is overloaded or stuck)"));
    default:
      return absl::UnavailableError(absl::StrCat(head, "connect: ", std::strerror(err)));
  }
}

}  // namespace evoke::ctl

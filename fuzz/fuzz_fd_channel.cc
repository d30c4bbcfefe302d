// fuzz_fd_channel: the shared-memory registration socket (FdChannel,
// daemon/fd_channel.h; protocol in proto/evoke/v1/kvtier.proto), over a real
// Unix socket, against the real channel thread, parser (common/fd_passing.h)
// and LeaseManager, in process.
//
// One input is one client connection (FuzzedDataProvider): the request bytes
// (a valid "EVKFD001" header with this run's lease id and a size, with a
// field spoiled, or raw bytes), cut into 1..4 sends, each carrying 0..3
// descriptors of any kind: a sealed memfd of the declared size or another
// size (or sealed against shrinking only), an unsealed one, a pipe, a
// directory, /dev/zero, a socket; then the
// client half-closes, or not (the channel's deadline answers that one).
//
// Checked:
//   - the reply is well formed: a code that is a google.rpc.Code, a message
//     of exactly the length it states, a region id only with OK;
//   - OK exactly when one memfd sealed against shrinking and growing, of
//     the declared (non-zero) size, came with a whole request for this lease;
//   - every descriptor the daemon received is closed again (the process's
//     open descriptors are the same before and after, once the region is
//     removed), whatever was sent.
#include <dirent.h>
#include <fcntl.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "daemon/fd_channel.h"
#include "daemon/lease_manager.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_engine.h"
#include "testing/memory_tier.h"

namespace evoke {
namespace {

size_t OpenFds() {
  size_t n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  FUZZ_CHECK(d != nullptr);
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n - 1;  // The directory's own descriptor.
}

struct Daemon {
  std::unique_ptr<TierManager> tiers;
  std::unique_ptr<LeaseManager> leases;
  std::unique_ptr<FdChannel> channel;
  std::string dir;

  Daemon() {
    TierManagerOptions options;
    options.copy_threads = 0;
    tiers = fuzz::OpenMemoryEngine(options, std::make_unique<testing::MemoryTier>());
    leases = std::make_unique<LeaseManager>(LeaseManagerOptions(), tiers.get());
    char tmpl[] = "/tmp/fuzz_fd_channel.XXXXXX";
    FUZZ_CHECK(::mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    FdChannelOptions channel_options;
    channel_options.connection_timeout = absl::Milliseconds(50);
    absl::StatusOr<std::unique_ptr<FdChannel>> c =
        FdChannel::Start(dir + "/fd.sock", leases.get(), channel_options);
    FUZZ_CHECK(c.ok());
    channel = std::move(*c);
  }
};

int Connect(const std::string& path) {
  const int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  FUZZ_CHECK(s >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  // libFuzzer's -timeout alarm (SIGALRM, no SA_RESTART) interrupts blocking
  // calls here: each one is retried.
  int rc;
  do {
    rc = ::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  FUZZ_CHECK(rc == 0);
  return s;
}

// A descriptor of the kind the input picks (the caller closes it). *good is
// set when it is a memfd sealed against shrinking of `size` bytes.
int MakeFd(FuzzedDataProvider& in, uint64_t size, bool* good) {
  *good = false;
  switch (in.ConsumeIntegralInRange<int>(0, 6)) {
    case 0: case 1: {  // Sealed memfd, the declared size or another.
      const int fd = ::memfd_create("r", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      const bool exact = in.ConsumeIntegralInRange<int>(0, 3) != 0;
      const uint64_t real = exact ? size : in.ConsumeIntegralInRange<uint64_t>(0, 1 << 16);
      const bool grow_sealed = in.ConsumeIntegralInRange<int>(0, 5) != 0;
      FUZZ_CHECK(::ftruncate(fd, static_cast<off_t>(real)) == 0);
      FUZZ_CHECK(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | (grow_sealed ? F_SEAL_GROW : 0)) == 0);
      *good = real == size && grow_sealed;
      return fd;
    }
    case 2: {  // Unsealed memfd.
      const int fd = ::memfd_create("r", MFD_CLOEXEC);
      FUZZ_CHECK(::ftruncate(fd, static_cast<off_t>(size)) == 0);
      return fd;
    }
    case 3: {
      int p[2];
      FUZZ_CHECK(::pipe2(p, O_CLOEXEC) == 0);
      ::close(p[1]);
      return p[0];
    }
    case 4: return ::open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    case 5: return ::open("/dev/zero", O_RDWR | O_CLOEXEC);
    default: return ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  }
}

// Returns false when it had to add a byte (descriptors ride on data).
bool SendWithFds(int sock, const std::string& bytes, const std::vector<int>& fds) {
  if (bytes.empty() && fds.empty()) return true;
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  char dummy = 0;
  if (bytes.empty()) iov = {&dummy, 1};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * 3), 0);
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  // The daemon may have closed already.
  ssize_t sent;
  do {
    sent = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  return !bytes.empty();
}

void Run(FuzzedDataProvider& in) {
  static Daemon* d = new Daemon();
  absl::StatusOr<Lease> lease = d->leases->Grant("fuzz");
  FUZZ_CHECK(lease.ok());
  const size_t fds_before = OpenFds();

  const uint64_t size = in.ConsumeIntegralInRange<uint64_t>(0, 1 << 16);
  std::string header("EVKFD001", 8);
  header += lease->id.ToBytes();
  for (int i = 0; i < 8; ++i) header.push_back(static_cast<char>(size >> (8 * i)));
  std::string request = header;
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: request = in.ConsumeRandomLengthString(64); break;
    case 1: {
      const size_t at = in.ConsumeIntegralInRange<size_t>(0, request.size() - 1);
      request[at] = static_cast<char>(request[at] ^ (1 + in.ConsumeIntegralInRange<int>(0, 254)));
      break;
    }
    case 2: request.resize(in.ConsumeIntegralInRange<size_t>(0, request.size())); break;
    case 3: request += in.ConsumeRandomLengthString(8); break;
    default: break;
  }
  // What the daemon reads: the first 32 bytes of the stream, and the
  // descriptors that ride on the messages that start within them (it never
  // reads past a whole request).
  const int sock = Connect(d->channel->path());
  const size_t sends = in.ConsumeIntegralInRange<size_t>(1, 4);
  std::string stream;
  size_t sent = 0, fds_read = 0, good_read = 0;
  for (size_t k = 0; k < sends; ++k) {
    const size_t len = k + 1 == sends ? request.size() - sent
                                      : in.ConsumeIntegralInRange<size_t>(0, request.size() - sent);
    std::vector<int> fds;
    size_t good_here = 0;
    for (int n = in.ConsumeIntegralInRange<int>(0, k == 0 ? 3 : 1); n > 0; --n) {
      bool good = false;
      const int fd = MakeFd(in, size, &good);
      if (fd < 0) continue;
      fds.push_back(fd);
      good_here += good;
    }
    const std::string bytes = request.substr(sent, len);
    const bool whole = SendWithFds(sock, bytes, fds);
    if (stream.size() < 32 && !fds.empty()) {
      fds_read += fds.size();
      good_read += good_here;
    }
    stream += whole ? bytes : std::string(1, '\0');  // The byte fds ride on.
    for (int fd : fds) ::close(fd);
    sent += len;
  }
  if (in.ConsumeBool()) ::shutdown(sock, SHUT_WR);

  // The reply: u32 code, u64 region, u32 length, message.
  // Read until the daemon closes, or 2 s pass without a byte.
  std::string reply;
  pollfd p{sock, POLLIN, 0};
  for (;;) {
    const int ready = ::poll(&p, 1, 2000);
    if (ready < 0 && errno == EINTR) continue;
    if (ready != 1) break;
    char buf[4096];
    const ssize_t r = ::read(sock, buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    reply.append(buf, static_cast<size_t>(r));
  }
  ::close(sock);
  FUZZ_CHECK(reply.size() >= 16);
  uint32_t code, length;
  uint64_t region;
  std::memcpy(&code, reply.data(), 4);
  std::memcpy(&region, reply.data() + 4, 8);
  std::memcpy(&length, reply.data() + 12, 4);
  FUZZ_CHECK(code <= 16);
  FUZZ_CHECK(reply.size() == 16 + static_cast<size_t>(length));
  // Exactly one descriptor, the right kind and size, with a whole request
  // (sent in pieces or not) and a positive size.
  const bool expect_ok = stream.size() >= 32 && stream.compare(0, 32, header) == 0 &&
                         fds_read == 1 && good_read == 1 && size > 0;
  if (code == 0 && !expect_ok) {
    fprintf(stderr, "registered: stream %zu bytes, %zu fds read (%zu good), size %lu\n",
            stream.size(), fds_read, good_read, static_cast<unsigned long>(size));
  }
  if (code == 0) {
    FUZZ_CHECK(expect_ok);
    FUZZ_CHECK(d->leases->RemoveRegion(lease->id, region).ok());
  } else if (expect_ok) {
    fprintf(stderr, "refused a valid registration: code %u: %s\n", code,
            reply.substr(16).c_str());
    FUZZ_CHECK(!expect_ok);
  }
  d->leases->End(lease->id);
  // Every descriptor the daemon received is closed again (the channel's
  // thread closes them as it finishes the connection, after its reply).
  size_t now = OpenFds();
  for (int i = 0; i < 1000 && now != fds_before; ++i) {
    ::usleep(1000);
    now = OpenFds();
  }
  if (now != fds_before) fprintf(stderr, "fds: %zu before, %zu after\n", fds_before, now);
  FUZZ_CHECK(now == fds_before);
}

}  // namespace
}  // namespace evoke

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ::signal(SIGPIPE, SIG_IGN);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  evoke::Run(in);
  return 0;
}

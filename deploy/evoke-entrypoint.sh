#!/bin/sh
# Entrypoint of the evoke image: runs evoked (or any command, e.g. evokectl)
# as the unprivileged user evoke, and makes tier 1's mlock actually work.
#
#   evoke-entrypoint [--config FILE ...]      evoked with these flags
#   evoke-entrypoint PROGRAM [ARGS...]        PROGRAM as evoke (evokectl ...)
#
# Why it exists: tier 1 is mlocked. A non-root process may lock only
# RLIMIT_MEMLOCK bytes (8 MiB by default) unless it holds CAP_IPC_LOCK, and
# a capability added to a container that runs as a non-root user never
# reaches that user's process: execve() clears it (Kubernetes sets no
# ambient capabilities). Kubernetes cannot set rlimits per pod either, and
# raising the hard RLIMIT_MEMLOCK needs CAP_SYS_RESOURCE, a far broader
# capability. So in Kubernetes the container starts as root with exactly
# CAP_SETUID, CAP_SETGID and CAP_IPC_LOCK, and this script switches to
# EVOKE_UID:EVOKE_GID (default 10001:10001) with setpriv (util-linux, part
# of every Debian), keeping CAP_IPC_LOCK as an ambient capability for evoked
# alone. evoked then runs as 10001 with no capability but CAP_IPC_LOCK, no
# supplementary groups and no_new_privs.
#
# Started as a non-root user (the image's default USER, e.g. `docker run
# --ulimit memlock=-1 ...`), it just runs the command: the memlock limit is
# then the container runtime's. Either way evoked logs
# "tier 1 is not locked in RAM: <reason>" when mlock fails.
set -eu

uid="${EVOKE_UID:-10001}"
gid="${EVOKE_GID:-10001}"

case "${1:-}" in
  "" | -*) set -- /usr/local/bin/evoked "$@" ;;
esac

if [ "$(id -u)" != 0 ]; then
  exec "$@"
fi
if [ "$uid" = 0 ] || [ "$gid" = 0 ]; then
  echo "evoke-entrypoint: EVOKE_UID/EVOKE_GID must not be 0" >&2
  exit 2
fi

# CAP_IPC_LOCK (bit 14) can be kept only if the container was given it;
# without it evoked still starts, unlocked, and says so in its log.
caps="--inh-caps=-all"
case "$(basename "$1")" in
  evoked)
    eff="$(sed -n 's/^CapEff:[[:space:]]*//p' /proc/self/status)"
    if [ -n "$eff" ] && [ $(( (0x$eff >> 14) & 1 )) = 1 ]; then
      caps="--inh-caps=-all,+ipc_lock --ambient-caps=-all,+ipc_lock"
    else
      echo "evoke-entrypoint: no CAP_IPC_LOCK in this container; tier 1 is locked" \
           "only up to RLIMIT_MEMLOCK ($(prlimit --memlock --noheadings --output SOFT)" \
           "bytes)" >&2
    fi
    ;;
esac

# shellcheck disable=SC2086  # $caps is two words on purpose.
exec setpriv --reuid="$uid" --regid="$gid" --clear-groups --no-new-privs $caps -- "$@"

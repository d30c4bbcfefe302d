#!/usr/bin/env bash
# ceph-dev-cluster.sh: a throwaway Ceph cluster on loopback, for evoke's remote
# tier (issue #14): its end-to-end tests, benchmarks and trying it by hand.
#
#   scripts/ceph-dev-cluster.sh start DIR [NOSD]   start 1 mon, 1 mgr and NOSD (3)
#                                                 memstore OSDs; create pool `evoke`
#                                                 (size 3, min_size 2) and wait until
#                                                 all its PGs are active+clean; print
#                                                 the path of the cluster's ceph.conf
#   scripts/ceph-dev-cluster.sh stop DIR           kill -9 every daemon, wait until gone
#   scripts/ceph-dev-cluster.sh freeze DIR         kill -STOP every daemon ("the whole
#                                                 cluster is down": clients time out,
#                                                 nothing is lost)
#   scripts/ceph-dev-cluster.sh thaw DIR           kill -CONT every daemon
#   scripts/ceph-dev-cluster.sh kill-osd DIR ID    kill -9 OSD ID (memstore: its copy is
#                                                 gone; it is not restarted)
#   scripts/ceph-dev-cluster.sh status DIR         daemons, their state, `ceph -s`
#
# Then: ceph -c DIR/ceph.conf -s ; rados -c DIR/ceph.conf -p evoke ls ;
#       evoked --remote-conf DIR/ceph.conf --remote-pool evoke ...
#
# Everything lives under DIR (created if missing): ceph.conf, mon/mgr/osd data,
# logs in DIR/log, admin sockets in DIR/run, daemon pids in DIR/pids. No auth,
# no systemd, nothing outside DIR; ports are a random private block (mon at
# BASE/BASE+1, the others in BASE+10..BASE+99), and start picks another block
# when a port is taken. OSDs keep objects in RAM (memstore), so a stopped
# cluster is gone: `stop` then `rm -rf DIR`.
#
# Each daemon runs in the foreground (-f) as a background job of `start`, and
# its pid is recorded by this script (Ceph's own daemonizing left zombies that
# nobody reaped here). When `start` exits they are orphans: a caller that
# wants to reap them sets PR_SET_CHILD_SUBREAPER (testing/ceph_cluster.cc
# does). A pid is only signalled while /proc/PID/cmdline still names this
# DIR's ceph.conf, so a reused pid is never hit.
#
# Environment:
#   MEMSTORE_BYTES         RAM limit of each OSD's store (default 1 GiB; allocated
#                          only as objects are written). 3 replicas: 1 MiB written
#                          costs 3 MiB of RAM.
#   CEPH_DEV_POOL          pool name (default evoke); CEPH_DEV_PGS: its PGs (32)
#   CEPH_PORT_BASE         first port (default: random in 20000..39900)
#   CEPH_DEV_TIMEOUT       seconds `start` may take before it gives up (90)
#   CEPH_DEV_OWNER_PID     when set, a watchdog kills the cluster once that
#                          process is gone (tests: no daemons outlive a killed test)
#
# Needs (Debian 12): ceph-mon ceph-osd ceph-mgr ceph-common (scripts/setup-debian.sh).
# Exit status: 0 on success; 1 with the reason on stderr (and the log tail of
# the daemon concerned) otherwise; 2 for a usage error.
set -euo pipefail

usage() {
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

die() {
  echo "ceph-dev-cluster: $*" >&2
  exit 1
}

[[ $# -ge 2 ]] || usage
CMD=$1
DIR=$2
POOL=${CEPH_DEV_POOL:-evoke}

# ---------------------------------------------------------------------------
# Pids: DIR/pids/<name>.pid for each daemon (mon.a, mgr.x, osd.N), and
# DIR/pids/watchdog for the owner watchdog (not a cluster daemon: freeze leaves
# it alone).

# alive PID: the process exists and is not a zombie.
alive() {
  local st
  [[ -r /proc/$1/stat ]] || return 1
  st=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [[ -n $st && $st != Z && $st != X ]]
}

# ours PID: a live process started with this cluster's ceph.conf.
ours() {
  alive "$1" && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$DIR/ceph.conf"
}

# daemon_pids: "name pid" for every recorded daemon.
daemon_pids() {
  local f
  for f in "$DIR"/pids/*.pid; do
    [[ -f $f ]] || continue
    echo "$(basename "$f" .pid) $(cat "$f")"
  done
}

# signal_all SIG: SIG to every live daemon of this cluster.
signal_all() {
  local name pid
  while read -r name pid; do
    if ours "$pid"; then kill "-$1" "$pid" 2>/dev/null || true; fi
  done < <(daemon_pids)
}

# wait_stopped: until every daemon is stopped (state T), 10 s at most:
# SIGSTOP is delivered asynchronously, and a busy machine may take a while
# to stop every thread, so `freeze` returning means frozen.
wait_stopped() {
  local name pid i st
  while read -r name pid; do
    ours "$pid" || continue
    for ((i = 0; i < 200; i++)); do
      st=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)
      [[ $st == T || -z $st ]] && break
      sleep 0.05
    done
    [[ $st == T || -z $st ]] || die "$name (pid $pid) did not stop after SIGSTOP"
  done < <(daemon_pids)
}

# wait_gone PID...: until each is gone or a zombie (10 s at most).
wait_gone() {
  local p i
  for p in "$@"; do
    for ((i = 0; i < 200; i++)); do
      alive "$p" || break
      sleep 0.05
    done
    alive "$p" && die "pid $p did not exit after SIGKILL"
  done
  return 0
}

kill_all() {
  local name pid pids=()
  while read -r name pid; do
    if ours "$pid"; then
      kill -9 "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done < <(daemon_pids)
  if [[ -f $DIR/pids/watchdog ]]; then
    pid=$(cat "$DIR/pids/watchdog")
    # The watchdog is a bash subshell of `start`; its cmdline is start's.
    if alive "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "ceph-dev-cluster"; then
      kill -9 "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  fi
  ((${#pids[@]} == 0)) || wait_gone "${pids[@]}"
}

# ---------------------------------------------------------------------------
# start

# ceph_cli ARGS...: the ceph CLI against this cluster, bounded in time.
ceph_cli() {
  timeout 30 ceph -c "$CONF" --connect-timeout 20 "$@"
}

remaining() { echo $((DEADLINE - SECONDS)); }

check_deadline() {
  ((SECONDS < DEADLINE)) || fail_start "took more than ${CEPH_DEV_TIMEOUT:-90} s ($*)"
}

# fail_start REASON: stop what was started, print the reason and log tails.
fail_start() {
  kill_all 2>/dev/null || true
  {
    echo "ceph-dev-cluster: start failed: $*"
    local f
    for f in "$DIR"/log/*.log "$DIR"/log/*.out; do
      [[ -s $f ]] || continue
      echo "---- tail of $f"
      tail -n 15 "$f"
    done
  } >&2
  exit 1
}

port_taken() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

write_conf() {
  cat >"$CONF" <<CONF
[global]
fsid = $FSID
mon host = [v2:127.0.0.1:$MONP2,v1:127.0.0.1:$MONP1]
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind port min = $MSMIN
ms bind port max = $MSMAX
# A taken port fails fast (default: 3 tries 5 s apart), so start tries others.
ms bind retry count = 1
ms bind retry delay = 1
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = false
keyring = /dev/null
run dir = $DIR/run
admin socket = $DIR/run/\$name.asok
log file = $DIR/log/\$name.log
crash dir = $DIR/crash
mon data = $DIR/mon/\$name
mgr data = $DIR/mgr/\$name
osd data = $DIR/osd/\$name
osd objectstore = memstore
memstore device bytes = ${MEMSTORE_BYTES:-1073741824}
# One host: replicas go to different OSDs, not hosts.
osd crush chooseleaf type = 0
osd pool default size = 3
osd pool default min size = 2
osd pool default pg autoscale mode = off
mon allow pool delete = true
mon allow pool size one = true
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim allowed = false
mon data avail warn = 1
# A killed OSD is never marked out: no rebalancing in the middle of a test.
mon osd down out interval = 0
mon warn on osd down out interval zero = false
mon osd report timeout = 30
# A kill -9'd OSD is marked down in ~6-8 s instead of ~20 s.
osd heartbeat grace = 6
osd heartbeat interval = 2
osd memory target = 939524096
CONF
}

# spawn NAME CMD...: CMD in the foreground of a background job, pid recorded.
# Its streams go to DIR/log/NAME.out, so no caller's pipe is held open.
spawn() {
  local name=$1
  shift
  "$@" </dev/null >>"$DIR/log/$name.out" 2>&1 &
  echo $! >"$DIR/pids/$name.pid"
}

# start_mon: one attempt on the current ports; 0 when the mon has quorum.
start_mon() {
  monmaptool --create --clobber --addv a "[v2:127.0.0.1:$MONP2,v1:127.0.0.1:$MONP1]" \
    --fsid "$FSID" "$DIR/monmap" >/dev/null
  ceph-mon -c "$CONF" --mkfs -i a --monmap "$DIR/monmap" --keyring /dev/null \
    >>"$DIR/log/mkfs.out" 2>&1 || fail_start "ceph-mon --mkfs failed"
  spawn mon.a ceph-mon -f -c "$CONF" -i a
  local pid i
  pid=$(cat "$DIR/pids/mon.a.pid")
  # Quorum of one: the mon answers `mon stat` once it listens and has formed it.
  for ((i = 0; i < 60; i++)); do
    alive "$pid" || return 1  # e.g. its port was taken between the check and the bind
    if timeout 5 ceph -c "$CONF" --connect-timeout 4 mon stat >/dev/null 2>&1; then return 0; fi
    check_deadline "waiting for the monitor's quorum"
    sleep 0.2
  done
  return 1
}

start() {
  local nosd=$1
  [[ $nosd =~ ^[1-9][0-9]*$ ]] || die "NOSD must be a positive number, got '$nosd'"
  local prog
  for prog in ceph-mon ceph-mgr ceph-osd ceph monmaptool; do
    command -v "$prog" >/dev/null ||
      die "$prog is not installed (Debian: apt-get install ceph-mon ceph-osd ceph-mgr ceph-common, or scripts/setup-debian.sh)"
  done
  mkdir -p "$DIR"
  DIR=$(cd "$DIR" && pwd)
  CONF=$DIR/ceph.conf
  if [[ -d $DIR/pids ]] && [[ -n $(daemon_pids) ]]; then
    local name pid
    while read -r name pid; do
      ours "$pid" && die "a cluster already runs in $DIR ($name, pid $pid): stop it first"
    done < <(daemon_pids)
  fi
  rm -rf "${DIR:?}"/{run,log,mon,mgr,osd,pids,crash} "$DIR/monmap"
  mkdir -p "$DIR"/{run,log,mon,mgr,osd,pids,crash}
  DEADLINE=$((SECONDS + ${CEPH_DEV_TIMEOUT:-90}))

  if [[ -n ${CEPH_DEV_OWNER_PID:-} ]]; then
    local owner=$CEPH_DEV_OWNER_PID
    # Not `spawn`: this subshell must keep running after start exits, and
    # its cmdline is this script's (kill_all checks that).
    (
      trap '' HUP INT
      while kill -0 "$owner" 2>/dev/null; do sleep 1; done
      signal_all 9
    ) </dev/null >/dev/null 2>&1 &
    echo $! >"$DIR/pids/watchdog"
  fi

  local attempt ok=0
  for attempt in 1 2 3 4 5; do
    BASE=${CEPH_PORT_BASE:-$((20000 + (RANDOM % 200) * 100))}
    MONP1=$BASE MONP2=$((BASE + 1)) MSMIN=$((BASE + 10)) MSMAX=$((BASE + 99))
    if port_taken "$MONP1" || port_taken "$MONP2"; then
      [[ -z ${CEPH_PORT_BASE:-} ]] || die "port $MONP1 or $MONP2 (CEPH_PORT_BASE) is taken"
      continue
    fi
    FSID=$(cat /proc/sys/kernel/random/uuid)
    write_conf
    rm -rf "$DIR/mon/mon.a"
    if start_mon; then
      ok=1
      break
    fi
    kill_all
    rm -f "$DIR"/pids/mon.a.pid
    echo "ceph-dev-cluster: the monitor did not come up on port $MONP1 (attempt $attempt), trying other ports" >&2
    [[ -z ${CEPH_PORT_BASE:-} ]] || break
    check_deadline "starting the monitor"
  done
  ((ok)) || fail_start "the monitor did not start (ports $MONP1/$MONP2)"

  mkdir -p "$DIR/mgr/mgr.x"
  spawn mgr.x ceph-mgr -f -c "$CONF" -i x

  local i u id
  for ((i = 0; i < nosd; i++)); do
    check_deadline "creating osd $i"
    u=$(cat /proc/sys/kernel/random/uuid)
    id=$(ceph_cli osd new "$u" 2>>"$DIR/log/mkfs.out") || fail_start "ceph osd new failed"
    mkdir -p "$DIR/osd/osd.$id"
    timeout "$(remaining)" ceph-osd -c "$CONF" -i "$id" --mkfs --osd-uuid "$u" \
      >>"$DIR/log/mkfs.out" 2>&1 || fail_start "ceph-osd -i $id --mkfs failed"
    spawn "osd.$id" ceph-osd -f -c "$CONF" -i "$id"
  done

  # Every OSD up before the pool exists, so its PGs peer once.
  local up
  while true; do
    check_deadline "waiting for $nosd OSDs up"
    up=$(ceph_cli osd stat 2>/dev/null | sed -n 's/.* \([0-9]\+\) up.*/\1/p' | head -n1)
    [[ ${up:-0} -ge $nosd ]] && break
    local name pid
    while read -r name pid; do
      alive "$pid" || fail_start "$name (pid $pid) exited"
    done < <(daemon_pids)
    sleep 0.3
  done

  local size=3 min_size=2
  ((nosd >= 3)) || { size=$nosd; min_size=1; }
  ceph_cli osd pool create "$POOL" "${CEPH_DEV_PGS:-32}" "${CEPH_DEV_PGS:-32}" replicated \
    >>"$DIR/log/mkfs.out" 2>&1 || fail_start "ceph osd pool create $POOL failed"
  ceph_cli osd pool set "$POOL" size "$size" --yes-i-really-mean-it >>"$DIR/log/mkfs.out" 2>&1 ||
    fail_start "setting the size of pool $POOL failed"
  ceph_cli osd pool set "$POOL" min_size "$min_size" >>"$DIR/log/mkfs.out" 2>&1 ||
    fail_start "setting min_size of pool $POOL failed"
  ceph_cli osd pool application enable "$POOL" evoke >>"$DIR/log/mkfs.out" 2>&1 ||
    fail_start "enabling pool $POOL failed"

  # Usable when every PG is active+clean: "33 pgs: 33 active+clean; ...".
  local stat n
  while true; do
    check_deadline "waiting for the PGs to become active+clean (last: ${stat:-none})"
    stat=$(ceph_cli pg stat 2>/dev/null || true)
    n=$(sed -n 's/^\([0-9]\+\) pgs: \([0-9]\+\) active+clean;.*/\1 \2/p' <<<"$stat")
    if [[ -n $n ]] && [[ ${n% *} == "${n#* }" ]] &&
      ceph_cli osd pool ls 2>/dev/null | grep -qx -- "$POOL"; then
      break
    fi
    sleep 0.3
  done
  echo "ceph-dev-cluster: up in ${SECONDS} s: mon 127.0.0.1:$MONP1, $nosd OSDs, pool $POOL (size $size, min_size $min_size)" >&2
  echo "$CONF"
}

# ---------------------------------------------------------------------------

case $CMD in
  start)
    [[ $# -le 3 ]] || usage
    start "${3:-3}"
    ;;
  stop | freeze | thaw | kill-osd | status)
    [[ -d $DIR ]] || die "no cluster directory $DIR"
    DIR=$(cd "$DIR" && pwd)
    CONF=$DIR/ceph.conf
    case $CMD in
      stop) kill_all ;;
      freeze) signal_all STOP; wait_stopped ;;
      thaw) signal_all CONT ;;
      kill-osd)
        [[ $# -eq 3 && $3 =~ ^[0-9]+$ ]] || usage
        f=$DIR/pids/osd.$3.pid
        [[ -f $f ]] || die "no osd.$3 in $DIR"
        pid=$(cat "$f")
        ours "$pid" || die "osd.$3 (pid $pid) is not running"
        kill -9 "$pid"
        wait_gone "$pid"
        ;;
      status)
        while read -r name pid; do
          if ours "$pid"; then
            st=$(sed 's/^.*) //' "/proc/$pid/stat" | cut -d' ' -f1)
            [[ $st == T ]] && st="frozen" || st="running"
          else
            st="gone"
          fi
          echo "$name pid $pid $st"
        done < <(daemon_pids)
        echo "conf $CONF"
        timeout 10 ceph -c "$CONF" --connect-timeout 5 -s 2>&1 || echo "(ceph -s did not answer)"
        ;;
    esac
    ;;
  *) usage ;;
esac

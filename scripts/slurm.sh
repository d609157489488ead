#!/usr/bin/env bash
# A one-node SLURM on this machine, from Debian's packages, for tests/test_slurm.py (.ci/run
# starts it before the suite) or to try sweep.py's --launcher slurm by hand. As root, no systemd:
#   bash scripts/slurm.sh start   # install if missing, configure, start what is not running
#   bash scripts/slurm.sh stop    # end only the daemons `start` started
# `start` installs munge, slurmctld, slurmd and slurm-client where they are missing, writes
# /etc/slurm/slurm.conf for this host unless another's is there (one CPU partition, `cpu`, no
# GRES), starts whichever of munged, slurmctld and slurmd is not running and waits for the node.
set -euo pipefail
STATE=/run/oec-slurm                          # the names of the daemons `start` started
CONF=/etc/slurm/slurm.conf
MARK="# written by scripts/slurm.sh"
declare -A PIDFILE=([munged]=/run/munge/munged.pid [slurmctld]=/run/slurmctld.pid
                    [slurmd]=/run/slurmd.pid)

die() { echo "slurm.sh: $*" >&2; exit 1; }
running() { [ -f "${PIDFILE[$1]}" ] && kill -0 "$(cat "${PIDFILE[$1]}")" 2>/dev/null; }
answers() { command -v scontrol >/dev/null && scontrol ping 2>/dev/null | grep -q UP; }

install_packages() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch \
        >/dev/null && command -v munged >/dev/null && return
    command -v apt-get >/dev/null || die "SLURM is not installed and there is no apt-get to" \
        "install it; install munge, slurmctld, slurmd and slurm-client, then run this again"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        munge slurmctld slurmd slurm-client >/dev/null
}

write_config() {  # the node line is slurmd's own view of this machine
    [ -f "$CONF" ] && ! grep -qx "$MARK" "$CONF" && return  # another's cluster: keep its own
    local host
    host=$(hostname -s)
    getent hosts "$host" >/dev/null || die "this host's name $host does not resolve; add it" \
        "to /etc/hosts, then run this again"
    cat > "$CONF" <<EOF
$MARK
ClusterName=oec
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/none
ReturnToService=2
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=${PIDFILE[slurmctld]}
SlurmdPidFile=${PIDFILE[slurmd]}
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
$(slurmd -C | head -n 1) State=UNKNOWN
PartitionName=cpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

start_daemon() {  # NAME COMMAND...: start it unless it runs, and remember that we did
    running "$1" && return
    "${@:2}" || die "$1 did not start; see /var/log/slurm and /var/log/munge"
    echo "$1" >> "$STATE/started"
}

start() {
    if answers && { [ ! -f "$STATE/started" ] || [ "$(id -u)" != 0 ]; }; then
        echo "slurm.sh: a SLURM controller already answers; nothing started"; return
    fi  # else (root, this script's own cluster) the steps below restart only a daemon that died
    [ "$(id -u)" = 0 ] || die "start needs root (it installs packages and starts daemons); run" \
        "it as root"
    install_packages
    write_config
    mkdir -p "$STATE" /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm
    install -d -o munge -g munge -m 0755 /run/munge
    start_daemon munged runuser -u munge -- /usr/sbin/munged
    start_daemon slurmctld /usr/sbin/slurmctld
    start_daemon slurmd /usr/sbin/slurmd
    for _ in $(seq 60); do  # slurmd registers within seconds
        if sinfo -h -o %t 2>/dev/null | grep -qxE 'idle|mix|alloc'; then
            echo "slurm.sh: node $(hostname -s) is up in partition cpu"; return
        fi
        sleep 0.5
    done
    die "the node did not come up within 30 s; see /var/log/slurm/slurmd.log"
}

stop() {
    [ -f "$STATE/started" ] || { echo "slurm.sh: nothing started by this script runs"; return; }
    [ "$(id -u)" = 0 ] || die "stop needs root (root started the daemons); run it as root"
    for name in slurmd slurmctld munged; do  # the reverse order of start
        if grep -qx "$name" "$STATE/started" && running "$name"; then
            pid=$(cat "${PIDFILE[$name]}")
            kill "$pid"
            while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
            echo "slurm.sh: stopped $name"
        fi
    done
    rm -f "$STATE/started"
}

case "${1:-}" in
    start|stop) "$1" ;;
    *) die "give start or stop, e.g. bash scripts/slurm.sh start" ;;
esac

#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine, for the tests and for trying `draftsmith slurm` locally.
#
#   scripts/slurm_cluster.sh install   # apt-get install slurmctld slurmd slurm-client (root; Debian's 22.05)
#   scripts/slurm_cluster.sh start     # write slurm.conf, start slurmctld + slurmd (idempotent)
#   scripts/slurm_cluster.sh stop      # stop both daemons
#   eval "$(scripts/slurm_cluster.sh env)"   # export SLURM_CONF for sbatch/squeue/scontrol
#
# No munge: AuthType=auth/none and CredType=cred/none (fine on one machine, never on a shared cluster).
# No accounting daemon: job states come from squeue / scontrol show job (MinJobAge keeps finished jobs
# visible to scontrol for an hour). The node is this machine as `slurmd -C` describes it, at 127.0.0.1.
# State, logs and the config live in $DRAFTSMITH_SLURM_DIR (default /tmp/draftsmith-slurm).
set -euo pipefail

DIR="${DRAFTSMITH_SLURM_DIR:-/tmp/draftsmith-slurm}"
CONF="$DIR/slurm.conf"
export SLURM_CONF="$CONF"

have_slurm() { command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null; }

install() {
    have_slurm && return 0
    [ "$(id -u)" = 0 ] || { echo "slurm_cluster: installing SLURM needs root" >&2; return 1; }
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends slurmctld slurmd slurm-client >/dev/null ||
        { apt-get update -qq >/dev/null && apt-get install -y --no-install-recommends slurmctld slurmd slurm-client >/dev/null; }
}

write_conf() {
    mkdir -p "$DIR/ctld" "$DIR/d" "$DIR/log"
    local node host
    node="$(slurmd -C | head -n 1)"  # NodeName=<host> CPUs=.. Boards=.. ... RealMemory=..
    host="$(hostname -s)"
    cat >"$CONF.tmp" <<EOF
ClusterName=draftsmith
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
MinJobAge=3600
KillWait=5
ReturnToService=2
JobRequeue=1
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/d
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    mv "$CONF.tmp" "$CONF"
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
    have_slurm || { echo "slurm_cluster: SLURM is not installed (run: $0 install)" >&2; return 1; }
    if alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid" && scontrol ping >/dev/null 2>&1; then
        echo "SLURM_CONF=$CONF"
        return 0
    fi
    stop >/dev/null 2>&1 || true
    write_conf
    slurmctld -f "$CONF"
    slurmd -f "$CONF"
    local host
    host="$(hostname -s)"
    for _ in $(seq 1 60); do
        if sinfo -h -n "$host" -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
            echo "SLURM_CONF=$CONF"
            return 0
        fi
        # a node left down by an earlier run comes back with RESUME
        scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1 || true
        sleep 0.5
    done
    echo "slurm_cluster: the node did not come up; see $DIR/log/" >&2
    return 1
}

stop() {
    local pidfile
    for pidfile in "$DIR/slurmd.pid" "$DIR/slurmctld.pid"; do
        if alive "$pidfile"; then
            kill "$(cat "$pidfile")"
            for _ in $(seq 1 50); do alive "$pidfile" || break; sleep 0.1; done
        fi
        rm -f "$pidfile"
    done
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    *) echo "usage: $0 install|start|stop|env" >&2; exit 2 ;;
esac

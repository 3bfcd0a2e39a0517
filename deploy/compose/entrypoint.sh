#!/bin/sh
# Container entrypoint: read credentials, apply the rig's inter-region delays,
# drop root, then run the command (by default `edgeplex ...`).
#
# EDGEPLEX_DELAYS="172.28.2.0/24=30 172.28.3.0/24=80" delays egress to those
# subnets (one-way, ms) with tc netem. That needs root and NET_ADMIN (the
# service runs with `user: "0"` and `cap_add: [NET_ADMIN]`) and a kernel with
# netem; without netem the delays are skipped with a warning. Whatever starts as
# root runs the command as the unprivileged user `edgeplex`, with no capabilities.
set -eu
# EDGEPLEX_ENV_FILE: KEY=value credentials written by another container (the
# broker's for the control plane, enrolment's for an agent); waited for.
if [ -n "${EDGEPLEX_ENV_FILE:-}" ]; then
    waited=0
    until [ -s "$EDGEPLEX_ENV_FILE" ]; do
        waited=$((waited + 1))
        [ "$waited" -lt 120 ] || { echo "no $EDGEPLEX_ENV_FILE" >&2; exit 1; }
        sleep 1
    done
    set -a
    . "$EDGEPLEX_ENV_FILE"
    set +a
fi
# A prio qdisc with one netem band per delayed subnet.
apply_delays() {
    bands=3
    for _ in $EDGEPLEX_DELAYS; do bands=$((bands + 1)); done
    tc qdisc replace dev eth0 root handle 1: prio bands "$bands" || return 1
    band=4
    for item in $EDGEPLEX_DELAYS; do
        subnet=${item%%=*}
        ms=${item#*=}
        tc qdisc add dev eth0 parent 1:$band handle ${band}0: netem delay "${ms}ms" || return 1
        tc filter add dev eth0 parent 1: protocol ip u32 match ip dst "$subnet" flowid 1:$band \
            || return 1
        band=$((band + 1))
    done
}
if [ -n "${EDGEPLEX_DELAYS:-}" ] && [ "$(id -u)" = 0 ]; then
    if ! apply_delays 2>/dev/null; then
        tc qdisc del dev eth0 root 2>/dev/null || true
        echo "warning: this kernel has no prio/netem qdisc; inter-region delays not applied" >&2
    fi
elif [ -n "${EDGEPLEX_DELAYS:-}" ]; then
    echo "warning: EDGEPLEX_DELAYS needs the container to start as root; not applied" >&2
fi
case "${1:-}" in
    agent|control-plane|admin|simulate|demo-repo|--*) set -- edgeplex "$@" ;;
esac
if [ "$(id -u)" = 0 ]; then
    export HOME=/var/lib/edgeplex USER=edgeplex LOGNAME=edgeplex
    exec setpriv --reuid=edgeplex --regid=edgeplex --init-groups --inh-caps=-all \
        --bounding-set=-all -- "$@"
fi
exec "$@"

#!/bin/sh
# Container entrypoint: read credentials, apply the rig's inter-region delays,
# then run edgeplex.
# EDGEPLEX_DELAYS="172.28.2.0/24=30 172.28.3.0/24=80" delays egress to those
# subnets (one-way, ms) with tc netem; needs the NET_ADMIN capability.
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
if [ -n "${EDGEPLEX_DELAYS:-}" ]; then
    bands=3
    for _ in $EDGEPLEX_DELAYS; do bands=$((bands + 1)); done
    tc qdisc add dev eth0 root handle 1: prio bands "$bands"
    band=4
    for item in $EDGEPLEX_DELAYS; do
        subnet=${item%%=*}
        ms=${item#*=}
        tc qdisc add dev eth0 parent 1:$band handle ${band}0: netem delay "${ms}ms"
        tc filter add dev eth0 parent 1: protocol ip u32 match ip dst "$subnet" flowid 1:$band
        band=$((band + 1))
    done
fi
exec edgeplex "$@"

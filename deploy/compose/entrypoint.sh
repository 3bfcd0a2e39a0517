#!/bin/sh
# Container entrypoint: apply the rig's inter-region delays, then run edgeplex.
# EDGEPLEX_DELAYS="172.28.2.0/24=30 172.28.3.0/24=80" delays egress to those
# subnets (one-way, ms) with tc netem; needs the NET_ADMIN capability.
set -eu
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

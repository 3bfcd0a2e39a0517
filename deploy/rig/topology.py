"""The rig's topology: sites, regions, addresses and inter-region delays. Pure.

Region r (0-based) holds sites `r<r>s<i>`; every site gets its own network
namespace `<prefix>-<site>` with address 10.<octet>.<r+1>.<i+10>/16 on a veth
whose host end joins the bridge `<prefix>br` (10.<octet>.0.1/16), where Redis,
mosquitto and the control plane listen. Inter-region delays are one-way and
applied at the sender's egress, so a round trip costs twice the delay.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_DELAYS_MS = (30.0, 80.0, 150.0)  # pairs (0,1), (0,2), (1,2) of three regions


@dataclass(frozen=True)
class RigSite:
    site_id: str
    region: str
    region_index: int
    namespace: str
    host_veth: str
    address: str  # IP inside the namespace

    @property
    def grpc(self) -> str:
        return f"{self.address}:8001"

    @property
    def http(self) -> str:
        return f"{self.address}:8000"


@dataclass(frozen=True)
class Topology:
    prefix: str
    octet: int
    regions: tuple[str, ...]
    sites: tuple[RigSite, ...]
    delays_ms: dict[tuple[str, str], float] = field(default_factory=dict)
    clock_offsets_h: dict[str, float] = field(default_factory=dict)

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def gateway(self) -> str:
        return f"10.{self.octet}.0.1"

    def subnet(self, region_index: int) -> str:
        return f"10.{self.octet}.{region_index + 1}.0/24"

    def delay(self, a: str, b: str) -> float:
        if a == b:
            return 0.0
        return self.delays_ms.get((a, b), self.delays_ms.get((b, a), 0.0))


def build(
    regions: int,
    sites_per_region: int,
    prefix: str = "epx",
    octet: int = 77,
    delays_ms: tuple[float, ...] | None = None,
    clock_offsets_h: tuple[float, ...] | None = None,
) -> Topology:
    if not 1 <= regions <= 16 or not 1 <= sites_per_region <= 100:
        raise ValueError("regions must be 1..16 and sites per region 1..100")
    if len(prefix) > 6 or not prefix.isalnum():
        raise ValueError("prefix: at most 6 letters or digits (interface names are short)")
    names = tuple(f"r{r}" for r in range(regions))
    pairs = [(names[a], names[b]) for a in range(regions) for b in range(a + 1, regions)]
    if delays_ms is None:
        # Three regions: 30/80/150 ms; more: 30 ms per step around a ring.
        if regions == 3:
            delays_ms = DEFAULT_DELAYS_MS
        else:
            delays_ms = tuple(
                30.0 * min(b - a, regions - (b - a))
                for a in range(regions)
                for b in range(a + 1, regions)
            )
    if len(delays_ms) != len(pairs):
        raise ValueError(
            f"{regions} regions need {len(pairs)} delays (pairs in order), got {len(delays_ms)}"
        )
    offsets = clock_offsets_h or tuple(8.0 * r for r in range(regions))
    sites = []
    n = 0
    for r in range(regions):
        for i in range(sites_per_region):
            site = f"r{r}s{i}"
            sites.append(
                RigSite(
                    site,
                    names[r],
                    r,
                    f"{prefix}-{site}",
                    f"{prefix}{n}h",
                    f"10.{octet}.{r + 1}.{i + 10}",
                )
            )
            n += 1
    return Topology(
        prefix=prefix,
        octet=octet,
        regions=names,
        sites=tuple(sites),
        delays_ms=dict(zip(pairs, delays_ms, strict=True)),
        clock_offsets_h=dict(zip(names, offsets, strict=False)),
    )


def network_commands(topo: Topology, netem: bool) -> list[list[str]]:
    """`ip`/`tc` commands that build the rig's network, in order."""
    cmds = [
        ["ip", "link", "add", topo.bridge, "type", "bridge"],
        ["ip", "addr", "add", f"{topo.gateway}/16", "dev", topo.bridge],
        ["ip", "link", "set", topo.bridge, "up"],
    ]
    for s in topo.sites:
        ns = ["ip", "-n", s.namespace]
        cmds += [
            ["ip", "netns", "add", s.namespace],
            [
                "ip",
                "link",
                "add",
                s.host_veth,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                s.namespace,
            ],
            ["ip", "link", "set", s.host_veth, "master", topo.bridge, "up"],
            [*ns, "addr", "add", f"{s.address}/16", "dev", "eth0"],
            [*ns, "link", "set", "eth0", "up"],
            [*ns, "link", "set", "lo", "up"],
            [*ns, "route", "add", "default", "via", topo.gateway],
        ]
        if not netem:
            cmds += redirect_commands(topo, s)
            continue
        tc = ["ip", "netns", "exec", s.namespace, "tc"]
        cmds.append(
            [
                *tc,
                "qdisc",
                "add",
                "dev",
                "eth0",
                "root",
                "handle",
                "1:",
                "prio",
                "bands",
                str(3 + len(topo.regions)),
            ]
        )
        for r, region in enumerate(topo.regions):
            delay = topo.delay(s.region, region)
            if delay <= 0:
                continue
            band = 4 + r
            netem_qdisc = ["parent", f"1:{band}", "handle", f"{band}0:", "netem"]
            to_region = ["u32", "match", "ip", "dst", topo.subnet(r), "flowid", f"1:{band}"]
            cmds += [
                [*tc, "qdisc", "add", "dev", "eth0", *netem_qdisc, "delay", f"{delay:g}ms"],
                [*tc, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", *to_region],
            ]
    return cmds


PROXY_PORT = 15001
PROXY_MARK = "0x7e"


def redirect_commands(topo: Topology, site: RigSite) -> list[list[str]]:
    """Without netem: send this site's TCP to farther regions through its delay
    proxy (deploy/rig/delay_proxy.py); the proxy's own connections carry a mark."""
    ipt = [
        "ip",
        "netns",
        "exec",
        site.namespace,
        "iptables",
        "-t",
        "nat",
        "-A",
        "OUTPUT",
        "-p",
        "tcp",
    ]
    cmds = [[*ipt, "-m", "mark", "--mark", PROXY_MARK, "-j", "RETURN"]]
    for r, region in enumerate(topo.regions):
        if topo.delay(site.region, region) > 0:
            cmds.append(
                [*ipt, "-d", topo.subnet(r), "-j", "REDIRECT", "--to-ports", str(PROXY_PORT)]
            )
    return cmds


def proxy_args(topo: Topology, site: RigSite) -> list[str]:
    args = ["--port", str(PROXY_PORT)]
    for r, region in enumerate(topo.regions):
        delay = topo.delay(site.region, region)
        if delay > 0:
            args += ["--delay", f"{topo.subnet(r)}={delay:g}"]
    return args

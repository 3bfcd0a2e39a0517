"""The placement loop: on the leader, turn Redis state into placement, desired
state and routes, and publish them.

One task (`run`) owns the loop; it starts a round every `placement_interval_s`
(from the start of the last: rounds keep their period while they take less), wakes
every second to check site leases, and at once when `poke()` is called (a catalog
change, a registration) or a pub/sub event arrives from another replica. A change
placement does not read (the tenants: `tenants_changed()`) does not wait for a
round: each site's desired state is made anew at once on the last round's
placement (`restate`).
Standbys run the loop too but do nothing until they hold the lease.

A round reads everything from Redis, so a new leader (or a restarted one)
picks up exactly where the last one stopped: the current placement is the
`current` input of the next, which is what keeps placement from flapping.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Callable

from redis.exceptions import RedisError

from edgeplex.control_plane.config import ControlPlaneSettings
from edgeplex.control_plane.demand import (
    Demand,
    compute_per_request,
    current_demand,
    ewma,
    hint_ttl_s,
    with_hints,
)
from edgeplex.control_plane.forecast import Forecaster
from edgeplex.control_plane.leader import RETRY_S, LeaderLease
from edgeplex.control_plane.metrics import METRICS
from edgeplex.control_plane.placement import (
    ModelSpec,
    PlacementInput,
    PlacementResult,
    SiteInfo,
    latency,
    place,
)
from edgeplex.control_plane.publisher import Publisher
from edgeplex.control_plane.store import EVENTS, Store
from edgeplex.fleet import desired_topic, routes_topic
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.signing import DESIRED, ROUTES, region_audience, site_audience
from edgeplex.tenants import TenantTable, for_site, split_rate

log = logging.getLogger("edgeplex.control_plane.planner")
RATE_WINDOW_S = 300.0  # the usage a fleet-wide rate is split by
FORECAST_SAVE_S = 60.0  # the forecaster's state is saved to Redis at least this often

UNLIMITED = 1 << 60


class NotLeading(Exception):
    """A round found mid-way that this replica no longer leads."""


class Planner:
    def __init__(
        self, settings: ControlPlaneSettings, store: Store, publisher: Publisher, lease: LeaderLease
    ) -> None:
        self._settings = settings
        self._store = store
        self._publisher = publisher
        self._lease = lease
        self._wake = asyncio.Event()
        self._routes_sent: dict[str, bytes] = {}  # region -> unversioned routes last published
        self._routes_key: tuple[object, ...] = ()  # what the routes last built came from
        # Per site, the desired state this leader last published, with what decides
        # whether it changed (its models' sha256, the peer token, the tenants) and its
        # bytes (head, models): a round compares tuples instead of reading and parsing
        # every site's state back from Redis. Emptied when a new term begins (_new_term).
        self._published: dict[str, tuple[tuple[object, ...], int, tuple[bytes, bytes]]] = {}
        self._forecaster: Forecaster | None = None  # loaded from Redis on first use
        self._catalog_read: tuple[bytes | None, list[pb.CatalogModel]] = (None, [])
        self._demand_written: tuple[Demand, float] | None = None  # while leading
        self._placed: dict[str, tuple[list[str], list[str]]] | None = None  # its last round
        # Per site, its last loaded and staged lists, their entries' bytes and the
        # bytes' sha256, for the catalog epoch they were made from (Store.catalog_epoch).
        self._entries_of: tuple[bytes | None, dict[str, tuple[list[str], list[str], bytes, bytes]]]
        self._entries_of = (None, {})
        self._forecast_saved_at = 0.0
        self.observed: Demand = {}  # the last round's demand EWMA (explain shows it)
        self.forecast: Demand = {}  # and its forecast one horizon ahead
        self.rounds = 0
        self.changed_last_round = 0  # sites whose desired state the last round changed
        self._poked = False  # a round asked for (poke)
        self._restate = False  # desired states anew asked for (tenants_changed)
        # What the last round placed and published from (restate publishes from it anew)
        self._last_round: (
            tuple[PlacementInput, PlacementResult, list[pb.Site], list[pb.CatalogModel],
                  dict[str, float], dict[str, int]] | None
        ) = None  # fmt: skip
        self._term = 0.0  # the leader term (LeaderLease.since) the memory above is of
        self._settling_logged = False

    def _new_term(self) -> None:
        """Leading anew: what this replica remembers of its last term (what it
        published, its demand, its placement) may be stale, as another replica may
        have led since. A term resumed after a Redis blip keeps them (LeaderLease)."""
        self._term = self._lease.since
        self._settling_logged = False
        self._routes_sent.clear()
        self._routes_key = ()
        self._published.clear()
        self._demand_written = None
        self._placed = None
        self._entries_of = (None, {})
        self._last_round = None

    def poke(self) -> None:
        """A change placement reads (the catalog, a site): a round at once."""
        self._poked = True
        self._wake.set()

    def tenants_changed(self) -> None:
        """A change placement does not read: every site's desired state anew at once,
        on the last round's placement (a round when this term has none yet)."""
        self._restate = True
        self._wake.set()

    async def run(self) -> None:
        listener = asyncio.create_task(self._listen())
        interval = self._settings.placement_interval_s
        last_round = -interval  # when the last round started
        was_leader = False
        try:
            while True:
                # Until the next round is due. Past it (a round that took longer than
                # the interval, or none run: not leading, not settled), in a second.
                until_due = last_round + interval - time.monotonic()
                wait_s = min(1.0, until_due) if until_due > 0 else 1.0
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=wait_s)
                poked, restate = self._poked, self._restate
                self._poked = self._restate = False
                self._wake.clear()
                if not self._lease.is_leader:
                    if was_leader:
                        self._publisher.forget()
                    was_leader = False
                    continue
                now = time.monotonic()
                due = now - last_round >= interval
                try:
                    if self._term != self._lease.since:
                        # A term of its own, even one begun between two of these
                        # checks (the lease lost and won again meanwhile).
                        self._new_term()
                        was_leader = False
                    if not was_leader and not await self._settled():
                        continue
                    if restate and was_leader and self._last_round is not None:
                        # Before a round, due or not: rounds that take longer than the
                        # interval are always due, and would hold it back a round.
                        await self.restate()
                        restate = False
                    changed = await self._check_leases()
                    if poked or due or changed or not was_leader or restate:
                        was_leader = True
                        await self.round()
                        last_round = now
                except NotLeading:
                    log.info("a round stopped: this replica no longer leads")
                except RedisError as exc:
                    # Tried again soon, not at the next tick: a failover's new primary
                    # is taken up within RETRY_S of answering, and the round with it.
                    log.warning("placement round skipped: Redis unavailable (%s)", exc)
                    await asyncio.sleep(RETRY_S)
                    self.poke()
                except Exception:
                    log.exception("placement round failed")
                    await asyncio.sleep(1.0)
        finally:
            listener.cancel()

    async def _listen(self) -> None:
        """Events published by other replicas (catalog changes made through them)."""
        while True:
            try:
                pubsub = self._store.redis.pubsub()
                await pubsub.subscribe(EVENTS)
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        self.poke()
            except RedisError:
                await asyncio.sleep(1.0)

    def _heard_from(self, seen: dict[str, float], sites: list[pb.Site]) -> dict[str, float]:
        """When each site was last heard from, as far as this replica may judge. A
        new leader (restarted, or a standby taking over) counts sites that were up
        as heard at its takeover: their reports may have gone to the replica that
        died, or be waiting out a reconnect, and one site lease is theirs to find
        it. Judging them on the old times would mark live sites down and drop
        their demand in its first round. So does a leader back after a break in
        its lease (Redis away, or this process paused): the sites' reports had
        nowhere to go meanwhile."""
        since = self._lease.hearing_since
        return {s.site_id: max(seen.get(s.site_id, 0.0), since if s.up else 0.0) for s in sites}

    def _still_leading(self) -> None:
        """Raise NotLeading unless this replica leads now. Called before each write
        a round makes: a replica paused mid-round (its lease run out meanwhile) must
        not write what it decided before the pause."""
        if not self._lease.is_leader:
            raise NotLeading

    async def _settled(self) -> bool:
        """Whether a new leader has heard enough to place: every site that was up has
        reported since the takeover, or the settling window has passed (agents
        reconnect within a third of the site lease, then report within two report
        intervals; never longer than the site lease). Until then the
        desired state already published stays in force; a round run on the
        reports from before the takeover would drop what sites were asked for
        during the gap (a model loaded on demand, a rise in demand)."""
        since, settings = self._lease.since, self._settings
        window = min(
            settings.site_lease_s, settings.site_lease_s / 3 + 2 * settings.report_interval_s
        )
        if time.time() - since >= window:
            return True
        if not self._settling_logged:
            self._settling_logged = True
            log.info("a new term: placing once every site has reported, or in %.0f s", window)
        reports = await self._store.reports()
        return all(
            s.site_id in reports and reports[s.site_id].sent_at >= since
            for s in await self._store.sites()
            if s.up
        )

    async def _check_leases(self) -> bool:
        """Mark sites up or down from their last report; True when any changed."""
        now = time.time()
        sites = await self._store.sites()
        heard = self._heard_from(await self._store.seen(), sites)
        changed = False
        for site in sites:
            up = now - heard[site.site_id] <= self._settings.site_lease_s
            if site.up != up:
                self._still_leading()
                log.warning("site %s is %s", site.site_id, "up" if up else "down (lease lapsed)")
                site.up = up
                await self._store.put_site(site)
                changed = True
        return changed

    async def build_input(
        self, update_demand: bool = True
    ) -> tuple[PlacementInput, list[pb.Site], list[pb.CatalogModel], dict[str, pb.LoadReport]]:
        """Placement input from Redis, with the sites, catalog and latest reports it
        came from; on the leader, also advances the demand EWMA."""
        now = time.time()
        settings = self._settings
        every = await self._catalog()
        catalog = [m for m in every if m.state == "READY"]
        known = {m.name for m in every}
        sites = await self._store.sites()
        heard = self._heard_from(await self._store.seen(), sites)
        reports = await self._store.reports()
        live = [
            r for sid, r in reports.items() if now - heard.get(sid, 0.0) <= settings.site_lease_s
        ]
        leads = update_demand and self._lease.is_leader
        # The leader advances the EWMA it wrote itself; others read what the leader wrote.
        written = self._demand_written if self._lease.is_leader else None
        previous, at = written or await self._store.demand()
        reported, unknown = current_demand(live, known)
        METRICS.unknown_demand.set(unknown)
        demand = ewma(previous, reported, now - at, settings.demand_half_life_s)
        if leads:
            await self._store.put_demand(demand, now)
            self._demand_written = (demand, now)
        self.observed = demand
        if settings.forecast_horizon_s > 0:
            forecaster = await self._load_forecaster()
            if leads:
                closed_hour = forecaster.observe(reported, now)
                # Its state (tens of MB at ten thousand models) is saved when an hour
                # closes and otherwise once a FORECAST_SAVE_S: a new leader's recent
                # level catches up within a demand half-life anyway.
                if closed_hour or now - self._forecast_saved_at >= FORECAST_SAVE_S:
                    await self._store.put_forecast(forecaster.to_bytes())
                    self._forecast_saved_at = now
            # The forecast stands for every key the forecaster has learned (a key
            # in a burst, or with no season yet, forecasts its recent level); the
            # EWMA for the rest.
            self.forecast = forecaster.predict(now, settings.forecast_horizon_s)
            demand = {k: v for k, v in demand.items() if k not in forecaster} | self.forecast
        ttl = hint_ttl_s(settings.report_interval_s, settings.placement_interval_s)
        hints = await self._store.demand_hints(now - ttl)
        demand = with_hints(demand, hints)
        measured: dict[str, int] = {}  # a model's bytes as shipped, the most any site saw
        smaller: dict[str, list[tuple[str, int]]] = {}  # where a site runs it as a variant
        for report in live:
            for m in report.models:
                shipped = m.bytes_by_variant.get("", 0) if m.variant else m.memory_bytes
                measured[m.name] = max(measured.get(m.name, 0), shipped)
                if m.variant and m.memory_bytes:
                    smaller.setdefault(m.name, []).append((report.site_id, m.memory_bytes))
        compute_ms = compute_per_request(live)
        if self._placed is not None and self._lease.is_leader:  # this leader's last round
            current = {site: frozenset(loaded) for site, (loaded, _) in self._placed.items()}
            staged = {site: staged for site, (_, staged) in self._placed.items()}
        else:
            stored = (await self._store.placement() or pb.Placement()).sites
            current = {sp.site_id: frozenset(sp.loaded) for sp in stored}
            staged = {sp.site_id: list(sp.staged) for sp in stored}
        for site_id, _, model in hints:  # being loaded there on demand: keep it there
            current[site_id] = current.get(site_id, frozenset()) | {model}
        inp = PlacementInput(
            sites=tuple(
                SiteInfo(
                    site_id=s.site_id,
                    region=s.region,
                    device_bytes=s.budgets.device_bytes or UNLIMITED,
                    host_bytes=s.budgets.host_bytes,
                    up=s.up,
                    cordoned=s.cordoned,
                    draining=s.draining,
                    capacity=1.0,  # a fully busy device, the unit of compute_ms below
                )
                for s in sites
            ),
            models=tuple(
                ModelSpec(
                    name=m.name,
                    size_bytes=measured.get(m.name) or m.device_bytes or m.size_bytes,
                    slo_ms=m.slo_ms or 100.0,
                    min_replicas=m.min_replicas,
                    regions=frozenset(m.regions),
                    priority=m.priority,
                    pin=m.pin,
                    compute_ms=compute_ms.get(m.name, 0.0),
                    site_bytes=tuple(smaller.get(m.name, ())),
                )
                for m in catalog
            ),
            demand=demand,
            latency_ms=settings.latency_pairs(),
            current=current,
            current_staged=staged,
            churn_cost=settings.churn_cost,
            forward_value=settings.forward_value,
        )
        return inp, sites, catalog, reports

    async def _catalog(self) -> list[pb.CatalogModel]:
        """The catalog, read again only when it changed (ten thousand entries parsed
        every round cost a tenth of a second)."""
        epoch = await self._store.catalog_epoch()
        if epoch is None or epoch != self._catalog_read[0]:
            self._catalog_read = (epoch, await self._store.models())
        return self._catalog_read[1]

    async def _load_forecaster(self) -> Forecaster:
        if self._forecaster is None or not self._lease.is_leader:
            state = await self._store.forecast()
            # Its recent level moves as fast as the observed demand's EWMA, so that
            # it adds only what the season says.
            half_life = self._settings.demand_half_life_s
            try:
                self._forecaster = (
                    Forecaster.from_bytes(state, recent_half_life_s=half_life)
                    if state
                    else Forecaster(half_life)
                )
            except ValueError:
                log.warning("forecaster state in Redis is unreadable: starting afresh")
                self._forecaster = Forecaster(half_life)
        return self._forecaster

    async def round(self) -> pb.Placement:
        started = time.perf_counter()
        inp, sites, catalog, reports = await self.build_input()
        read = time.perf_counter()
        result = await asyncio.to_thread(place, inp)
        placed = time.perf_counter()
        self._still_leading()
        version = await self._store.next_version()
        placement = pb.Placement(
            version=version,
            computed_at=time.time(),
            objective=result.objective,
            served_fraction=result.served_fraction,
            leader=self._lease.replica_id,
            sites=[
                pb.SitePlacement(
                    site_id=s.site_id,
                    loaded=result.loaded[s.site_id],
                    staged=result.staged[s.site_id],
                )
                for s in sites
            ],
        )
        await self._store.put_placement(placement)
        self._placed = {
            s.site_id: (result.loaded[s.site_id], result.staged[s.site_id]) for s in sites
        }
        applied = {site: report.desired_version for site, report in reports.items()}
        self._still_leading()
        self._last_round = (inp, result, sites, catalog, site_headroom(reports), applied)
        await self._publish(version, *self._last_round)
        published = {site: version for site, (_, version, _) in self._published.items()}
        METRICS.export_sites(sites, published, reports)
        self.rounds += 1
        ended = time.perf_counter()
        METRICS.placement_seconds.observe(ended - started)
        METRICS.placement_phase_seconds.labels(phase="read").inc(read - started)
        METRICS.placement_phase_seconds.labels(phase="place").inc(placed - read)
        METRICS.placement_phase_seconds.labels(phase="publish").inc(ended - placed)
        METRICS.placement_version.set(version)
        log.info(
            "round %d: %.2f s (read %.2f, place %.2f, publish %.2f); %d of %d sites' "
            "desired states changed",
            version, ended - started, read - started, placed - read, ended - placed,
            self.changed_last_round, len(sites),
        )  # fmt: skip
        return placement

    async def restate(self) -> None:
        """Every site's desired state anew, on the last round's placement with the
        tenants as they are now: no reports read, nothing placed. A tenant added
        reaches the sites in the time it takes to send their states, not a round's."""
        assert self._last_round is not None
        started = time.perf_counter()
        self._still_leading()
        version = await self._store.next_version()
        await self._publish(version, *self._last_round)
        log.info(
            "desired states anew for the tenants: %.2f s; %d of %d sites' desired states "
            "changed",
            time.perf_counter() - started, self.changed_last_round, len(self._last_round[2]),
        )  # fmt: skip

    async def _fleet_rates(
        self, tenants: TenantTable, sites: list[str], now: float
    ) -> dict[str, dict[str, float]]:
        """Each fleet-rated tenant's rate at each site: its fleet rate split by the
        site's share of the tenant's requests in the last RATE_WINDOW_S of usage
        records (edgeplex/tenants.py, split_rate)."""
        rated = [t for t in tenants.tenants.values() if t.fleet_rate is not None]
        if not rated:
            return {}
        demand: dict[str, dict[str, float]] = {t.name: {} for t in rated}
        for report in await self._store.usage.reports(now - RATE_WINDOW_S, 0):
            for record in report.records:
                by_site = demand.get(record.tenant)
                if by_site is not None:
                    by_site[report.site_id] = by_site.get(report.site_id, 0) + record.requests
        return {
            t.name: split_rate(t.fleet_rate, demand[t.name], sites)
            for t in rated
            if t.fleet_rate is not None
        }

    async def _publish(
        self,
        version: int,
        inp: PlacementInput,
        result: PlacementResult,
        sites: list[pb.Site],
        catalog: list[pb.CatalogModel],
        headroom: dict[str, float],
        applied: dict[str, int],
    ) -> None:
        """Each site's desired state, stored and sent where it changed; then the
        routes. `applied`: the version each site reports it applied last."""
        by_name = {m.name: m for m in catalog}
        known = self._published
        # A new leader reads what was published before it (each site's head and its
        # models' sha256); later rounds remember.
        stored = await self._store.desired() if any(s.site_id not in known for s in sites) else {}
        peer_token = await self._store.peer_token()
        tenants = await self._store.tenants()
        now = time.time()
        rates = await self._fleet_rates(tenants, [s.site_id for s in sites], now)
        tenants_at = _tenants_json(tenants, rates)
        # Each (model, tier) entry is encoded once a round, as it sits inside a
        # DesiredState; a site's state is then its few fields and its entries'
        # bytes, joined (a thousand sites of 770 models: no 770,000 message copies).
        made: dict[tuple[str, str], bytes] = {}
        changed: dict[str, tuple[bytes, bytes]] = {}  # site -> head, models' sha256: new

        def entry(name: str, tier: str) -> bytes:
            found = made.get((name, tier))
            if found is None:
                found = made[(name, tier)] = _model_field(
                    desired_model(by_name[name], tier).SerializeToString()
                )
            return found

        if self._entries_of[0] != self._catalog_read[0] or self._entries_of[0] is None:
            self._entries_of = (self._catalog_read[0], {})  # the catalog changed: all anew
        entries_of = self._entries_of[1]
        for site in sites:
            loaded, staged = result.loaded[site.site_id], result.staged[site.site_id]
            last_entries = entries_of.get(site.site_id)
            if last_entries is not None and last_entries[:2] == (loaded, staged):
                models, digest = last_entries[2:]  # the same lists as last round
            else:
                models = b"".join(
                    [entry(name, "loaded") for name in loaded]
                    + [entry(name, "staged") for name in staged]
                )
                digest = hashlib.sha256(models).digest()
                entries_of[site.site_id] = (loaded, staged, models, digest)
            tenants_json = tenants_at(site.site_id)
            key = (digest, peer_token, tenants_json)
            last = known.get(site.site_id)
            if last is None and site.site_id in stored:
                # What the last leader sent, rebuilt byte for byte where it still holds.
                head, sent_digest = stored[site.site_id]
                sent = pb.DesiredState.FromString(head)
                last = ((sent_digest, sent.peer_token, sent.tenants_json), sent.version,
                        (head, models))  # fmt: skip
            # A site that applied a version above what this leader knows of it (one
            # a leader sent before Redis lost it) would refuse the older one as
            # stale and keep what it has: it is sent its state anew.
            if last is not None and last[0] == key and applied.get(site.site_id, 0) <= last[1]:
                issued, parts = last[1], last[2]  # unchanged: agents have applied it
            else:
                head = pb.DesiredState(
                    version=version,
                    site_id=site.site_id,
                    issued_at=now,
                    peer_token=peer_token,
                    tenants_json=tenants_json,
                ).SerializeToString()
                issued, parts = version, (head, models)  # fields parse in any order
                changed[site.site_id] = (head, digest)
            known[site.site_id] = (key, issued, parts)
        # Stored before it is sent: each head, whose models placement holds (a
        # thousand sites' states in full were 100 MB a change).
        self._still_leading()
        await self._store.put_desired_many(changed)
        self._still_leading()
        self.changed_last_round = len(changed)
        for site in sites:
            _, issued, (head, models) = known[site.site_id]
            self._publisher.publish(
                desired_topic(site.site_id),
                DESIRED,
                site_audience(site.site_id),
                issued,
                head,
                models,  # the tail: deflated once while the site's models stay
            )
        # Routes change only with what decides them: unchanged (the usual round), none
        # is rebuilt (five regions of a thousand sites' holders: a quarter second).
        routes_key = (
            tuple(sorted(by_name)),
            tuple(
                (s.site_id, s.address, s.http_address, s.region, s.up, headroom.get(s.site_id))
                for s in sites
            ),
            tuple(tuple(result.loaded.get(s.site_id, ())) for s in sites),
        )
        if routes_key == self._routes_key:
            return
        self._routes_key = routes_key
        # Each model's holders, found once (not a scan of every site per model).
        holding: dict[str, list[pb.Site]] = {}
        for site in sites:
            if site.up:
                for model in result.loaded.get(site.site_id, ()):
                    holding.setdefault(model, []).append(site)
        for region in sorted({s.region for s in sites}):
            routes = pb.Routes(version=version, region=region, issued_at=now)
            for model in sorted(by_name):
                holders = sorted(
                    holding.get(model, ()),
                    key=lambda s: (latency(inp, region, s.region), s.site_id),
                )
                if holders:
                    routes.routes.append(
                        pb.Route(
                            model=model,
                            targets=[
                                pb.RouteTarget(
                                    site_id=s.site_id,
                                    address=s.address,
                                    http_address=s.http_address,
                                    region=s.region,
                                    latency_ms=min(latency(inp, region, s.region), 1e9),
                                    headroom=headroom.get(s.site_id),
                                )
                                for s in holders
                            ],
                        )
                    )
            stable = _unversioned(routes)
            if self._routes_sent.get(region) != stable:  # re-send only what changed
                self._routes_sent[region] = stable
                self._publisher.publish(
                    routes_topic(region),
                    ROUTES,
                    region_audience(region),
                    version,
                    routes.SerializeToString(),
                )


def site_headroom(reports: dict[str, pb.LoadReport]) -> dict[str, float]:
    """Per site, the share of its busiest device left free at its last report, in
    steps of 0.1 so that routes change (and are re-published) only when it moves."""
    return {
        site: round(1.0 - max((d.utilization for d in r.devices), default=0.0), 1)
        for site, r in reports.items()
    }


def desired_model(m: pb.CatalogModel, tier: str) -> pb.DesiredModel:
    return pb.DesiredModel(
        name=m.name,
        version=m.version,
        artifact_uri=m.artifact_uri,
        sha256=m.sha256,
        size_bytes=m.size_bytes,
        tier=tier,
        pin=m.pin,
        priority=m.priority,
        variants=m.variants,
        quality=m.quality,
    )


def _tenants_json(tenants: TenantTable, rates: dict[str, dict[str, float]]) -> Callable[[str], str]:
    """Each site's tenant table as its desired state carries it (JSON of for_site's
    table): a tenant whose rate is not split by site is dumped once a round, not
    once per site (100 tenants at 1,000 sites: 0.45 s a round)."""
    records = {t.name: t.model_dump() for t in tenants.tenants.values()}
    split = tenants.with_tenants(t for t in tenants.tenants.values() if t.name in rates)
    if not split:
        shared = json.dumps(list(records.values()), sort_keys=True)
        return lambda site: shared

    def at(site: str) -> str:
        mine = {t.name: t.model_dump() for t in for_site(split, rates, site).tenants.values()}
        return json.dumps([mine.get(name, r) for name, r in records.items()], sort_keys=True)

    return at


_MODELS_TAG = bytes([4 << 3 | 2])  # DesiredState.models: field 4, length-delimited


def _model_field(encoded: bytes) -> bytes:
    """One DesiredState.models entry as the message encodes it: tag, length, bytes."""
    size, length = len(encoded), bytearray()
    while size >= 0x80:
        length.append(size & 0x7F | 0x80)
        size >>= 7
    length.append(size)
    return _MODELS_TAG + bytes(length) + encoded


def _unversioned(routes: pb.Routes) -> bytes:
    """Routes without version and time: what decides whether the table changed."""
    stable = pb.Routes()
    stable.CopyFrom(routes)
    stable.version = 0
    stable.issued_at = 0
    return stable.SerializeToString()

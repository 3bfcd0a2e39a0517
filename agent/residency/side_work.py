"""The owner's events for background work: staged copies, prepacked rebuilds,
elastic instances, variant builds, and form swaps (a model moved between its
original and a variant while it serves).

The owner holds one `SideWork` and is still the one writer: effects report here
(`owner.side`), on the agent's event loop, and nothing here awaits.

Forms: a model that accepts variants (`quality: any`) loads as its smallest
usable variant when its original would take room from others (the planner
decides, lifecycle.pump applies it). When the site has gone CALM_S
without such pressure and no load waits, the most used model serving a variant
is swapped back to its original, one at a time, provided the original fits
beside everything held: the runner builds the new session while the old one
serves, so both are reserved until the swap.
"""

from __future__ import annotations

from collections.abc import Callable

from edgeplex.agent.catalog.forms import ORIGINAL, VariantReport
from edgeplex.agent.residency.contract import Effects, Loaded
from edgeplex.agent.residency.ledger import Ledger
from edgeplex.agent.residency.lifecycle import CALM_S, Lifecycle
from edgeplex.agent.residency.state import Chore, Intent, ModelKey, ModelRecord, Phase


class SideWork:
    def __init__(
        self, ledger: Ledger, life: Lifecycle, effects: Effects, clock: Callable[[], float]
    ) -> None:
        self._ledger = ledger
        self._life = life
        self._effects = effects
        self._clock = clock
        self._wanting: set[ModelKey] = set()  # models whose variants are not all built

    # --- staged copies, prepacking, instances -------------------------------------------

    def staged(self, key: ModelKey, staged_bytes: int, form: str = ORIGINAL) -> None:
        record = self._ledger.by_key.get(key)
        if record is None:
            return
        record.chore = Chore.NONE
        if form:
            record.staged_variant_bytes = max(record.staged_variant_bytes, staged_bytes)
        elif staged_bytes and record.phase not in (Phase.READY, Phase.DRAINING):
            record.staged_bytes = staged_bytes
        self._stage_smaller(record)
        self._life.fit_host_budget()

    def prepacked(self, key: ModelKey, generation: int, bytes_delta: int | None) -> None:
        record = self._ledger.by_key.get(key)
        if record is None:
            return
        record.chore = Chore.NONE
        if record.generation != generation or record.phase != Phase.READY:
            return
        record.reserved_bytes = 0  # the transient copy is gone
        record.prepacked = True  # also when it failed: do not retry a model that cannot be
        if bytes_delta is not None:
            record.measure(record.device_bytes + bytes_delta)
            self._life.fit_measured(record)

    def scaled(self, key: ModelKey) -> None:
        record = self._ledger.by_key.get(key)
        if record is not None and record.chore == Chore.SCALE:
            record.chore = Chore.NONE

    # --- variants -------------------------------------------------------------------------

    def wants_variants(self, record: ModelRecord) -> None:
        """`record` is new, or its artifact or config changed: build what it lacks."""
        if record.source.config is not None and record.source.config.variants:
            self._wanting.add(record.key)

    def want_variants(self) -> None:
        """Build the variants models' configs ask for and they do not have yet (on the
        tick, so staging at start goes first; each model's build waits for its other
        side work)."""
        for key in list(self._wanting):
            record = self._ledger.by_key.get(key)
            config = record.source.config if record is not None else None
            if record is None or config is None:
                self._wanting.discard(key)
                continue
            missing: list[str] = [f for f in config.variants if f not in record.variants]
            if not missing:
                self._wanting.discard(key)
            elif not record.chore and record.phase != Phase.FAILED:
                record.chore = Chore.VARIANTS
                self._effects.build_variants(record, missing)

    def variants_built(self, key: ModelKey, digest: str, reports: list[VariantReport]) -> None:
        record = self._ledger.by_key.get(key)
        if record is None:
            return
        if record.chore == Chore.VARIANTS:
            record.chore = Chore.NONE
        if record.source.digest != digest:  # replaced meanwhile: the tick builds anew
            record.variants.clear()
            return
        for report in reports:
            record.variants[report.form] = report
        self._stage_smaller(record)
        self._life.pump()  # a queued load may start as a variant now

    def _stage_smaller(self, record: ModelRecord) -> None:
        """Stage the variant a model would load as, like its original, so that a load
        as the variant is a staged promotion; once, when no other side work runs."""
        smaller = record.smaller_form()
        if smaller and not record.staged_variant_bytes and not record.chore:
            record.chore = Chore.STAGE
            self._effects.stage(record, smaller)

    # --- forms ----------------------------------------------------------------------------

    def restore_forms(self) -> None:
        """Swap the most used model serving a variant back to its original, when room
        has been calm long enough and the original fits beside everything held."""
        now = self._clock()
        if now - self._ledger.pressed_at < CALM_S or self._ledger.queued():
            return
        records = self._ledger.all_records()
        if any(r.chore == Chore.REFORM for r in records):
            return
        waiting = [
            r
            for r in records
            if r.phase == Phase.READY and r.form and not r.chore and r.intent == Intent.NONE
        ]
        budget = self._life.limits.device_budget
        for record in sorted(waiting, key=lambda r: -r.usage.frequency):
            need = record.estimate_bytes(ORIGINAL)
            if budget is None or self._ledger.device_bytes() + need <= budget:
                self._life.swap(record, ORIGINAL)
                return

    def reformed(self, key: ModelKey, generation: int, form: str, loaded: Loaded | None) -> None:
        """The runner swapped `key`'s session to `form` (`loaded`), or could not (None)."""
        record = self._ledger.by_key.get(key)
        if record is None:
            return
        if record.chore == Chore.REFORM:
            record.chore = Chore.NONE
        if record.generation == generation and record.phase == Phase.READY:
            record.reserved_bytes = 0  # the old session is gone, or the new one never came
            if loaded is not None:
                if form:
                    record.staged_variant_bytes = max(
                        record.staged_variant_bytes, loaded.staged_bytes
                    )
                record.form = form
                record.measure(loaded.bytes)
                record.prepacked = loaded.prepacked
                self._life.fit_measured(record)
        self._life.pump()

from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelLookup(_message.Message):
    __slots__ = ("site_id", "model", "origin_region", "nonce")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_REGION_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    model: str
    origin_region: str
    nonce: bytes
    def __init__(self, site_id: _Optional[str] = ..., model: _Optional[str] = ..., origin_region: _Optional[str] = ..., nonce: _Optional[bytes] = ...) -> None: ...

class CatalogEntry(_message.Message):
    __slots__ = ("nonce", "found", "model", "reason")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    found: bool
    model: DesiredModel
    reason: str
    def __init__(self, nonce: _Optional[bytes] = ..., found: _Optional[bool] = ..., model: _Optional[_Union[DesiredModel, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("kind", "index", "memory_bytes")
    KIND_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    kind: str
    index: int
    memory_bytes: int
    def __init__(self, kind: _Optional[str] = ..., index: _Optional[int] = ..., memory_bytes: _Optional[int] = ...) -> None: ...

class TierBudgets(_message.Message):
    __slots__ = ("device_bytes", "host_bytes", "disk_bytes")
    DEVICE_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOST_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    device_bytes: int
    host_bytes: int
    disk_bytes: int
    def __init__(self, device_bytes: _Optional[int] = ..., host_bytes: _Optional[int] = ..., disk_bytes: _Optional[int] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("site_id", "region", "address", "http_address", "devices", "budgets", "execution_providers", "agent_version")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HTTP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    region: str
    address: str
    http_address: str
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    budgets: TierBudgets
    execution_providers: _containers.RepeatedScalarFieldContainer[str]
    agent_version: str
    def __init__(self, site_id: _Optional[str] = ..., region: _Optional[str] = ..., address: _Optional[str] = ..., http_address: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., budgets: _Optional[_Union[TierBudgets, _Mapping]] = ..., execution_providers: _Optional[_Iterable[str]] = ..., agent_version: _Optional[str] = ...) -> None: ...

class AddSiteRequest(_message.Message):
    __slots__ = ("site_id", "region")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    region: str
    def __init__(self, site_id: _Optional[str] = ..., region: _Optional[str] = ...) -> None: ...

class AddSiteResponse(_message.Message):
    __slots__ = ("site_id", "join_token", "mqtt_password")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    JOIN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MQTT_PASSWORD_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    join_token: str
    mqtt_password: str
    def __init__(self, site_id: _Optional[str] = ..., join_token: _Optional[str] = ..., mqtt_password: _Optional[str] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("lease_s", "report_interval_s", "desired_topic", "signing_key_id", "signing_public_key")
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    REPORT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    DESIRED_TOPIC_FIELD_NUMBER: _ClassVar[int]
    SIGNING_KEY_ID_FIELD_NUMBER: _ClassVar[int]
    SIGNING_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    lease_s: float
    report_interval_s: float
    desired_topic: str
    signing_key_id: str
    signing_public_key: bytes
    def __init__(self, lease_s: _Optional[float] = ..., report_interval_s: _Optional[float] = ..., desired_topic: _Optional[str] = ..., signing_key_id: _Optional[str] = ..., signing_public_key: _Optional[bytes] = ...) -> None: ...

class ModelLoad(_message.Message):
    __slots__ = ("name", "version", "rate_by_region", "p50_ms", "p99_ms", "queue_depth", "tier", "memory_bytes", "state", "reason", "variant", "bytes_by_variant", "variant_guard")
    class RateByRegionEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class BytesByVariantEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class VariantGuardEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RATE_BY_REGION_FIELD_NUMBER: _ClassVar[int]
    P50_MS_FIELD_NUMBER: _ClassVar[int]
    P99_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    BYTES_BY_VARIANT_FIELD_NUMBER: _ClassVar[int]
    VARIANT_GUARD_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    rate_by_region: _containers.ScalarMap[str, float]
    p50_ms: float
    p99_ms: float
    queue_depth: int
    tier: str
    memory_bytes: int
    state: str
    reason: str
    variant: str
    bytes_by_variant: _containers.ScalarMap[str, int]
    variant_guard: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., rate_by_region: _Optional[_Mapping[str, float]] = ..., p50_ms: _Optional[float] = ..., p99_ms: _Optional[float] = ..., queue_depth: _Optional[int] = ..., tier: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., variant: _Optional[str] = ..., bytes_by_variant: _Optional[_Mapping[str, int]] = ..., variant_guard: _Optional[_Mapping[str, str]] = ...) -> None: ...

class DeviceLoad(_message.Message):
    __slots__ = ("index", "used_bytes", "budget_bytes", "utilization")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    index: int
    used_bytes: int
    budget_bytes: int
    utilization: float
    def __init__(self, index: _Optional[int] = ..., used_bytes: _Optional[int] = ..., budget_bytes: _Optional[int] = ..., utilization: _Optional[float] = ...) -> None: ...

class LoadReport(_message.Message):
    __slots__ = ("site_id", "sent_at", "models", "devices", "desired_version")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    DESIRED_VERSION_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    sent_at: float
    models: _containers.RepeatedCompositeFieldContainer[ModelLoad]
    devices: _containers.RepeatedCompositeFieldContainer[DeviceLoad]
    desired_version: int
    def __init__(self, site_id: _Optional[str] = ..., sent_at: _Optional[float] = ..., models: _Optional[_Iterable[_Union[ModelLoad, _Mapping]]] = ..., devices: _Optional[_Iterable[_Union[DeviceLoad, _Mapping]]] = ..., desired_version: _Optional[int] = ...) -> None: ...

class ReportSummary(_message.Message):
    __slots__ = ("reports",)
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    reports: int
    def __init__(self, reports: _Optional[int] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TenantSpec(_message.Message):
    __slots__ = ("name", "rate", "burst", "concurrency", "weight", "models", "models_given", "fleet_rate")
    NAME_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    MODELS_GIVEN_FIELD_NUMBER: _ClassVar[int]
    FLEET_RATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    rate: float
    burst: int
    concurrency: int
    weight: float
    models: _containers.RepeatedScalarFieldContainer[str]
    models_given: bool
    fleet_rate: float
    def __init__(self, name: _Optional[str] = ..., rate: _Optional[float] = ..., burst: _Optional[int] = ..., concurrency: _Optional[int] = ..., weight: _Optional[float] = ..., models: _Optional[_Iterable[str]] = ..., models_given: _Optional[bool] = ..., fleet_rate: _Optional[float] = ...) -> None: ...

class TenantKeyInfo(_message.Message):
    __slots__ = ("id", "created")
    ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    id: str
    created: float
    def __init__(self, id: _Optional[str] = ..., created: _Optional[float] = ...) -> None: ...

class TenantInfo(_message.Message):
    __slots__ = ("name", "rate", "burst", "concurrency", "weight", "models", "keys", "fleet_rate")
    NAME_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    FLEET_RATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    rate: float
    burst: int
    concurrency: int
    weight: float
    models: _containers.RepeatedScalarFieldContainer[str]
    keys: _containers.RepeatedCompositeFieldContainer[TenantKeyInfo]
    fleet_rate: float
    def __init__(self, name: _Optional[str] = ..., rate: _Optional[float] = ..., burst: _Optional[int] = ..., concurrency: _Optional[int] = ..., weight: _Optional[float] = ..., models: _Optional[_Iterable[str]] = ..., keys: _Optional[_Iterable[_Union[TenantKeyInfo, _Mapping]]] = ..., fleet_rate: _Optional[float] = ...) -> None: ...

class TenantName(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListTenantsResponse(_message.Message):
    __slots__ = ("tenants",)
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    tenants: _containers.RepeatedCompositeFieldContainer[TenantInfo]
    def __init__(self, tenants: _Optional[_Iterable[_Union[TenantInfo, _Mapping]]] = ...) -> None: ...

class IssuedKey(_message.Message):
    __slots__ = ("tenant", "key_id", "key")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key_id: str
    key: str
    def __init__(self, tenant: _Optional[str] = ..., key_id: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class KeyRef(_message.Message):
    __slots__ = ("tenant", "key_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key_id: str
    def __init__(self, tenant: _Optional[str] = ..., key_id: _Optional[str] = ...) -> None: ...

class CatalogModel(_message.Message):
    __slots__ = ("name", "version", "artifact_uri", "sha256", "size_bytes", "slo_ms", "min_replicas", "regions", "priority", "pin", "state", "reason", "added_at", "device_bytes", "variants", "quality")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_URI_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SLO_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PIN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ADDED_AT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_BYTES_FIELD_NUMBER: _ClassVar[int]
    VARIANTS_FIELD_NUMBER: _ClassVar[int]
    QUALITY_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    artifact_uri: str
    sha256: str
    size_bytes: int
    slo_ms: float
    min_replicas: int
    regions: _containers.RepeatedScalarFieldContainer[str]
    priority: int
    pin: bool
    state: str
    reason: str
    added_at: float
    device_bytes: int
    variants: _containers.RepeatedScalarFieldContainer[str]
    quality: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., artifact_uri: _Optional[str] = ..., sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ..., slo_ms: _Optional[float] = ..., min_replicas: _Optional[int] = ..., regions: _Optional[_Iterable[str]] = ..., priority: _Optional[int] = ..., pin: _Optional[bool] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., added_at: _Optional[float] = ..., device_bytes: _Optional[int] = ..., variants: _Optional[_Iterable[str]] = ..., quality: _Optional[str] = ...) -> None: ...

class ModelName(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[CatalogModel]
    def __init__(self, models: _Optional[_Iterable[_Union[CatalogModel, _Mapping]]] = ...) -> None: ...

class SiteModelState(_message.Message):
    __slots__ = ("site_id", "tier", "state", "reason", "rate", "variant", "variant_guard")
    class VariantGuardEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    VARIANT_GUARD_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    tier: str
    state: str
    reason: str
    rate: float
    variant: str
    variant_guard: _containers.ScalarMap[str, str]
    def __init__(self, site_id: _Optional[str] = ..., tier: _Optional[str] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., rate: _Optional[float] = ..., variant: _Optional[str] = ..., variant_guard: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ModelDetail(_message.Message):
    __slots__ = ("model", "sites")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SITES_FIELD_NUMBER: _ClassVar[int]
    model: CatalogModel
    sites: _containers.RepeatedCompositeFieldContainer[SiteModelState]
    def __init__(self, model: _Optional[_Union[CatalogModel, _Mapping]] = ..., sites: _Optional[_Iterable[_Union[SiteModelState, _Mapping]]] = ...) -> None: ...

class Site(_message.Message):
    __slots__ = ("site_id", "region", "address", "http_address", "budgets", "execution_providers", "up", "cordoned", "draining", "registered_at", "last_report_at", "device_used_bytes", "loaded")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HTTP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    CORDONED_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_REPORT_AT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    region: str
    address: str
    http_address: str
    budgets: TierBudgets
    execution_providers: _containers.RepeatedScalarFieldContainer[str]
    up: bool
    cordoned: bool
    draining: bool
    registered_at: float
    last_report_at: float
    device_used_bytes: int
    loaded: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, site_id: _Optional[str] = ..., region: _Optional[str] = ..., address: _Optional[str] = ..., http_address: _Optional[str] = ..., budgets: _Optional[_Union[TierBudgets, _Mapping]] = ..., execution_providers: _Optional[_Iterable[str]] = ..., up: _Optional[bool] = ..., cordoned: _Optional[bool] = ..., draining: _Optional[bool] = ..., registered_at: _Optional[float] = ..., last_report_at: _Optional[float] = ..., device_used_bytes: _Optional[int] = ..., loaded: _Optional[_Iterable[str]] = ...) -> None: ...

class ListSitesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSitesResponse(_message.Message):
    __slots__ = ("sites",)
    SITES_FIELD_NUMBER: _ClassVar[int]
    sites: _containers.RepeatedCompositeFieldContainer[Site]
    def __init__(self, sites: _Optional[_Iterable[_Union[Site, _Mapping]]] = ...) -> None: ...

class SiteAction(_message.Message):
    __slots__ = ("site_id", "undo")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    UNDO_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    undo: bool
    def __init__(self, site_id: _Optional[str] = ..., undo: _Optional[bool] = ...) -> None: ...

class PlacementRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SitePlacement(_message.Message):
    __slots__ = ("site_id", "loaded", "staged")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    STAGED_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    loaded: _containers.RepeatedScalarFieldContainer[str]
    staged: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, site_id: _Optional[str] = ..., loaded: _Optional[_Iterable[str]] = ..., staged: _Optional[_Iterable[str]] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("version", "computed_at", "sites", "objective", "served_fraction", "leader")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_AT_FIELD_NUMBER: _ClassVar[int]
    SITES_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    SERVED_FRACTION_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    version: int
    computed_at: float
    sites: _containers.RepeatedCompositeFieldContainer[SitePlacement]
    objective: float
    served_fraction: float
    leader: str
    def __init__(self, version: _Optional[int] = ..., computed_at: _Optional[float] = ..., sites: _Optional[_Iterable[_Union[SitePlacement, _Mapping]]] = ..., objective: _Optional[float] = ..., served_fraction: _Optional[float] = ..., leader: _Optional[str] = ...) -> None: ...

class PlacementExplanation(_message.Message):
    __slots__ = ("model", "lines")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    model: str
    lines: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[str] = ..., lines: _Optional[_Iterable[str]] = ...) -> None: ...

class BatchSubmit(_message.Message):
    __slots__ = ("model", "inputs", "shard_size")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    SHARD_SIZE_FIELD_NUMBER: _ClassVar[int]
    model: str
    inputs: _containers.RepeatedScalarFieldContainer[str]
    shard_size: int
    def __init__(self, model: _Optional[str] = ..., inputs: _Optional[_Iterable[str]] = ..., shard_size: _Optional[int] = ...) -> None: ...

class BatchShard(_message.Message):
    __slots__ = ("index", "state", "site_id", "attempts")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    state: str
    site_id: str
    attempts: int
    def __init__(self, index: _Optional[int] = ..., state: _Optional[str] = ..., site_id: _Optional[str] = ..., attempts: _Optional[int] = ...) -> None: ...

class BatchJob(_message.Message):
    __slots__ = ("job_id", "model", "state", "items", "shards", "shards_done", "items_failed", "created_at", "finished_at", "shard_states")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    SHARDS_DONE_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FAILED_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    SHARD_STATES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    model: str
    state: str
    items: int
    shards: int
    shards_done: int
    items_failed: int
    created_at: float
    finished_at: float
    shard_states: _containers.RepeatedCompositeFieldContainer[BatchShard]
    def __init__(self, job_id: _Optional[str] = ..., model: _Optional[str] = ..., state: _Optional[str] = ..., items: _Optional[int] = ..., shards: _Optional[int] = ..., shards_done: _Optional[int] = ..., items_failed: _Optional[int] = ..., created_at: _Optional[float] = ..., finished_at: _Optional[float] = ..., shard_states: _Optional[_Iterable[_Union[BatchShard, _Mapping]]] = ...) -> None: ...

class BatchRef(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListBatchesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListBatchesResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[BatchJob]
    def __init__(self, jobs: _Optional[_Iterable[_Union[BatchJob, _Mapping]]] = ...) -> None: ...

class BatchResults(_message.Message):
    __slots__ = ("job_id", "outputs")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    outputs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_id: _Optional[str] = ..., outputs: _Optional[_Iterable[str]] = ...) -> None: ...

class DesiredState(_message.Message):
    __slots__ = ("version", "site_id", "issued_at", "models", "peer_token", "tenants_json")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    PEER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TENANTS_JSON_FIELD_NUMBER: _ClassVar[int]
    version: int
    site_id: str
    issued_at: float
    models: _containers.RepeatedCompositeFieldContainer[DesiredModel]
    peer_token: str
    tenants_json: str
    def __init__(self, version: _Optional[int] = ..., site_id: _Optional[str] = ..., issued_at: _Optional[float] = ..., models: _Optional[_Iterable[_Union[DesiredModel, _Mapping]]] = ..., peer_token: _Optional[str] = ..., tenants_json: _Optional[str] = ...) -> None: ...

class SignedMessage(_message.Message):
    __slots__ = ("body", "key_id", "signature")
    BODY_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    key_id: str
    signature: bytes
    def __init__(self, body: _Optional[bytes] = ..., key_id: _Optional[str] = ..., signature: _Optional[bytes] = ...) -> None: ...

class SignedBody(_message.Message):
    __slots__ = ("kind", "audience", "version", "expires_at", "payload", "encoding")
    KIND_FIELD_NUMBER: _ClassVar[int]
    AUDIENCE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    kind: str
    audience: str
    version: int
    expires_at: float
    payload: bytes
    encoding: str
    def __init__(self, kind: _Optional[str] = ..., audience: _Optional[str] = ..., version: _Optional[int] = ..., expires_at: _Optional[float] = ..., payload: _Optional[bytes] = ..., encoding: _Optional[str] = ...) -> None: ...

class KeyRollover(_message.Message):
    __slots__ = ("key_id", "public_key")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    public_key: bytes
    def __init__(self, key_id: _Optional[str] = ..., public_key: _Optional[bytes] = ...) -> None: ...

class DesiredModel(_message.Message):
    __slots__ = ("name", "version", "artifact_uri", "sha256", "size_bytes", "tier", "pin", "priority", "variants", "quality")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_URI_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    PIN_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    VARIANTS_FIELD_NUMBER: _ClassVar[int]
    QUALITY_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    artifact_uri: str
    sha256: str
    size_bytes: int
    tier: str
    pin: bool
    priority: int
    variants: _containers.RepeatedScalarFieldContainer[str]
    quality: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., artifact_uri: _Optional[str] = ..., sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ..., tier: _Optional[str] = ..., pin: _Optional[bool] = ..., priority: _Optional[int] = ..., variants: _Optional[_Iterable[str]] = ..., quality: _Optional[str] = ...) -> None: ...

class Routes(_message.Message):
    __slots__ = ("version", "region", "issued_at", "routes")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    version: int
    region: str
    issued_at: float
    routes: _containers.RepeatedCompositeFieldContainer[Route]
    def __init__(self, version: _Optional[int] = ..., region: _Optional[str] = ..., issued_at: _Optional[float] = ..., routes: _Optional[_Iterable[_Union[Route, _Mapping]]] = ...) -> None: ...

class Route(_message.Message):
    __slots__ = ("model", "targets")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    model: str
    targets: _containers.RepeatedCompositeFieldContainer[RouteTarget]
    def __init__(self, model: _Optional[str] = ..., targets: _Optional[_Iterable[_Union[RouteTarget, _Mapping]]] = ...) -> None: ...

class RouteTarget(_message.Message):
    __slots__ = ("site_id", "address", "http_address", "region", "latency_ms", "headroom")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HTTP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    HEADROOM_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    address: str
    http_address: str
    region: str
    latency_ms: float
    headroom: float
    def __init__(self, site_id: _Optional[str] = ..., address: _Optional[str] = ..., http_address: _Optional[str] = ..., region: _Optional[str] = ..., latency_ms: _Optional[float] = ..., headroom: _Optional[float] = ...) -> None: ...

class UsageRecord(_message.Message):
    __slots__ = ("tenant", "model", "version", "requests", "failures", "bytes_in", "bytes_out", "compute_s", "cold_starts", "device_byte_seconds")
    class FailuresEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    BYTES_IN_FIELD_NUMBER: _ClassVar[int]
    BYTES_OUT_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    COLD_STARTS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_BYTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    model: str
    version: str
    requests: int
    failures: _containers.ScalarMap[str, int]
    bytes_in: int
    bytes_out: int
    compute_s: float
    cold_starts: int
    device_byte_seconds: float
    def __init__(self, tenant: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., requests: _Optional[int] = ..., failures: _Optional[_Mapping[str, int]] = ..., bytes_in: _Optional[int] = ..., bytes_out: _Optional[int] = ..., compute_s: _Optional[float] = ..., cold_starts: _Optional[int] = ..., device_byte_seconds: _Optional[float] = ...) -> None: ...

class UsageReport(_message.Message):
    __slots__ = ("site_id", "minute", "interval_s", "records")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    MINUTE_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    minute: int
    interval_s: int
    records: _containers.RepeatedCompositeFieldContainer[UsageRecord]
    def __init__(self, site_id: _Optional[str] = ..., minute: _Optional[int] = ..., interval_s: _Optional[int] = ..., records: _Optional[_Iterable[_Union[UsageRecord, _Mapping]]] = ...) -> None: ...

class UsageHour(_message.Message):
    __slots__ = ("sum", "minutes", "sealed")
    SUM_FIELD_NUMBER: _ClassVar[int]
    MINUTES_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    sum: UsageReport
    minutes: _containers.RepeatedScalarFieldContainer[int]
    sealed: bool
    def __init__(self, sum: _Optional[_Union[UsageReport, _Mapping]] = ..., minutes: _Optional[_Iterable[int]] = ..., sealed: _Optional[bool] = ...) -> None: ...

class UsageAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UsageQuery(_message.Message):
    __slots__ = ("tenant", "from_time", "to_time", "by")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    FROM_TIME_FIELD_NUMBER: _ClassVar[int]
    TO_TIME_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    from_time: float
    to_time: float
    by: str
    def __init__(self, tenant: _Optional[str] = ..., from_time: _Optional[float] = ..., to_time: _Optional[float] = ..., by: _Optional[str] = ...) -> None: ...

class UsageRow(_message.Message):
    __slots__ = ("tenant", "key", "requests", "failures", "bytes_in", "bytes_out", "compute_s", "cold_starts", "device_byte_seconds")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    BYTES_IN_FIELD_NUMBER: _ClassVar[int]
    BYTES_OUT_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    COLD_STARTS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_BYTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key: str
    requests: int
    failures: int
    bytes_in: int
    bytes_out: int
    compute_s: float
    cold_starts: int
    device_byte_seconds: float
    def __init__(self, tenant: _Optional[str] = ..., key: _Optional[str] = ..., requests: _Optional[int] = ..., failures: _Optional[int] = ..., bytes_in: _Optional[int] = ..., bytes_out: _Optional[int] = ..., compute_s: _Optional[float] = ..., cold_starts: _Optional[int] = ..., device_byte_seconds: _Optional[float] = ...) -> None: ...

class UsageTable(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[UsageRow]
    def __init__(self, rows: _Optional[_Iterable[_Union[UsageRow, _Mapping]]] = ...) -> None: ...

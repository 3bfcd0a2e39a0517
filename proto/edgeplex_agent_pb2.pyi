from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelRef(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DemoteRequest(_message.Message):
    __slots__ = ("name", "tier")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    name: str
    tier: str
    def __init__(self, name: _Optional[str] = ..., tier: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MemoryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TierUsage(_message.Message):
    __slots__ = ("bytes", "budget")
    BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    budget: int
    def __init__(self, bytes: _Optional[int] = ..., budget: _Optional[int] = ...) -> None: ...

class MemoryResponse(_message.Message):
    __slots__ = ("policy", "tiers")
    class TiersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: TierUsage
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[TierUsage, _Mapping]] = ...) -> None: ...
    POLICY_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    policy: str
    tiers: _containers.MessageMap[str, TierUsage]
    def __init__(self, policy: _Optional[str] = ..., tiers: _Optional[_Mapping[str, TierUsage]] = ...) -> None: ...

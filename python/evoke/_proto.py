"""The evoke.v1 message classes, built at import time.

The package ships no generated _pb2 modules: they are tied to the protobuf
runtime of the protoc that made them, and serving stacks pin runtimes much
newer (or older) than the one evoke is built with. Instead the build writes
a descriptor set of proto/evoke/v1 (evoke_v1.desc, beside this file) and the
classes are made from it here with whatever runtime the interpreter has.
"""

import os

from google.protobuf import descriptor_pb2
from google.protobuf import descriptor_pool
from google.protobuf import message_factory

_DESCRIPTOR_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "evoke_v1.desc")

PACKAGE = "evoke.v1"
SERVICE = "evoke.v1.KvTier"


def _load_pool():
    try:
        with open(_DESCRIPTOR_FILE, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ImportError(
            f"evoke: {_DESCRIPTOR_FILE} is missing ({e.strerror}); the package is "
            "laid out by the build (<build>/python) or by `cmake --install`, "
            "not used from the source tree") from None
    files = descriptor_pb2.FileDescriptorSet.FromString(data)
    # A private pool: the default pool may already hold other definitions
    # (or another copy of these) from the application.
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:
        pool.Add(f)
    return pool, [f.name for f in files.file]


def _message_class(pool, full_name):
    desc = pool.FindMessageTypeByName(full_name)
    get_class = getattr(message_factory, "GetMessageClass", None)
    if get_class is not None:  # protobuf >= 4.22
        return get_class(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)


_POOL, _FILES = _load_pool()


class _Namespace:
    """Holds the message classes and enum values of evoke.v1 as attributes:
    pb.SaveRequest, pb.BlockMeta, pb.TIER_PINNED_HOST, ..."""

    def __repr__(self):
        return "<evoke.pb: message classes of evoke.v1>"


pb = _Namespace()


def _populate():
    for name in _FILES:
        fd = _POOL.FindFileByName(name)
        if fd.package != PACKAGE:
            continue
        for msg in fd.message_types_by_name.values():
            cls = _message_class(_POOL, msg.full_name)
            setattr(pb, msg.name, cls)
        for enum in fd.enum_types_by_name.values():
            setattr(pb, enum.name, enum)
            for value in enum.values:
                setattr(pb, value.name, value.number)


_populate()


def enum_name(enum_type_name, number):
    """The name of value `number` of enum `enum_type_name` (e.g. "Tier"),
    or str(number) when it has none."""
    enum = getattr(pb, enum_type_name)
    value = enum.values_by_number.get(number)
    return value.name if value is not None else str(number)


def runtime():
    """Which protobuf runtime the classes were built with: (version, kind)."""
    import google.protobuf
    try:
        from google.protobuf.internal import api_implementation
        kind = api_implementation.Type()
    except ImportError:  # pragma: no cover - very old or very new runtimes
        kind = "unknown"
    return google.protobuf.__version__, kind

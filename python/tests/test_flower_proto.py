"""fedfuse's Flower .proto files (crates/flower-proto/proto) against the pinned flwr wheel.

Compiles fedfuse's files with grpc_tools' protoc into a FileDescriptorSet and compares every
message, enum and service they define with the same-named descriptor that flwr ships, field
by field. A mismatch fails naming the message and the field.
"""

import importlib
import importlib.metadata
import importlib.resources
import tempfile
from pathlib import Path

import pytest

from conftest import ROOT

protoc = pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools (scripts/flower-venv.sh)")
pytest.importorskip("flwr")
import grpc_tools  # noqa: E402
from google.protobuf import descriptor_pb2  # noqa: E402

PROTO_ROOT = ROOT / "crates" / "flower-proto" / "proto"
FLWR_VERSION = "1.41.0"

# Field attributes compared one by one.
FIELD_ATTRS = ("number", "type", "label", "type_name", "extendee", "default_value", "proto3_optional")


def ours() -> descriptor_pb2.FileDescriptorSet:
    files = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.glob("flwr/proto/*.proto"))
    assert files, f"no .proto files under {PROTO_ROOT}"
    include = str(importlib.resources.files(grpc_tools) / "_proto")  # google/protobuf/*.proto
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "flower.pb"
        args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--descriptor_set_out={out}", *files]
        assert protoc.main(args) == 0, f"protoc failed on {files} (see its output above)"
        fds = descriptor_pb2.FileDescriptorSet()
        fds.ParseFromString(out.read_bytes())
    return fds


def flwr_file(name: str) -> descriptor_pb2.FileDescriptorProto:
    """flwr's descriptor for `flwr/proto/<x>.proto`, from `flwr.proto.<x>_pb2`."""
    stem = name.removeprefix("flwr/proto/").removesuffix(".proto")
    module = importlib.import_module(f"flwr.proto.{stem}_pb2")
    fd = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(fd)
    return fd


def describe_field(msg: descriptor_pb2.DescriptorProto, f: descriptor_pb2.FieldDescriptorProto) -> dict:
    d = {attr: getattr(f, attr) for attr in FIELD_ATTRS}
    d["type"] = descriptor_pb2.FieldDescriptorProto.Type.Name(f.type)  # TYPE_SINT64, not 18
    d["label"] = descriptor_pb2.FieldDescriptorProto.Label.Name(f.label)
    d["oneof"] = msg.oneof_decl[f.oneof_index].name if f.HasField("oneof_index") else None
    d["options"] = f.options.SerializeToString(deterministic=True)
    return d


def compare_message(where: str, mine, theirs):
    """Yields one line per difference between two messages, nested ones included."""
    their_fields = {f.name: f for f in theirs.field}
    my_fields = {f.name: f for f in mine.field}
    for name in their_fields:
        if name not in my_fields:
            yield f"{where}: field {name!r} (= {their_fields[name].number}) is missing"
    for name in my_fields:
        if name not in their_fields:
            yield f"{where}: field {name!r} (= {my_fields[name].number}) is not in flwr's {where}"
    for name in [n for n in my_fields if n in their_fields]:
        a = describe_field(mine, my_fields[name])
        b = describe_field(theirs, their_fields[name])
        for key in a:
            if a[key] != b[key]:
                yield f"{where}.{name}: {key} is {a[key]!r}, flwr {FLWR_VERSION} has {b[key]!r}"
    if [o.name for o in mine.oneof_decl] != [o.name for o in theirs.oneof_decl]:
        yield (
            f"{where}: oneofs {[o.name for o in mine.oneof_decl]}, "
            f"flwr has {[o.name for o in theirs.oneof_decl]}"
        )
    if mine.options.map_entry != theirs.options.map_entry:
        yield f"{where}: map_entry is {mine.options.map_entry}, flwr has {theirs.options.map_entry}"
    yield from compare_named(where, mine.nested_type, theirs.nested_type, compare_message, "nested message")
    yield from compare_named(where, mine.enum_type, theirs.enum_type, compare_enum, "nested enum")


def compare_enum(where: str, mine, theirs):
    a = [(v.name, v.number) for v in mine.value]
    b = [(v.name, v.number) for v in theirs.value]
    if a != b:
        yield f"{where}: values {a}, flwr has {b}"


def compare_service(where: str, mine, theirs):
    def methods(s):
        return {
            m.name: (m.input_type, m.output_type, m.client_streaming, m.server_streaming) for m in s.method
        }

    a, b = methods(mine), methods(theirs)
    for name in sorted(a.keys() | b.keys()):
        if a.get(name) != b.get(name):
            yield f"{where}.{name}: (input, output, streaming in, out) {a.get(name)}, flwr has {b.get(name)}"


def compare_named(where, mine, theirs, compare, kind):
    """Compares each of ours with flwr's of the same name; flwr may have more (ours omit them)."""
    their_by_name = {t.name: t for t in theirs}
    for m in mine:
        name = f"{where}.{m.name}" if where else m.name
        if m.name not in their_by_name:
            yield f"{name}: {kind} not defined by flwr {FLWR_VERSION}"
        else:
            yield from compare(name, m, their_by_name[m.name])


def test_the_installed_flwr_is_the_one_the_files_describe():
    assert importlib.metadata.version("flwr") == FLWR_VERSION


def test_every_file_names_its_flwr_version():
    for path in PROTO_ROOT.glob("flwr/proto/*.proto"):
        header = f"Matches flwr {FLWR_VERSION} (checked by python/tests/test_flower_proto.py)"
        assert header in path.read_text(), f"{path.name}: header line {header!r} is missing"


def test_messages_enums_and_services_match_flwr():
    problems = []
    defined = []
    for fd in ours().file:
        if not fd.name.startswith("flwr/proto/"):
            continue  # google/protobuf imports, if any
        theirs = flwr_file(fd.name)
        for attr in ("package", "syntax"):
            if getattr(fd, attr) != getattr(theirs, attr):
                mine, flwr = getattr(fd, attr), getattr(theirs, attr)
                problems.append(f"{fd.name}: {attr} {mine!r}, flwr has {flwr!r}")
        # Each top-level type must live in the file flwr defines it in: compare_named reports
        # a type that flwr's file of the same name lacks.
        problems += compare_named("", fd.message_type, theirs.message_type, compare_message, "message")
        problems += compare_named("", fd.enum_type, theirs.enum_type, compare_enum, "enum")
        problems += compare_named("", fd.service, theirs.service, compare_service, "service")
        defined += [m.name for m in fd.message_type]
    assert not problems, "fedfuse's .proto files differ from flwr {}:\n  {}".format(
        FLWR_VERSION, "\n  ".join(problems)
    )
    # The messages a node needs for the Fleet API are all there.
    for needed in (
        "RegisterNodeFleetRequest",
        "ActivateNodeRequest",
        "DeactivateNodeRequest",
        "UnregisterNodeFleetRequest",
        "SendNodeHeartbeatRequest",
        "PullMessagesRequest",
        "PushMessagesRequest",
        "PullObjectRequest",
        "PushObjectRequest",
        "ConfirmMessageReceivedRequest",
        "GetRunRequest",
        "GetFabRequest",
        "Message",
        "RecordDict",
    ):
        assert needed in defined, f"{needed} is not defined"

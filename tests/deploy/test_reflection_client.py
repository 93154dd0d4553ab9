"""A client with no heraldps code, only server reflection: what ``grpcurl`` does.

``grpcurl -plaintext ADDR list``, ``describe`` and a call with a JSON body
(bytes fields in base64) are repeated here with grpcio-reflection's
descriptor database, so the grpcurl commands of docs/clients.md are checked in CI
without grpcurl installed.
"""

from __future__ import annotations

import base64
import json

import grpc
import numpy as np
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import FieldDescriptor
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from heraldps.optim import SGD
from tests.conftest import ClusterFactory

SERVICE = "heraldps.v1.ParameterServer"


def _call_json(
    channel: grpc.Channel, pool: descriptor_pool.DescriptorPool, method: str, body: str
) -> str:
    """``grpcurl -d BODY ADDR SERVICE/METHOD``: JSON in, JSON out, types from reflection."""
    service = pool.FindServiceByName(SERVICE)
    rpc = service.methods_by_name[method]
    request_class = message_factory.GetMessageClass(rpc.input_type)
    response_class = message_factory.GetMessageClass(rpc.output_type)
    call = channel.unary_unary(
        f"/{SERVICE}/{method}",
        request_serializer=request_class.SerializeToString,
        response_deserializer=response_class.FromString,
    )
    response = call(json_format.Parse(body, request_class()), timeout=10)
    return json_format.MessageToJson(response)


def test_list_describe_and_call_through_reflection_only(cluster: ClusterFactory) -> None:
    servers, ps = cluster(1)
    ps.create_table("emb", dim=4, optimizer=SGD(lr=0.5))
    keys = np.array([3, -1, 1 << 40], dtype="<i8")
    with grpc.insecure_channel(f"127.0.0.1:{servers[0].port}") as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        # grpcurl -plaintext localhost:7001 list
        assert set(database.get_services()) == {
            SERVICE,
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
        }
        # grpcurl -plaintext localhost:7001 describe heraldps.v1.ParameterServer
        pool = descriptor_pool.DescriptorPool(database)
        methods = set(pool.FindServiceByName(SERVICE).methods_by_name)
        assert {"CreateTable", "Pull", "PushGradients", "Commit", "GetShardInfo"} <= methods
        # grpcurl -plaintext localhost:7001 describe heraldps.v1.PullRequest
        pull_request = pool.FindMessageTypeByName("heraldps.v1.PullRequest")
        fields = {f.name: f.type for f in pull_request.fields}
        assert fields == {
            "table": FieldDescriptor.TYPE_STRING,
            "keys": FieldDescriptor.TYPE_BYTES,  # packed little-endian int64
            "with_state": FieldDescriptor.TYPE_BOOL,
        }

        # grpcurl -plaintext -d '{}' localhost:7001 heraldps.v1.ParameterServer/GetShardInfo
        info = json.loads(_call_json(channel, pool, "GetShardInfo", "{}"))
        assert info["numShards"] == 1 and info["tables"][0]["spec"]["name"] == "emb"
        assert info["tables"][0]["spec"]["optimizer"] == {"sgd": {"lr": 0.5}}

        # Bytes travel as base64 in JSON: keys in, float32 values out.
        packed = base64.b64encode(keys.tobytes()).decode()
        body = json.dumps({"table": "emb", "keys": packed})
        pulled = json.loads(_call_json(channel, pool, "Pull", body))
        values = np.frombuffer(base64.b64decode(pulled["values"]), dtype="<f4").reshape(3, 4)
        assert pulled["dim"] == 4
        assert np.array_equal(values, ps.pull("emb", keys)[0])

        grads = base64.b64encode(np.ones((3, 4), "<f4").tobytes()).decode()
        body = json.dumps({"table": "emb", "iteration": "0", "keys": packed, "grads": grads})
        assert json.loads(_call_json(channel, pool, "PushGradients", body)) == {"rows": "3"}
        committed = json.loads(_call_json(channel, pool, "Commit", '{"iteration": "0"}'))
        assert committed == {"rowsUpdated": "3"}  # committed_iteration 0 is proto3's default
    after, versions = ps.pull("emb", keys)
    assert np.array_equal(after, values - np.float32(0.5))
    assert versions.tolist() == [1, 1, 1]

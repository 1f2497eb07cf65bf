#!/usr/bin/env python3
"""Writes the seed requests of the `request` (protobuf) and `json` (POST /json body) fuzz
targets from one list, so both start from the same requests against
floodgate::fuzzing::REQUEST_LIMITS. Run from anywhere; rewrites request/ and json/ seeds."""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ left in bench/
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
from grpc_body import varint  # noqa: E402 (the bench's protobuf varint)

# (name, request in protobuf's JSON mapping)
REQUESTS = [
    ("ip", {"domain": "edge", "descriptors": [{"entries": [{"key": "remote_address", "value": "10.0.0.1"}]}]}),
    ("partner-replaces", {"domain": "edge", "descriptors": [
        {"entries": [{"key": "remote_address", "value": "192.0.2.10"}]},
        {"entries": [{"key": "remote_address", "value": "10.0.0.2"}]}]}),
    ("unlimited", {"domain": "edge", "descriptors": [{"entries": [{"key": "path", "value": "/healthz"}]}]}),
    ("shared-wildcard", {"domain": "edge", "hits_addend": 2, "descriptors": [
        {"entries": [{"key": "path", "value": "/api/v1/files/a.txt"}]},
        {"entries": [{"key": "path", "value": "/api/v2/files/b"}]}]}),
    ("nested-detailed", {"domain": "edge", "descriptors": [
        {"entries": [{"key": "path", "value": "/api/users"}, {"key": "method", "value": "POST"}], "hits_addend": "3"}]}),
    ("shadow", {"domain": "edge", "descriptors": [{"entries": [{"key": "user", "value": "alice"}], "hits_addend": 5}]}),
    ("quota", {"domain": "edge", "descriptors": [
        {"entries": [{"key": "tenant", "value": "t-1"}], "hits_addend": 3},
        {"entries": [{"key": "tenant", "value": "t-2"}]}]}),
    ("overdraft-negative", {"domain": "edge", "descriptors": [
        {"entries": [{"key": "tokens", "value": "k"}], "hits_addend": 25},
        {"entries": [{"key": "tokens", "value": "k"}], "hits_addend": 7, "is_negative_hits": True}]}),
    ("override", {"domain": "edge", "descriptors": [
        {"entries": [{"key": "remote_address", "value": "10.0.0.3"}], "limit": {"requests_per_unit": 1, "unit": "MINUTE"}}]}),
    ("check-only", {"domain": "edge", "descriptors": [{"entries": [{"key": "remote_address", "value": "10.0.0.1"}], "hits_addend": 0}]}),
    ("unknown-domain", {"domain": "other", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}),
]

UNITS = {"UNKNOWN": 0, "SECOND": 1, "MINUTE": 2, "HOUR": 3, "DAY": 4, "MONTH": 5, "YEAR": 6, "WEEK": 7}


def field(number, wire, payload):
    tag = varint(number << 3 | wire)
    if wire == 0:
        return tag + varint(payload)
    return tag + varint(len(payload)) + payload


def descriptor(d):
    out = b""
    for e in d.get("entries", []):
        out += field(1, 2, field(1, 2, e["key"].encode()) + field(2, 2, e.get("value", "").encode()))
    if "limit" in d:
        limit = d["limit"]
        out += field(2, 2, field(1, 0, limit["requests_per_unit"]) + field(2, 0, UNITS[limit["unit"]]))
    if "hits_addend" in d:
        # google.protobuf.UInt64Value: present even when 0 (a check).
        value = int(d["hits_addend"])
        out += field(3, 2, field(1, 0, value) if value else b"")
    if d.get("is_negative_hits"):
        out += field(4, 0, 1)
    return out


def request(r):
    out = field(1, 2, r["domain"].encode())
    for d in r.get("descriptors", []):
        out += field(2, 2, descriptor(d))
    if r.get("hits_addend"):
        out += field(3, 0, r["hits_addend"])
    return out


for name, r in REQUESTS:
    with open(os.path.join(HERE, "request", name + ".bin"), "wb") as f:
        f.write(request(r))
    with open(os.path.join(HERE, "json", name + ".json"), "w") as f:
        json.dump(r, f)

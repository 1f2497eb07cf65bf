#!/usr/bin/env python3
"""Writes one gRPC-framed RateLimitRequest for h2load's --data.

usage: grpc_body.py DOMAIN DESCRIPTORS OUT [VALUE]
Each descriptor i is the single entry (k<i>, VALUE), VALUE "v" by default. Encodes protobuf by hand (field numbers from
proto/envoy/service/ratelimit/v3/rls.proto) so the bench needs no protobuf package.
"""
import struct
import sys


def varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(number, payload):
    # wire type 2: length-delimited
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def main():
    domain, count, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    value = sys.argv[4].encode() if len(sys.argv) > 4 else b"v"
    message = field(1, domain.encode())
    for i in range(count):
        entry = field(1, f"k{i}".encode()) + field(2, value)
        message += field(2, field(1, entry))  # RateLimitRequest.descriptors[].entries[]
    with open(out, "wb") as f:
        f.write(struct.pack(">BI", 0, len(message)) + message)


if __name__ == "__main__":
    main()

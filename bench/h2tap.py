#!/usr/bin/env python3
"""An HTTP/2 frame-counting TCP relay: what each side of a connection sends, frame by frame.

usage: h2tap.py UPSTREAM_HOST:PORT PORT_FILE REPORT_JSON

Listens on a free loopback port (written to PORT_FILE once it listens), connects each accepted
connection to UPSTREAM and copies the bytes both ways unchanged. Each direction's bytes are
parsed as HTTP/2 frames (after the 24-byte client preface on the way up): frames and bytes
(9-byte header included) by type, WINDOW_UPDATEs on the connection and on streams and their
increments, PINGs and their ACKs, the SETTINGS each side sent (decoded), and the sizes and
HPACK make-up of the answers' HEADERS frames (response headers, and trailers: a HEADERS frame
with END_STREAM from the server). On SIGTERM or SIGINT it writes REPORT_JSON and prints a
summary. An answer is one trailers frame from the server (gRPC's grpc-status).

"up" is the client to the server (Envoy to the rate-limit server), "down" the way back.
"chunks" counts the reads that returned data on each side: an upper bound on the sender's
writes that reached the relay separately (a busy relay reads several writes at once).
Python 3 standard library only.
"""
import asyncio
import collections
import json
import signal
import socket
import sys

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
TYPES = {0: "DATA", 1: "HEADERS", 2: "PRIORITY", 3: "RST_STREAM", 4: "SETTINGS",
         5: "PUSH_PROMISE", 6: "PING", 7: "GOAWAY", 8: "WINDOW_UPDATE", 9: "CONTINUATION"}
SETTINGS = {1: "HEADER_TABLE_SIZE", 2: "ENABLE_PUSH", 3: "MAX_CONCURRENT_STREAMS",
            4: "INITIAL_WINDOW_SIZE", 5: "MAX_FRAME_SIZE", 6: "MAX_HEADER_LIST_SIZE",
            8: "ENABLE_CONNECT_PROTOCOL", 9: "NO_RFC7540_PRIORITIES"}
# HPACK's static table (RFC 7541, appendix A): name, and the value where it has one.
STATIC = [None, ":authority", ":method GET", ":method POST", ":path /", ":path /index.html",
          ":scheme http", ":scheme https", ":status 200", ":status 204", ":status 206",
          ":status 304", ":status 400", ":status 404", ":status 500", "accept-charset",
          "accept-encoding gzip, deflate", "accept-language", "accept-ranges", "accept",
          "access-control-allow-origin", "age", "allow", "authorization", "cache-control",
          "content-disposition", "content-encoding", "content-language", "content-length",
          "content-location", "content-range", "content-type", "cookie", "date", "etag",
          "expect", "expires", "from", "host", "if-match", "if-modified-since",
          "if-none-match", "if-range", "if-unmodified-since", "last-modified", "link",
          "location", "max-forwards", "proxy-authenticate", "proxy-authorization", "range",
          "referer", "refresh", "retry-after", "server", "set-cookie",
          "strict-transport-security", "transfer-encoding", "user-agent", "vary", "via",
          "www-authenticate"]


def hpack_int(block, i, prefix):
    """An HPACK integer with a PREFIX-bit prefix at block[i]: (value, next index)."""
    mask = (1 << prefix) - 1
    value = block[i] & mask
    i += 1
    if value < mask:
        return value, i
    shift = 0
    while True:
        byte = block[i]
        i += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def hpack_string(block, i):
    """An HPACK string at block[i]: (text or None when Huffman-coded, length, next index)."""
    huffman = block[i] & 0x80
    length, i = hpack_int(block, i, 7)
    raw = block[i:i + length]
    return (None if huffman else raw.decode("latin-1")), length, i + length


def hpack_shape(block):
    """The representations in a header block, one word each: `idx:NAME` (an indexed field:
    one to a few bytes), `lit+idx:NAME=LEN` (a literal the decoder adds to its table),
    `lit:NAME=LEN` (a literal not indexed), `size:N` (a table size update). NAME is the static
    table's name (and value), `dyn` for the dynamic table, or the literal name."""
    out, i = [], 0
    try:
        while i < len(block):
            byte = block[i]
            if byte & 0x80:
                index, i = hpack_int(block, i, 7)
                out.append(f"idx:{STATIC[index] if index < len(STATIC) else 'dyn'}")
                continue
            if byte & 0xE0 == 0x20:
                size, i = hpack_int(block, i, 5)
                out.append(f"size:{size}")
                continue
            kind, prefix = ("lit+idx", 6) if byte & 0x40 else ("lit", 4)
            index, i = hpack_int(block, i, prefix)
            if index:
                name = STATIC[index].split(" ")[0] if index < len(STATIC) else "dyn"
            else:
                name, length, i = hpack_string(block, i)
                name = name if name is not None else f"huffman({length})"
            _, length, i = hpack_string(block, i)
            out.append(f"{kind}:{name}={length}")
    except (IndexError, ValueError):
        out.append("?")
    return " ".join(out)


class Direction:
    """One direction's figures, over every connection."""

    def __init__(self):
        self.frames = collections.Counter()
        self.bytes = collections.Counter()
        self.chunks = 0
        self.raw_bytes = 0
        self.window_updates = collections.Counter()  # "connection" / "stream": frames
        self.window_increments = collections.Counter()
        self.pings = collections.Counter()  # "ping" / "ack"
        self.settings = []  # each non-ACK SETTINGS frame, decoded
        self.ends = 0  # frames with END_STREAM
        self.response_headers = []  # per connection: [sizes]
        self.trailers = []
        self.shapes = collections.Counter()  # (kind, hpack shape): frames
        self.first_shapes = []

    def report(self):
        def sizes(per_connection):
            firsts = [s[0] for s in per_connection if s]
            rest = [x for s in per_connection for x in s[1:]]
            steady = collections.Counter(rest).most_common(1)
            return {"count": sum(len(s) for s in per_connection), "first": firsts,
                    "steady": steady[0][0] if steady else None,
                    "mean_after_first": sum(rest) / len(rest) if rest else None}
        return {"frames": dict(self.frames), "bytes": dict(self.bytes), "chunks": self.chunks,
                "raw_bytes": self.raw_bytes, "window_updates": dict(self.window_updates),
                "window_increments": dict(self.window_increments), "pings": dict(self.pings),
                "settings": self.settings, "end_stream_frames": self.ends,
                "headers": sizes(self.response_headers),
                "trailers": sizes(self.trailers),
                "hpack_first": self.first_shapes,
                "hpack_common": [[k, s, n] for (k, s), n in self.shapes.most_common(6)]}


UP, DOWN = Direction(), Direction()


class Parser:
    """Frames out of one direction of one connection's bytes."""

    def __init__(self, figures, preface):
        self.figures = figures
        self.buffer = bytearray()
        self.preface = len(PREFACE) if preface else 0
        self.headers, self.trailers = [], []
        figures.response_headers.append(self.headers)
        figures.trailers.append(self.trailers)
        self.block = None  # (kind, bytes) of a header block awaiting CONTINUATION

    def feed(self, data):
        f = self.figures
        f.chunks += 1
        f.raw_bytes += len(data)
        self.buffer += data
        if self.preface:
            taken = min(self.preface, len(self.buffer))
            del self.buffer[:taken]
            self.preface -= taken
        while len(self.buffer) >= 9:
            length = int.from_bytes(self.buffer[0:3], "big")
            if len(self.buffer) < 9 + length:
                return
            kind, flags = self.buffer[3], self.buffer[4]
            stream = int.from_bytes(self.buffer[5:9], "big") & 0x7FFFFFFF
            payload = bytes(self.buffer[9:9 + length])
            del self.buffer[:9 + length]
            self.frame(TYPES.get(kind, f"type{kind}"), flags, stream, payload)

    def frame(self, name, flags, stream, payload):
        f = self.figures
        f.frames[name] += 1
        f.bytes[name] += 9 + len(payload)
        if flags & 0x1 and name in ("DATA", "HEADERS"):
            f.ends += 1
        if name == "SETTINGS" and not flags & 0x1:
            f.settings.append({SETTINGS.get(int.from_bytes(payload[i:i + 2], "big"),
                                            str(int.from_bytes(payload[i:i + 2], "big"))):
                               int.from_bytes(payload[i + 2:i + 6], "big")
                               for i in range(0, len(payload) - 5, 6)})
        elif name == "WINDOW_UPDATE":
            where = "connection" if stream == 0 else "stream"
            f.window_updates[where] += 1
            f.window_increments[where] += int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
        elif name == "PING":
            f.pings["ack" if flags & 0x1 else "ping"] += 1
        elif name == "HEADERS":
            kind = "trailers" if flags & 0x1 else "headers"
            (self.trailers if flags & 0x1 else self.headers).append(9 + len(payload))
            block = payload
            if flags & 0x8:  # PADDED
                block = block[1:len(block) - block[0]]
            if flags & 0x20:  # PRIORITY
                block = block[5:]
            if flags & 0x4:  # END_HEADERS
                self.shape(kind, block)
            else:
                self.block = (kind, block)
        elif name == "CONTINUATION" and self.block:
            kind, block = self.block
            self.block = (kind, block + payload)
            if flags & 0x4:
                self.shape(*self.block)
                self.block = None

    def shape(self, kind, block):
        shape = hpack_shape(block)
        f = self.figures
        if len([s for s in f.first_shapes if s[0] == kind]) < 2:
            f.first_shapes.append([kind, shape])
        f.shapes[(kind, shape)] += 1


async def pump(reader, writer, parser):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            parser.feed(data)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def relay(client_reader, client_writer, host, port):
    sock = client_writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        up_reader, up_writer = await asyncio.open_connection(host, port)
    except OSError:
        client_writer.close()
        return
    up_writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    await asyncio.gather(pump(client_reader, up_writer, Parser(UP, True)),
                         pump(up_reader, client_writer, Parser(DOWN, False)))


def summary(report):
    answers = report["answers"]
    lines = [f"connections {report['connections']}, answers (trailers from the server) {answers}"]
    for name in ("up", "down"):
        d = report[name]
        per = (lambda n: f"{n / answers:.3f}") if answers else (lambda n: str(n))
        lines.append(f"{name}: frames per answer " + ", ".join(
            f"{k} {per(v)}" for k, v in sorted(d["frames"].items())))
        lines.append(f"{name}: bytes per answer " + ", ".join(
            f"{k} {per(v)}" for k, v in sorted(d["bytes"].items())) +
            f"; all {per(d['raw_bytes'])}; reads {per(d['chunks'])}")
        lines.append(f"{name}: WINDOW_UPDATE {d['window_updates']} increments "
                     f"{d['window_increments']}; PING {d['pings']}")
        lines.append(f"{name}: SETTINGS {d['settings']}")
        for kind in ("headers", "trailers"):
            if d[kind]["count"]:
                lines.append(f"{name}: {kind} frame bytes: first {d[kind]['first']}, "
                             f"steady {d[kind]['steady']}, mean after first "
                             f"{d[kind]['mean_after_first']}")
        for kind, shape in d["hpack_first"]:
            lines.append(f"{name}: first {kind} HPACK: {shape}")
        for kind, shape, n in d["hpack_common"][:4]:
            lines.append(f"{name}: {n} × {kind} HPACK: {shape}")
    return "\n".join(lines)


async def main():
    upstream, port_file, report_file = sys.argv[1:4]
    host, port = upstream.rsplit(":", 1)
    connections = 0

    async def accepted(reader, writer):
        nonlocal connections
        connections += 1
        await relay(reader, writer, host, int(port))

    server = await asyncio.start_server(accepted, "127.0.0.1", 0)
    with open(port_file, "w") as out:
        out.write(f"{server.sockets[0].getsockname()[1]}\n")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    up, down = UP.report(), DOWN.report()
    # An answer is the server's trailers (HEADERS with END_STREAM).
    report = {"connections": connections, "answers": down["trailers"]["count"],
              "up": up, "down": down}
    with open(report_file, "w") as out:
        json.dump(report, out, indent=1)
    print(summary(report))


if __name__ == "__main__":
    asyncio.run(main())

#!/usr/bin/env python3
"""A Redis of a small, known capacity for the overload bench: a proxy in front of a real
redis-server that runs at most CAPACITY commands per second, in arrival order.

    python3 bench/capped_redis.py --port 7001 --upstream-port 6379 --capacity 1000

Why: on a small machine a real Redis saturates only after the host running floodgate and
the load generator does, so "1.5, 3 and 10 times the store's capacity" cannot be offered to
it. This stand-in makes the capacity small and known while the host stays idle.

How it behaves: every command of every client connection (RESP arrays, or inline commands)
joins one FIFO, as commands join a Redis's single thread. The FIFO is a server of
CAPACITY commands per second: a command is done `1 / CAPACITY` after it reached the head,
and only then is it forwarded to the real Redis, whose reply goes straight back. So past
capacity the queue grows and every command's latency grows with it, as a saturated Redis's
does; a command whose client gave up (its deadline passed) still takes its turn, as Redis
runs a command nobody waits for. Each client connection has its own connection to the real
Redis, so replies keep their order. Standard library only.

`--per-request`: an `EVALSHA` of lua/apply.lua that carries several requests (the calls a
connection had ready together, merged: docs/redis.md) takes one turn per request, so the
capacity is CAPACITY requests a second whatever the merging. Without it the capacity is in
commands, and merging lifts the requests a second it serves (up to 64 per command).
"""

import argparse
import asyncio
import collections
import signal
import sys


class Framer:
    """Splits a client's byte stream into whole RESP commands."""

    def __init__(self):
        self.buffer = bytearray()

    def feed(self, data):
        """Adds `data`; returns the whole commands it completed (bytes each)."""
        self.buffer += data
        commands = []
        while True:
            end = self._command_end()
            if end is None:
                break
            commands.append(bytes(self.buffer[:end]))
            del self.buffer[:end]
        return commands

    def _line(self, start):
        """The end of the line starting at `start` (after its CRLF), or None if incomplete."""
        crlf = self.buffer.find(b"\r\n", start)
        return None if crlf < 0 else crlf + 2

    def _command_end(self):
        buf = self.buffer
        if not buf:
            return None
        if buf[0:1] != b"*":
            # An inline command (redis-cli's PING, a telnet user): one line.
            return self._line(0)
        end = self._line(0)
        if end is None:
            return None
        count = int(buf[1:end - 2])
        for _ in range(max(count, 0)):
            if end >= len(buf):
                return None
            if buf[end:end + 1] != b"$":
                raise ValueError(f"expected a bulk string in a command, got {bytes(buf[end:end + 16])!r}")
            header_end = self._line(end)
            if header_end is None:
                return None
            length = int(buf[end + 1:header_end - 2])
            end = header_end + max(length, 0) + 2
            if end > len(buf):
                return None
        return end


def requests_in(command):
    """How many requests a command carries: an `EVALSHA`'s ARGV after `now` (one blob per
    request merged, lua/apply.lua's batch convention), else 1."""
    parts = []
    at = command.find(b"\r\n") + 2
    # The command name, the SHA and the key count are the first three bulk strings.
    for _ in range(3):
        header_end = command.find(b"\r\n", at)
        if command[at:at + 1] != b"$" or header_end < 0:
            return 1
        length = int(command[at + 1:header_end])
        parts.append(command[header_end + 2:header_end + 2 + length])
        at = header_end + 2 + length + 2
    if len(parts) < 3 or parts[0].upper() != b"EVALSHA":
        return 1
    try:
        count, keys = int(command[1:command.find(b"\r\n")]), int(parts[2])
    except ValueError:
        return 1
    return max(count - 3 - keys - 1, 1)


class Capped:
    """The FIFO of commands, released at `capacity` per second (per request merged, with
    `per_request`)."""

    def __init__(self, capacity, upstream, per_request=False):
        self.per_request = per_request
        self.service = 1.0 / capacity
        self.upstream = upstream
        # (writer to the real Redis, command bytes), oldest first.
        self.queue = collections.deque()
        self.ready = asyncio.Event()
        # When the command being served now is done (loop time).
        self.busy_until = 0.0
        self.forwarded = 0

    def push(self, writer, command):
        turns = requests_in(command) if self.per_request else 1
        self.queue.append((writer, command, turns))
        self.ready.set()

    async def release(self):
        """Forwards each command once its turn of `1 / capacity` is over."""
        loop = asyncio.get_running_loop()
        while True:
            if not self.queue:
                self.ready.clear()
                await self.ready.wait()
                # An idle server starts on the newcomer now, not on its past idle time.
                self.busy_until = max(self.busy_until, loop.time())
            now = loop.time()
            # Every command whose turn ended by now goes out in this round (timers fire on
            # whole milliseconds; the schedule, not the wake-ups, sets the pace).
            while self.queue and self.busy_until + self.service * self.queue[0][2] <= now:
                writer, command, turns = self.queue.popleft()
                self.busy_until += self.service * turns
                if not writer.is_closing():
                    writer.write(command)
                self.forwarded += 1
            if self.queue:
                turns = self.queue[0][2]
                await asyncio.sleep(max(self.busy_until + self.service * turns - now, 0.0))

    async def client(self, reader, writer):
        """One client connection: its own connection to the real Redis, its commands into
        the FIFO, the replies straight back."""
        host, port = self.upstream
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError as e:
            print(f"capped_redis: cannot reach the real Redis at {host}:{port}: {e}", file=sys.stderr)
            writer.close()
            return

        async def replies():
            try:
                while data := await up_reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()

        back = asyncio.create_task(replies())
        framer = Framer()
        try:
            while data := await reader.read(65536):
                try:
                    commands = framer.feed(data)
                except ValueError as e:
                    print(f"capped_redis: closing a client that sent bad RESP: {e}", file=sys.stderr)
                    break
                for command in commands:
                    self.push(up_writer, command)
        except (ConnectionError, OSError):
            pass
        finally:
            # Its commands still queued take their turn all the same (Redis runs what it
            # read), with nowhere to go.
            back.cancel()
            up_writer.close()
            writer.close()


async def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="loopback port to listen on")
    parser.add_argument("--upstream-port", type=int, required=True, help="the real redis-server's port")
    parser.add_argument("--upstream-host", default="127.0.0.1")
    parser.add_argument("--capacity", type=float, required=True, help="commands per second")
    parser.add_argument("--per-request", action="store_true",
                        help="an EVALSHA of several merged requests takes one turn per request")
    args = parser.parse_args()
    if args.capacity <= 0:
        parser.error(f"--capacity must be positive, got {args.capacity}")
    capped = Capped(args.capacity, (args.upstream_host, args.upstream_port), args.per_request)
    server = await asyncio.start_server(capped.client, "127.0.0.1", args.port)
    releaser = asyncio.create_task(capped.release())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
    releaser.cancel()
    print(f"capped_redis: {capped.forwarded} commands forwarded", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())

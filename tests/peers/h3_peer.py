#!/usr/bin/env python3
"""An HTTP/3 client of another stack (aioquic) for tests/http3.rs: the
gateway's QUIC and HTTP/3 against an implementation that is not quinn.

    h3_peer.py HOST:PORT AUTHORITY PATH [METHOD [BODY_BYTES]]

One request (certificates not verified: a local gateway); prints one JSON
line: {"status": N, "headers": {...}, "body_len": N, "sha256": "..."}.
"""
import asyncio
import hashlib
import json
import ssl
import sys

from aioquic.asyncio import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.done = asyncio.get_event_loop().create_future()
        self.status = None
        self.headers = {}
        self.body = b""

    def quic_event_received(self, event):
        for e in self.h3.handle_event(event):
            if isinstance(e, HeadersReceived):
                for name, value in e.headers:
                    name, value = name.decode(), value.decode()
                    if name == ":status":
                        self.status = int(value)
                    else:
                        self.headers[name] = value
                if e.stream_ended and not self.done.done():
                    self.done.set_result(True)
            elif isinstance(e, DataReceived):
                self.body += e.data
                if e.stream_ended and not self.done.done():
                    self.done.set_result(True)

    async def request(self, authority, path, method, body):
        stream = self._quic.get_next_available_stream_id()
        headers = [(b":method", method.encode()), (b":scheme", b"https"),
                   (b":authority", authority.encode()), (b":path", path.encode())]
        if body:
            headers.append((b"content-length", str(len(body)).encode()))
        self.h3.send_headers(stream, headers, end_stream=not body)
        if body:
            self.h3.send_data(stream, body, end_stream=True)
        self.transmit()
        await asyncio.wait_for(self.done, 10)


async def main():
    target, authority, path = sys.argv[1], sys.argv[2], sys.argv[3]
    method = sys.argv[4] if len(sys.argv) > 4 else "GET"
    size = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    body = bytes(i * 7 % 251 for i in range(size))
    host, port = target.rsplit(":", 1)
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name=authority)
    config.verify_mode = ssl.CERT_NONE
    async with connect(host, int(port), configuration=config, create_protocol=Client) as client:
        await client.request(authority, path, method, body)
        print(json.dumps({"status": client.status, "headers": client.headers,
                          "body_len": len(client.body),
                          "sha256": hashlib.sha256(body).hexdigest()}))


asyncio.run(main())

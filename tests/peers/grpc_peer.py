#!/usr/bin/env python3
"""A real gRPC server and client (grpcio) for tests/grpc.rs.

Messages are raw bytes (no protobuf): the methods of `test.Echo` are
registered with a generic handler, and the client calls them by path.

    grpc_peer.py server PORT NAME [CERT KEY]
                                       serve until killed (over TLS with
                                       CERT and KEY, PEM files, if given);
                                       prints "ready"
    grpc_peer.py client TARGET CASE [AUTHORITY [CA]]
                                       one case against TARGET (host:port),
                                       as AUTHORITY (t.localhost), over TLS
                                       trusting CA (a PEM file) if given;
                                       prints one JSON line

The server's methods:
  Unary        echoes the request; initial metadata `shard: NAME`,
               trailing metadata `echo-trailer` = the request's
               `x-trailer` metadata
  Fail         ends with the status and message the request names
               ("CODE message", e.g. "5 not here")
  Slow         sleeps the request's number of milliseconds, then echoes
  ServerStream answers the request N times ("N")
  ClientStream joins every request it got
  Bidi         echoes each request as it comes (full duplex)
"""
import json
import sys
import time
from concurrent import futures

import grpc


def server(port, name, cert=None, key=None):
    def unary(request, context):
        context.send_initial_metadata((("shard", name),))
        sent = dict(context.invocation_metadata())
        if "x-trailer" in sent:
            context.set_trailing_metadata((("echo-trailer", sent["x-trailer"]),))
        return request

    def fail(request, context):
        code, _, message = request.decode().partition(" ")
        context.abort(grpc.StatusCode(_code(int(code))), message)

    def slow(request, context):
        time.sleep(int(request.decode()) / 1000)
        return request

    def server_stream(request, context):
        for i in range(int(request.decode())):
            yield str(i).encode()

    def client_stream(requests, context):
        return b",".join(requests)

    def bidi(requests, context):
        for r in requests:
            yield r

    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Fail": grpc.unary_unary_rpc_method_handler(fail),
        "Slow": grpc.unary_unary_rpc_method_handler(slow),
        "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
        "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
    }
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    srv.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", handlers),))
    if cert:
        pair = (_read(key), _read(cert))
        srv.add_secure_port(f"127.0.0.1:{port}", grpc.ssl_server_credentials((pair,)))
    else:
        srv.add_insecure_port(f"127.0.0.1:{port}")
    srv.start()
    print("ready", flush=True)
    srv.wait_for_termination()


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _code(value):
    for code in grpc.StatusCode:
        if code.value[0] == value:
            return code.value
    raise ValueError(value)


def client(target, case, authority="t.localhost", ca=None):
    # The tenant comes from the authority (the Host of HTTP/2); over TLS it
    # is also the name sent (SNI) and checked against the certificate.
    options = (("grpc.default_authority", authority),)
    if ca:
        options += (("grpc.ssl_target_name_override", authority),)
        credentials = grpc.ssl_channel_credentials(root_certificates=_read(ca))
        channel = grpc.secure_channel(target, credentials, options=options)
    else:
        channel = grpc.insecure_channel(target, options=options)
    path = lambda method: f"/test.Echo/{method}"
    out = {}
    try:
        if case == "unary":
            call = channel.unary_unary(path("Unary"))
            reply, info = call.with_call(b"hello", metadata=(("x-trailer", "t1"),), timeout=10)
            out["reply"] = reply.decode()
            out["initial"] = dict(info.initial_metadata())
            out["trailing"] = dict(info.trailing_metadata())
            out["code"] = info.code().name
        elif case.startswith("fail:"):
            channel.unary_unary(path("Fail"))(case[5:].encode(), timeout=10)
            out["code"] = "OK"
        elif case.startswith("slow:"):
            ms, _, deadline = case[5:].partition(":")
            reply = channel.unary_unary(path("Slow"))(ms.encode(), timeout=float(deadline))
            out["reply"] = reply.decode()
            out["code"] = "OK"
        elif case == "server-stream":
            replies = channel.unary_stream(path("ServerStream"))(b"5", timeout=10)
            out["replies"] = [r.decode() for r in replies]
            out["code"] = "OK"
        elif case == "client-stream":
            parts = iter([b"a", b"b", b"c"])
            out["reply"] = channel.stream_unary(path("ClientStream"))(parts, timeout=10).decode()
            out["code"] = "OK"
        elif case == "bidi":
            # Full duplex: each answer comes before the next request goes.
            import queue
            q = queue.Queue()
            q.put(b"m0")
            sent = [1]

            def requests():
                while True:
                    item = q.get()
                    if item is None:
                        return
                    yield item

            replies = []
            for r in channel.stream_stream(path("Bidi"))(requests(), timeout=10):
                replies.append(r.decode())
                if sent[0] < 3:
                    q.put(f"m{sent[0]}".encode())
                    sent[0] += 1
                else:
                    q.put(None)
            out["replies"] = replies
            out["code"] = "OK"
        elif case.startswith("many:"):
            n = int(case[5:])
            call = channel.unary_unary(path("Unary"))
            fs = [call.future(f"r{i}".encode(), timeout=20) for i in range(n)]
            out["ok"] = sum(1 for i, f in enumerate(fs) if f.result() == f"r{i}".encode())
            out["code"] = "OK"
        else:
            raise SystemExit(f"unknown case {case}")
    except grpc.RpcError as e:
        out["code"] = e.code().name
        out["details"] = e.details()
        out["trailing"] = dict(e.trailing_metadata() or ())
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(int(sys.argv[2]), *sys.argv[3:6])
    else:
        client(*sys.argv[2:6])

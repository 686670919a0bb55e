//! An HTTP/1 request on the fast transport, from its head to its answer:
//! the head checked and planned, a body that came whole with it taken
//! along, the exchange with the shard, and what becomes of the client's
//! connection after it (kept, closed, or a tunnel).

use super::body::H1Body;
use super::downstream::{Downstream, H1Client, H1Request};
use super::exchange::{ends_of, may_be_h2, Exchanged, Request};
use super::request::{head_in, Outgoing, RequestHead, UpstreamHead};
use super::{tunnel, FastPath, WHOLE_BODY_WITH_HEAD};
use crate::proxy::buffers;
use crate::proxy::client::linger;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::head::Head;
use crate::proxy::hooks::{RequestLine, RequestView, UpstreamEdit};
use crate::proxy::pipeline::answer::Refusal;
use crate::proxy::pipeline::fields::{accepts_trailers, Forwarding};
use crate::proxy::pipeline::message::{request_target, Target};
use bytes::{Bytes, BytesMut};
use http::Method;
use pingora::protocols::l4::socket::SocketAddr;
use pingora::protocols::Stream;

/// What the access log keeps of a request's head.
struct Logged<'h> {
    client: Option<&'h SocketAddr>,
    method: &'h str,
    target: &'h str,
    host: Option<&'h str>,
    http10: bool,
}

impl<'h> Logged<'h> {
    fn of(head: &RequestHead<'h>, client: Option<&'h SocketAddr>) -> Self {
        let host = head.values("host").next();
        Logged {
            client,
            method: head.method,
            target: head.target,
            host: host.and_then(crate::wire::text::text),
            http10: head.http10,
        }
    }

    fn line(&self) -> RequestLine<'_> {
        RequestLine {
            client: self.client,
            method: self.method,
            target: &self.target,
            host: self.host,
            protocol: match self.http10 {
                true => "HTTP/1.0",
                false => "HTTP/1.1",
            },
        }
    }
}

impl FastPath {
    /// Serves the HTTP/1 request whose whole head is `head` (read under
    /// the head limits and the message rules by the front end, as `read`
    /// says: its parts and its body's framing; owned here, so that the
    /// connection's own state, which idle connections hold too, does not
    /// keep it across the request). `ahead` holds what the client sent past the
    /// head: the body's start, then the next request's, and it keeps
    /// what is read past this request. `closing`: the server is shutting
    /// down, so the connection closes after this request. The client
    /// connection, if it may carry another request.
    pub async fn serve(
        &self,
        mut client: Stream,
        head: BytesMut,
        read: Head,
        ahead: &mut BytesMut,
        closing: bool,
    ) -> Option<Stream> {
        let gw = &self.gateway;
        let mut ctx = RequestCtx {
            tls: client.get_ssl_digest().is_some(),
            ..RequestCtx::default()
        };
        let socket = client.get_socket_digest();
        let client_addr = socket.as_ref().and_then(|d| d.peer_addr().cloned());
        let ends = ends_of(socket.as_deref());
        let Some(parsed) = head_in(&head, &read.layout) else {
            self.refuse_unparsable(&mut client, &mut ctx, client_addr.as_ref())
                .await;
            return None;
        };
        let logged = Logged::of(&parsed, client_addr.as_ref());
        let mut h1_body = H1Body::new(read.body, self.body_limits);
        let outgoing = h1_body.outgoing(parsed.values("content-length").next().is_some());
        let whole =
            !h1_body.is_done() && ahead.len() <= WHOLE_BODY_WITH_HEAD && h1_body.completes(ahead);
        let mut request = client_side(&parsed, closing, whole, self.head_limit);
        let method = Method::from_bytes(parsed.method.as_bytes()).unwrap_or(Method::GET);
        let target = match (method == Method::CONNECT, request_target(parsed.target)) {
            (false, Some(target)) => target,
            (connect, _) => {
                let refusal = match connect {
                    true => Refusal::error(405, "method-not-allowed"),
                    false => Refusal::error(400, "invalid-target"),
                };
                let mut c = H1Client::new(&mut client, ahead, h1_body, request);
                let status = self.answer(&mut c, &mut ctx, refusal, true).await;
                (ctx.bytes_in, ctx.bytes_out) = c.counts();
                gw.finish(&mut ctx, &logged.line(), status);
                return None;
            }
        };
        let view =
            RequestView::from_raw(parsed.method, parsed.target, target.path(), &parsed.headers)
                .with_authority(target.authority);
        let mut planned = gw.plan(&view, client_addr.as_ref(), &mut ctx);
        if planned.is_ok() {
            h1_body.planned(gw.body_phase(&ctx), &ctx.upstream_edit, ctx.max_body);
        }
        let whole_body = match whole {
            true => take_whole_body(&mut h1_body, ahead, &mut request, &mut planned),
            false => None,
        };
        let mut c = H1Client::new(&mut client, ahead, h1_body, request);
        let exchanged = match planned {
            Err(refusal) => self.refused(&mut c, &mut ctx, refusal).await,
            Ok(host_seen) => {
                let fwd = self.forwarding(host_seen, ctx.tls, &ctx);
                let edit = &ctx.upstream_edit;
                let mut buf = upstream_bytes(&parsed, &target, outgoing, whole_body, &fwd, edit);
                let request = Request {
                    method: &method,
                    head_only: parsed.head_only(),
                    websocket: parsed.websocket,
                    te_trailers: may_be_h2(&ctx) && accepts_trailers(parsed.values("te")),
                    bytes: buffers::share(&mut buf),
                    ends,
                };
                let exchanged = self.exchange(&mut c, &request, &mut ctx).await;
                buffers::give_shared(buf, request.bytes);
                exchanged
            }
        };
        let after = After::of(exchanged, &c, &mut ctx);
        drop(c);
        let kept = self.conclude(client, ahead, after, &mut ctx, &logged).await;
        drop((logged, parsed)); // they borrow the head, kept for the next
        buffers::give(head);
        kept
    }

    /// The answer to a head that is no request (400), logged as `-`; the
    /// connection closes after it.
    async fn refuse_unparsable(
        &self,
        client: &mut Stream,
        ctx: &mut RequestCtx,
        client_addr: Option<&SocketAddr>,
    ) {
        let gw = &self.gateway;
        let refusal = gw.identified(Refusal::error(400, "bad-request"), ctx);
        ctx.bytes_out = refusal.body.len() as u64;
        let _ = self.send_all(client, &refusal.http1(false, true)).await;
        let line = RequestLine {
            client: client_addr,
            method: "-",
            target: &"-",
            host: None,
            protocol: "HTTP/1.1",
        };
        gw.log_request(ctx, &line, 400);
    }

    /// A planned request refused: answered. The client's connection goes
    /// on only if its body was read whole (it came with the head).
    async fn refused(
        &self,
        c: &mut H1Client<'_>,
        ctx: &mut RequestCtx,
        refusal: Refusal,
    ) -> Exchanged {
        let close = !c.body_done();
        match self.answered(c, ctx, refusal, close).await {
            (status, true) => Exchanged::Done(status),
            (status, false) => Exchanged::Closed(status),
        }
    }

    /// The request is over: logged, and the client's connection handed
    /// back for its next request, closed (after reading off a body still
    /// coming), or, upgraded, made a tunnel.
    async fn conclude(
        &self,
        mut client: Stream,
        ahead: &mut BytesMut,
        after: After,
        ctx: &mut RequestCtx,
        logged: &Logged<'_>,
    ) -> Option<Stream> {
        let gw = &self.gateway;
        let status = match after.exchanged {
            Exchanged::Done(status) if after.keep => {
                gw.finish(ctx, &logged.line(), status);
                return Some(client);
            }
            Exchanged::Done(status) | Exchanged::Closed(status) => {
                gw.finish(ctx, &logged.line(), status);
                if after.unread {
                    // The client may still be sending its body: read it
                    // off a while (its admission already released), so
                    // that closing does not reset the answer away.
                    linger(&mut client).await;
                }
                return None;
            }
            Exchanged::Upgraded(upstream) => {
                match self.open_tunnel(&mut client, ahead, upstream, ctx).await {
                    Some(upstream) => {
                        // A tunnel may stay open for hours: of the head,
                        // only the target is kept (for the log).
                        let log = tunnel::TunnelLog {
                            client: logged.client.cloned(),
                            target: logged.target.to_owned(),
                            host: logged.host.map(str::to_owned),
                            line: ("GET", "HTTP/1.1", 101),
                        };
                        // The tunnel logs the request when it ends.
                        self.spawn_tunnel(client, upstream, std::mem::take(ctx), log);
                        return None;
                    }
                    None => 101,
                }
            }
        };
        gw.finish(ctx, &logged.line(), status);
        None
    }
}

/// How an exchange left the client's connection.
struct After {
    exchanged: Exchanged,
    /// It may carry another request.
    keep: bool,
    /// The client's body was not read whole.
    unread: bool,
}

impl After {
    /// Also counts the bytes of the exchange into `ctx` (for the log).
    fn of(exchanged: Exchanged, c: &H1Client<'_>, ctx: &mut RequestCtx) -> After {
        (ctx.bytes_in, ctx.bytes_out) = c.counts();
        let unread = !c.body_done();
        After {
            exchanged,
            keep: !c.close && !unread,
            unread,
        }
    }
}

/// A body that came whole with its head goes with it (through the body
/// phase and the edit, once planned), and stays sendable again. Refused
/// (by its limits or the body phase), it is answered as any refusal; the
/// connection closes after it (what is left of the body is not read as a
/// request). A plan's refusal stands.
fn take_whole_body(
    body: &mut H1Body,
    ahead: &mut BytesMut,
    request: &mut H1Request,
    planned: &mut Result<&str, Refusal>,
) -> Option<Bytes> {
    match body.take(ahead) {
        Ok(bytes) => Some(bytes),
        Err(e) => {
            request.close = true;
            if planned.is_ok() {
                let refusal = e.answer();
                *planned = Err(refusal.unwrap_or_else(|| Refusal::error(400, "bad-request")));
            }
            None
        }
    }
}

/// How the client's side of the exchange is framed and kept.
fn client_side(head: &RequestHead<'_>, closing: bool, whole: bool, head_limit: usize) -> H1Request {
    H1Request {
        http10: head.http10,
        head_only: head.head_only(),
        close: head.close || closing,
        // RFC 9110 §10.1.1: an HTTP/1.0 client is never sent a 100.
        expect_continue: head.expect_continue && !whole && !head.http10,
        head_limit,
    }
}

/// The bytes that go to the shard first: the upstream head, and the body
/// when it came whole with its head.
fn upstream_bytes(
    head: &RequestHead<'_>,
    target: &Target<'_>,
    outgoing: Outgoing,
    whole_body: Option<Bytes>,
    forwarding: &Forwarding<'_>,
    edit: &UpstreamEdit,
) -> BytesMut {
    let mut bytes = UpstreamHead {
        method: head.method,
        origin: &target.origin,
        host: target.authority,
        fields: &head.headers,
        websocket: head.websocket,
        body: outgoing,
    }
    .write(forwarding, edit);
    if let Some(whole) = &whole_body {
        bytes.extend_from_slice(whole);
    }
    bytes
}

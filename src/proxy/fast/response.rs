//! The HTTP/1 response codec: a shard's response head parsed once (its
//! framing, its hop-by-hop fields), the head the client receives, and the
//! body copied with its framing tracked (`Content-Length`, chunked with
//! trailers, or until close).

use super::request::{header_is, push_field};
use super::upstream::Upstream;
use super::{Exchanged, FastPath};
use crate::proxy::ctx::RequestCtx;
use crate::proxy::hooks::ResponseEdit;
use crate::proxy::pipeline::answer::Refusal;
use crate::proxy::pipeline::fields::{is_hop_by_hop, tokens, unrequested_switch};
use crate::proxy::pipeline::framing::Framing;
use bytes::BytesMut;
use pingora::protocols::http::date::get_cached_date;
use pingora::protocols::Stream;
use std::net::SocketAddr;
use std::ops::Range;
use tokio::io::AsyncReadExt;

/// Response heads larger than this are refused (502).
pub(super) const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// As Pingora's limit on header fields.
const MAX_RESPONSE_HEADERS: usize = 256;
/// Response bodies are copied in reads of up to this much.
const BODY_READ: usize = 16 * 1024;

impl FastPath {
    /// The embedder's edit of a response head (none unless a hook made one).
    pub(super) fn response_edit(&self, status: u16, ctx: &RequestCtx) -> Option<ResponseEdit> {
        let shard = ctx.shard.as_ref()?;
        let mut edit = ResponseEdit::new(status);
        let tenant = ctx.tenant.as_deref().unwrap_or_default();
        self.gateway
            .control()
            .hooks
            .edit_response(tenant, shard.id(), &mut edit);
        (!edit.is_empty()).then_some(edit)
    }

    /// Writes the response head and streams the body; the upstream
    /// connection goes back to the pool when its framing allows.
    pub(super) async fn respond(
        &self,
        client: &mut Stream,
        ahead: &mut BytesMut,
        close: bool,
        upstream: Upstream,
        addr: SocketAddr,
        ctx: &RequestCtx,
    ) -> Exchanged {
        let Upstream {
            mut conn,
            mut buf,
            parsed,
        } = upstream;
        let status = parsed.status;
        let keeps = parsed.keeps_connection();
        // A body that ends when the shard closes goes to the client in
        // chunks (as nginx does): its end is then an end, and a shard that
        // fails mid-body leaves the client a body visibly cut short, not
        // one that looks complete.
        let rechunk = matches!(parsed.framing, Framing::UntilClose);
        let edit = self.response_edit(status, ctx);
        let mut out = response_head(&buf, &parsed, close, edit.as_ref());
        let mut framing = parsed.framing;
        let body = buf.split_off(parsed.head_len);
        // Body bytes that break the framing before anything was sent: the
        // client still gets an answer.
        let Ok(used) = framing.consume(&body) else {
            let refusal = Refusal::error(502, "upstream-invalid-response");
            let _ = self.send(client, &refusal.http1(false, true)).await;
            return Exchanged::Closed(502);
        };
        // Bytes beyond the response: the shard misbehaved; do not reuse it.
        let mut reusable = used == body.len() && keeps;
        push_body(&mut out, &body[..used], rechunk);
        if !self.send(client, &out).await {
            return Exchanged::Closed(status);
        }
        drop(out);
        buf = body;
        while !framing.is_done() {
            buf.clear();
            buf.reserve(BODY_READ);
            let read = tokio::select! {
                read = conn.read_buf(&mut buf) => read,
                () = self.client_gone(client, ahead) => return Exchanged::Closed(status),
            };
            match read {
                Ok(0) if rechunk => {
                    if !self.send(client, b"0\r\n\r\n").await {
                        return Exchanged::Closed(status);
                    }
                    reusable = false;
                    break;
                }
                // Cut short: the client's connection cannot frame anything
                // after this (and closing it before the body's end tells
                // the client so).
                Ok(0) | Err(_) => return Exchanged::Closed(status),
                Ok(_) => {}
            }
            let Ok(used) = framing.consume(&buf) else {
                return Exchanged::Closed(status);
            };
            reusable &= used == buf.len();
            let sent = match rechunk {
                true => {
                    let mut chunk = Vec::with_capacity(used + 12);
                    push_body(&mut chunk, &buf[..used], true);
                    self.send(client, &chunk).await
                }
                false => self.send(client, &buf[..used]).await,
            };
            if !sent {
                return Exchanged::Closed(status);
            }
        }
        if reusable {
            self.release(addr, conn);
        }
        Exchanged::Done(status, !close)
    }
}

/// Appends body bytes to `out`, as one chunk if `chunked` (none if empty:
/// an empty chunk is the last one).
fn push_body(out: &mut Vec<u8>, bytes: &[u8], chunked: bool) {
    if !chunked {
        out.extend_from_slice(bytes);
    } else if !bytes.is_empty() {
        out.extend_from_slice(format!("{:x}\r\n", bytes.len()).as_bytes());
        out.extend_from_slice(bytes);
        out.extend_from_slice(b"\r\n");
    }
}

/// The response head the client receives: the shard's status and fields,
/// minus hop-by-hop ones (the pipeline's table, as
/// `pipeline::fields::strip_response_hop_by_hop` on Pingora's path;
/// a 101 keeps `Connection` and `Upgrade`) and minus a `Content-Length`
/// that `Transfer-Encoding` overrides; plus a `Date` if it has none.
pub(super) fn response_head(
    buf: &[u8],
    parsed: &ParsedResponse,
    close: bool,
    edit: Option<&ResponseEdit>,
) -> Vec<u8> {
    let switching = parsed.status == 101;
    let mut out = Vec::with_capacity(parsed.head_len + 32);
    // httparse accepts only three-digit codes: 100..=999.
    let code = parsed.status;
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(&[
        b'0' + (code / 100) as u8,
        b'0' + (code / 10 % 10) as u8,
        b'0' + (code % 10) as u8,
        b' ',
    ]);
    out.extend_from_slice(&buf[parsed.reason.clone()]);
    out.extend_from_slice(b"\r\n");
    let mut dated = false;
    for (name, value) in &parsed.headers {
        let (name, value) = (&buf[name.clone()], &buf[value.clone()]);
        let text = std::str::from_utf8(name).unwrap_or_default();
        dated |= header_is(text, "date");
        let keep = if header_is(text, "transfer-encoding") {
            parsed.chunked
        } else if header_is(text, "content-length") {
            !parsed.transfer_encoding
        } else if switching && (header_is(text, "connection") || header_is(text, "upgrade")) {
            true
        } else {
            !is_hop_by_hop(text)
                && (switching || !parsed.named.iter().any(|n| n.eq_ignore_ascii_case(name)))
        };
        if keep && !edit.is_some_and(|e| e.removes(name)) {
            push_field(&mut out, name, value);
        }
    }
    for (name, value) in edit.iter().flat_map(|e| e.add.iter()) {
        push_field(&mut out, name.as_str().as_bytes(), value.as_bytes());
    }
    if !dated {
        // RFC 9110 §6.6.1: a forwarded response gets a Date if it has none.
        push_field(&mut out, b"Date", get_cached_date().as_bytes());
    }
    if matches!(parsed.framing, Framing::UntilClose) {
        // Re-framed: see `respond`.
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
    }
    if close {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// A response head, as ranges into the buffer it was read in.
pub(super) struct ParsedResponse {
    pub(super) status: u16,
    /// The reason phrase ("OK"), possibly empty.
    pub(super) reason: Range<usize>,
    pub(super) headers: Vec<(Range<usize>, Range<usize>)>,
    /// Fields the shard's `Connection` names (hop-by-hop).
    pub(super) named: Vec<Vec<u8>>,
    /// The shard will close the connection after this response.
    pub(super) upstream_close: bool,
    /// A response without a body by rule (to HEAD; 204, 304) that announces
    /// one: a shard that sends it anyway would have it answer the next
    /// request on the connection, and no check can tell in time (it may
    /// arrive just after any check), so the connection is not reused.
    pub(super) announced_body: bool,
    pub(super) transfer_encoding: bool,
    /// `Transfer-Encoding` ends in `chunked`.
    pub(super) chunked: bool,
    pub(super) head_len: usize,
    pub(super) framing: Framing,
}

impl ParsedResponse {
    /// Whether the connection may serve another request once this
    /// response's body has been read whole (and nothing beyond it).
    pub(super) fn keeps_connection(&self) -> bool {
        !self.upstream_close && !self.announced_body
    }
}

fn range_of(base: &[u8], part: &[u8]) -> Range<usize> {
    let start = part.as_ptr() as usize - base.as_ptr() as usize;
    start..start + part.len()
}

/// Parses a response head; skips informational (1xx) heads other than a
/// WebSocket's 101. `Ok(None)`: incomplete.
pub(super) fn parse_response(
    buf: &[u8],
    head_only: bool,
    websocket: bool,
) -> Result<Option<ParsedResponse>, ()> {
    let mut offset = 0;
    loop {
        let mut slots = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
        let mut resp = httparse::Response::new(&mut slots);
        let rest = &buf[offset..];
        let len = match resp.parse(rest) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err(()),
        };
        // HTTP/1.0 (Python's http.server, say): framed by length or by
        // the close, never chunked, and the connection is not reused.
        let http10 = resp.version == Some(0);
        let status = resp.code.ok_or(())?;
        if unrequested_switch(status, websocket && !http10) {
            return Err(());
        }
        if (100..200).contains(&status) && status != 101 {
            offset += len;
            continue;
        }
        // The reason phrase, as a range of `buf` (httparse hands out a
        // static "" when there is none; it also skips leading empty lines,
        // so the status line is not necessarily where `rest` starts).
        let reason = match resp.reason {
            Some(text) if !text.is_empty() => range_of(buf, text.as_bytes()),
            _ => 0..0,
        };
        let mut parsed = ParsedResponse {
            status,
            reason,
            headers: Vec::with_capacity(resp.headers.len()),
            named: Vec::new(),
            upstream_close: http10,
            announced_body: false,
            transfer_encoding: false,
            chunked: false,
            head_len: offset + len,
            framing: Framing::UntilClose,
        };
        let mut length: Option<u64> = None;
        for h in resp.headers.iter() {
            parsed
                .headers
                .push((range_of(buf, h.name.as_bytes()), range_of(buf, h.value)));
            if header_is(h.name, "connection") {
                for token in tokens(h.value) {
                    if token.eq_ignore_ascii_case(b"close") {
                        parsed.upstream_close = true;
                    } else if !token.eq_ignore_ascii_case(b"keep-alive") {
                        parsed.named.push(token.to_vec());
                    }
                }
            } else if header_is(h.name, "transfer-encoding") {
                if http10 {
                    return Err(());
                }
                parsed.transfer_encoding = true;
                parsed.chunked = tokens(h.value)
                    .last()
                    .is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"));
            } else if header_is(h.name, "content-length") {
                let value = h.value.trim_ascii();
                if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
                    return Err(());
                }
                let n: u64 = std::str::from_utf8(value)
                    .map_err(|_| ())?
                    .parse()
                    .map_err(|_| ())?;
                if length.is_some_and(|l| l != n) {
                    return Err(());
                }
                length = Some(n);
            }
        }
        parsed.announced_body = (head_only || matches!(status, 204 | 304))
            && (parsed.transfer_encoding || length.is_some_and(|n| n > 0));
        parsed.framing = if head_only || matches!(status, 101 | 204 | 304) {
            Framing::Length(0)
        } else if parsed.chunked {
            Framing::chunked()
        } else if parsed.transfer_encoding {
            Framing::UntilClose
        } else if let Some(n) = length {
            Framing::Length(n)
        } else {
            Framing::UntilClose
        };
        parsed.upstream_close |= matches!(parsed.framing, Framing::UntilClose);
        return Ok(Some(parsed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_heads_choose_their_framing() {
        let parse = |head: &[u8], head_only| parse_response(head, head_only, false);
        let p = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", false)
            .unwrap()
            .unwrap();
        assert!(matches!(p.framing, Framing::Length(5)));
        assert_eq!((p.status, p.head_len), (200, 38));
        let p = parse(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.status, 204);
        assert!(p.framing.is_done());
        let p = parse(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 3\r\n\r\n",
            false,
        )
        .unwrap()
        .unwrap();
        assert!(matches!(p.framing, Framing::Chunked(_)));
        let p = parse(b"HTTP/1.1 200 OK\r\n\r\n", false).unwrap().unwrap();
        assert!(matches!(p.framing, Framing::UntilClose) && p.upstream_close);
        let p = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", true)
            .unwrap()
            .unwrap();
        assert!(p.framing.is_done(), "HEAD has no body");
        assert!(parse(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            false
        )
        .is_err());
        assert!(parse(b"HTTP/1.1 200 OK\r\nContent-Length: +3\r\n\r\n", false).is_err());
        assert!(parse(b"HTTP/1.1 101 Switching\r\n\r\n", false).is_err());
        assert!(parse(b"HTTP/1.1 200 OK\r\nContent-Le", false)
            .unwrap()
            .is_none());
    }

    #[test]
    fn response_heads_lose_hop_by_hop_fields() {
        let raw = b"HTTP/1.1 200 Fine\r\nConnection: close, X-Secret\r\nX-Secret: 1\r\nKeep-Alive: timeout=5\r\n\
Transfer-Encoding: chunked\r\nContent-Length: 12\r\nTrailer: x-sum\r\nX-Kept: yes\r\nDate: then\r\n\r\n";
        let p = parse_response(raw, false, false).unwrap().unwrap();
        let head = response_head(raw, &p, false, None);
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "HTTP/1.1 200 Fine\r\nTransfer-Encoding: chunked\r\nX-Kept: yes\r\nDate: then\r\n\r\n"
        );
        let raw = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nKeep-Alive: 1\r\n\r\n";
        let p = parse_response(raw, false, true).unwrap().unwrap();
        let head = String::from_utf8(response_head(raw, &p, true, None)).unwrap();
        assert!(
            head.starts_with("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nDate: "),
            "{head}"
        );
        assert!(
            head.ends_with(" GMT\r\nConnection: close\r\n\r\n"),
            "{head}"
        );
    }

    #[test]
    fn status_lines_are_rebuilt_from_code_and_reason() {
        // Found by the `upstream` fuzz target: httparse skips empty lines
        // before the status line, which once made the copied range run
        // backwards (a panic on a shard's bytes).
        for (raw, line) in [
            (
                &b"\r\n\nHTTP/1.1 404 Not Here\r\n\r\n"[..],
                "HTTP/1.1 404 Not Here\r\n",
            ),
            (
                b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n",
                "HTTP/1.1 200 \r\n",
            ),
            (b"HTTP/1.1 503 \r\n\r\n", "HTTP/1.1 503 \r\n"),
        ] {
            let p = parse_response(raw, false, false).unwrap().unwrap();
            let head = String::from_utf8(response_head(raw, &p, false, None)).unwrap();
            assert!(head.starts_with(line), "{head:?}");
        }
    }
}

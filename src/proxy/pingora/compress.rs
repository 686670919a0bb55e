//! Response compression on Pingora's path (the rules: the pipeline's
//! `compression`): the head made to say what the body becomes, then each
//! piece of the body compressed and flushed as it passes.

use super::session::no_body;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::Gateway;
use crate::wire::compress::{Decision, ResponseFacts};
use bytes::Bytes;
use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::ErrorType;
use pingora_proxy::Session;

/// Decides for the shard's head `head` (hop-by-hop fields gone, the
/// embedder's edit applied) and edits it: a compressed body loses its length, ranges and strong
/// `ETag`, gains `Content-Encoding`, `Vary` and (to an HTTP/1.1 client)
/// chunks; the encoder waits in `ctx` for the body.
pub(super) fn compress_head(
    gw: &Gateway,
    session: &Session,
    head: &mut ResponseHeader,
    ctx: &mut RequestCtx,
) -> Result<()> {
    ctx.encoder = None;
    // Not on this path: a cached body (stored as the shard sent it), nor
    // an HTTP/2 shard's (Pingora ends its body with trailers or with the
    // head itself, past the body phase that would end the coding).
    let h2_shard = ctx.peer.as_ref().is_some_and(|p| p.protocol.may_be_h2());
    if session.cache.enabled() || h2_shard {
        return Ok(());
    }
    let shards: &ResponseHeader = head;
    let (decision, encoder) = gw.compression(ctx, |smallest| {
        let status = shards.status.as_u16();
        let length = shards.headers.get(CONTENT_LENGTH);
        let length = length.and_then(|v| std::str::from_utf8(v.as_bytes()).ok()?.parse().ok());
        let bodiless = no_body(session, shards) || (100..200).contains(&status);
        ResponseFacts::of(status, bodiless, length, smallest, |name| {
            shards
                .headers
                .get_all(name)
                .into_iter()
                .map(|v| v.as_bytes())
        })
    });
    ctx.encoder = encoder;
    if decision == Decision::Leave {
        return Ok(());
    }
    let fields: Vec<(&[u8], &[u8])> = (head.headers.iter())
        .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()))
        .collect();
    let added = decision.fields(&fields);
    let dropped: Vec<http::HeaderName> = (head.headers.keys())
        .filter(|name| decision.drops(name.as_str().as_bytes()))
        .cloned()
        .collect();
    for name in dropped {
        head.remove_header(&name);
    }
    for (name, value) in added {
        head.append_header(name, value)?;
    }
    let http11 = session.req_header().version == http::Version::HTTP_11;
    if decision.coding().is_some() && http11 && !session.is_http2() {
        head.insert_header(TRANSFER_ENCODING, "chunked")?;
    }
    Ok(())
}

/// A piece of the body to the client: compressed and flushed if the body
/// is, with the stream's end after the last.
pub(super) fn compress_body(
    body: &mut Option<Bytes>,
    end_of_stream: bool,
    ctx: &mut RequestCtx,
) -> Result<()> {
    let Some(encoder) = ctx.encoder.as_mut() else {
        return Ok(());
    };
    let failed = |e: std::io::Error| {
        Error::because(ErrorType::InternalError, "compressing a response body", e)
    };
    let piece = body.take().unwrap_or_default();
    *body = Some(encoder.encode(&piece, end_of_stream).map_err(failed)?);
    Ok(())
}

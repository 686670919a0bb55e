//! Response compression (DESIGN §10) for both transports: the coding a
//! client negotiated (at plan time, from its `Accept-Encoding`), and for
//! each response whether its body is compressed, left as it is, or left
//! with `Vary: Accept-Encoding` (the rules: `wire::compress`). Bodies
//! compressed at once are bounded (`compression.max_streams`): each holds
//! an encoder's state (measured in docs/compression.md).

use crate::proxy::ctx::RequestCtx;
use crate::proxy::Gateway;
use crate::wire::compress::encoder::Encoder;
use crate::wire::compress::{Decision, ResponseFacts};
use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bodies being compressed now, in this process.
static STREAMS: AtomicUsize = AtomicUsize::new(0);

/// One body's encoder, holding one of `compression.max_streams` until it
/// is dropped.
pub(crate) struct BodyEncoder {
    encoder: Encoder,
}

impl BodyEncoder {
    /// A piece of the body as the client gets it: compressed and flushed
    /// (nothing for an empty piece), followed, at the body's `end`, by the
    /// coding's last bytes.
    pub(crate) fn encode(&mut self, piece: &[u8], end: bool) -> std::io::Result<Bytes> {
        let out = match piece.is_empty() {
            true => Bytes::new(),
            false => self.encoder.chunk(piece)?,
        };
        if !end {
            return Ok(out);
        }
        let last = self.encoder.finish()?;
        Ok(match out.is_empty() {
            true => last,
            false => [out, last].concat().into(),
        })
    }
}

impl Drop for BodyEncoder {
    fn drop(&mut self) {
        STREAMS.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Gateway {
    /// Notes the coding the client accepts best (`Accept-Encoding`'s
    /// values), if compression is on.
    pub(crate) fn negotiate_coding<'a>(
        &self,
        ctx: &mut RequestCtx,
        accept: impl Iterator<Item = &'a [u8]>,
    ) {
        if let Some(policy) = &self.control.config.compression {
            ctx.coding = policy.negotiate(accept);
        }
    }

    /// What becomes of the body of a response `facts` describes (read
    /// only when compression is on, given the policy's smallest body),
    /// with its encoder when it is
    /// compressed. A gRPC call's body never changes (its framing is its
    /// own). A body that would be compressed but finds every stream taken
    /// (or its encoder failing to start) goes as it is, with `Vary`.
    pub(crate) fn compression<'f>(
        &self,
        ctx: &RequestCtx,
        facts: impl FnOnce(u64) -> ResponseFacts<'f>,
    ) -> (Decision, Option<BodyEncoder>) {
        let Some(policy) = self
            .control
            .config
            .compression
            .as_ref()
            .filter(|_| !ctx.grpc)
        else {
            return (Decision::Leave, None);
        };
        let decision = policy.decide(&facts(policy.min_bytes), ctx.coding);
        let Some(coding) = decision.coding() else {
            return (decision, None);
        };
        let taken = STREAMS.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < policy.max_streams).then_some(n + 1)
        });
        if taken.is_err() {
            return (Decision::LeaveVaried, None);
        }
        match Encoder::new(coding, policy.levels) {
            Ok(encoder) => (decision, Some(BodyEncoder { encoder })),
            Err(_) => {
                STREAMS.fetch_sub(1, Ordering::AcqRel);
                (Decision::LeaveVaried, None)
            }
        }
    }
}

//! Request bodies on their way to the shard, re-framed for it: an HTTP/1
//! body decoded by its framing (`Content-Length` bytes as they come,
//! chunks written anew without their extensions, trailers passed on
//! without the fields no trailer may set), an HTTP/2 body's DATA written
//! as a length or as chunks — within `limits.max_body_bytes`, read as the
//! shard takes them (the gateway holds at most one read of a body).

use super::request::Outgoing;
use crate::proxy::hooks::UpstreamEdit;
use crate::proxy::pipeline::answer::Refusal;
use crate::proxy::pipeline::body::BodyPhase;
use crate::proxy::pipeline::fields::Owned;
use crate::proxy::pipeline::framing::{
    put_chunk, put_last_chunk, trailer_fields, Framing, Part, MAX_SIZE_LINE,
};
use bytes::{Buf, Bytes, BytesMut};

/// A body is read from the client in reads of up to this much, each
/// forwarded before the next.
pub(super) const BODY_READ: usize = 64 * 1024;

/// Why a request body could not be read whole.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum BodyError {
    /// The client closed (or failed) before its body ended.
    Gone,
    /// No body byte for `limits.body_timeout_ms`: 408.
    Stalled,
    /// Chunks that break their framing: 400.
    Malformed,
    /// Over `limits.max_body_bytes`: 413.
    TooLarge,
    /// A trailer section over `limits.max_header_bytes`: 431.
    TrailersTooLarge,
    /// Refused by the embedder's body phase.
    Refused(Box<Refusal>),
}

impl BodyError {
    /// The answer, if the client is still there to read one.
    pub(super) fn answer(self) -> Option<Refusal> {
        match self {
            BodyError::Gone => None,
            BodyError::Stalled => Some(Refusal::error(408, "request-timeout")),
            BodyError::Malformed => Some(Refusal::error(400, "invalid-chunked-body")),
            BodyError::TooLarge => Some(Refusal::error(413, "body-too-large")),
            BodyError::TrailersTooLarge => Some(Refusal::error(431, "header-too-large")),
            BodyError::Refused(refusal) => Some(*refusal),
        }
    }
}

/// What the trailers of a body and its size may be.
#[derive(Clone, Copy, Debug)]
pub(super) struct BodyLimits {
    /// `limits.max_body_bytes`.
    pub max_body: Option<u64>,
    /// `limits.max_header_bytes`, for a trailer section.
    pub max_trailers: usize,
    /// The fields shardgate owns (never taken from a client's trailers).
    pub owned: Owned<'static>,
}

/// An HTTP/1 request body as it arrives, turned into the bytes the shard
/// receives.
pub(super) struct H1Body {
    framing: Framing,
    chunked: bool,
    /// The trailer section read so far.
    trailers: Vec<u8>,
    /// How much more a chunked body may announce.
    budget: Option<u64>,
    /// How many more bytes of framing (size lines with their extensions
    /// and whitespace, CRLFs) a chunked body may carry: as many as its
    /// content may and one longest size line, so that a stream of framing
    /// around little content (extensions, one-byte chunks) is not read
    /// forever.
    framing_budget: Option<u64>,
    limits: BodyLimits,
    /// The embedder's body phase, if it inspects bodies.
    phase: Option<BodyPhase>,
    /// The embedder's upstream edit, if any: its fields are not taken
    /// from the client's trailers either.
    edit: Option<UpstreamEdit>,
    /// Content bytes taken so far.
    received: u64,
}

/// The body phase's verdict on a piece, as a body error.
fn inspect(phase: &mut Option<BodyPhase>, data: &[u8], end: bool) -> Result<(), BodyError> {
    match phase {
        Some(phase) => (phase.piece(data, end)).map_err(|r| BodyError::Refused(Box::new(r))),
        None => Ok(()),
    }
}

impl H1Body {
    pub(super) fn new(framing: Framing, limits: BodyLimits) -> Self {
        // A request body is never framed by the close (the head reader says
        // so only of a WebSocket handshake, which has none): whatever
        // follows is not a body.
        let framing = match framing {
            Framing::UntilClose => Framing::Length(0),
            framing => framing,
        };
        H1Body {
            chunked: matches!(framing, Framing::Chunked(_)),
            framing,
            trailers: Vec::new(),
            budget: limits.max_body,
            framing_budget: (limits.max_body)
                .map(|max| max.saturating_add(u64::from(MAX_SIZE_LINE))),
            limits,
            phase: None,
            edit: None,
            received: 0,
        }
    }

    /// Content bytes taken so far (framing not counted).
    pub(super) fn received(&self) -> u64 {
        self.received
    }

    /// Once the request is planned: the embedder's body phase runs on what
    /// is taken from now on, and its upstream edit holds for the trailers.
    /// The tenant's own body limit (`max_body`) holds for its chunks.
    pub(super) fn planned(
        &mut self,
        phase: Option<BodyPhase>,
        edit: &UpstreamEdit,
        max_body: Option<u64>,
    ) {
        self.phase = phase;
        self.edit = (!edit.is_empty()).then(|| edit.clone());
        self.budget = match (self.budget, max_body) {
            (Some(left), Some(max)) => Some(left.min(max)),
            (left, max) => left.or(max),
        };
    }

    /// How the shard receives it.
    pub(super) fn outgoing(&self, announced_length: bool) -> Outgoing {
        match &self.framing {
            Framing::Chunked(_) => Outgoing::Chunked,
            Framing::Length(0) if !announced_length => Outgoing::None,
            Framing::Length(n) => Outgoing::Length(*n),
            Framing::UntilClose => Outgoing::None,
        }
    }

    pub(super) fn is_done(&self) -> bool {
        self.framing.is_done()
    }

    /// Whether `bytes` hold the rest of the body (valid framing included).
    pub(super) fn completes(&self, bytes: &[u8]) -> bool {
        let mut framing = self.framing.clone();
        framing.consume(bytes).is_ok() && framing.is_done()
    }

    /// Takes what belongs to the body from the front of `input` (the rest
    /// is the next request's) and returns it as the shard receives it:
    /// the bytes themselves for a length (no copy), chunks written anew.
    /// Empty if `input` held only framing.
    pub(super) fn take(&mut self, input: &mut BytesMut) -> Result<Bytes, BodyError> {
        if !self.chunked {
            let used = self
                .framing
                .consume(input)
                .map_err(|_| BodyError::Malformed)?;
            if let Some(budget) = &mut self.budget {
                // The tenant's own limit, whatever the length said.
                *budget = (budget.checked_sub(used as u64)).ok_or(BodyError::TooLarge)?;
            }
            inspect(&mut self.phase, &input[..used], self.framing.is_done())?;
            self.received += used as u64;
            return Ok(input.split_to(used).freeze());
        }
        let mut data: smallvec::SmallVec<[std::ops::Range<usize>; 4]> = Default::default();
        let (mut announced, mut trailer) = (0u64, 0..0);
        let used = self
            .framing
            .decode(input, |part| match part {
                Part::Data(range) => data.push(range),
                Part::Chunk(size) => announced = announced.saturating_add(size),
                Part::Trailer(range) if trailer.is_empty() => trailer = range,
                Part::Trailer(range) => trailer.end = range.end,
            })
            .map_err(|_| BodyError::Malformed)?;
        if let Some(budget) = &mut self.budget {
            // A chunk that announces more than is left is refused at once.
            *budget = budget.checked_sub(announced).ok_or(BodyError::TooLarge)?;
        }
        let len: usize = data.iter().map(|r| r.len()).sum();
        if let Some(budget) = &mut self.framing_budget {
            let framing = used - len - trailer.len();
            *budget = (budget.checked_sub(framing as u64)).ok_or(BodyError::TooLarge)?;
        }
        self.trailers.extend_from_slice(&input[trailer]);
        if self.trailers.len() > self.limits.max_trailers {
            return Err(BodyError::TrailersTooLarge);
        }
        if self.phase.is_some() {
            for range in &data {
                inspect(&mut self.phase, &input[range.clone()], false)?;
            }
            inspect(&mut self.phase, &[], self.framing.is_done())?;
        }
        self.received += len as u64;
        let mut out = BytesMut::with_capacity(len + 32);
        put_chunk(&mut out, data.iter().map(|r| &input[r.clone()]), len);
        if self.framing.is_done() {
            put_end(&mut out, &self.trailers, &self.limits, self.edit.as_ref());
        }
        input.advance(used);
        Ok(out.freeze())
    }
}

/// An HTTP/2 request body's DATA as the shard receives it.
pub(super) struct H2Body {
    outgoing: Outgoing,
    /// How much more may come.
    budget: Option<u64>,
    /// How much of a `Content-Length` is still to come.
    left: u64,
    /// The embedder's body phase, if it inspects bodies.
    phase: Option<BodyPhase>,
    /// Content bytes taken so far.
    received: u64,
}

impl H2Body {
    pub(super) fn new(outgoing: Outgoing, max_body: Option<u64>) -> Self {
        H2Body {
            outgoing,
            budget: max_body,
            left: match outgoing {
                Outgoing::Length(n) => n,
                _ => 0,
            },
            phase: None,
            received: 0,
        }
    }

    /// Content bytes taken so far.
    pub(super) fn received(&self) -> u64 {
        self.received
    }

    /// Once the request is planned: the embedder's body phase runs on
    /// every piece, and the tenant's own body limit holds.
    pub(super) fn planned(&mut self, phase: Option<BodyPhase>, max_body: Option<u64>) {
        self.phase = phase;
        self.budget = match (self.budget, max_body) {
            (Some(left), Some(max)) => Some(left.min(max)),
            (left, max) => left.or(max),
        };
    }

    /// One DATA frame's content, framed for the shard.
    pub(super) fn data(&mut self, data: Bytes) -> Result<Bytes, BodyError> {
        self.received += data.len() as u64;
        if let Some(budget) = &mut self.budget {
            *budget = budget
                .checked_sub(data.len() as u64)
                .ok_or(BodyError::TooLarge)?;
        }
        // The last piece of a length completes the shard's request: the
        // body phase is told it is the end before it goes.
        self.left = self.left.saturating_sub(data.len() as u64);
        let last = matches!(self.outgoing, Outgoing::Length(_)) && self.left == 0;
        inspect(&mut self.phase, &data, last)?;
        Ok(match self.outgoing {
            Outgoing::Chunked if !data.is_empty() => {
                let mut out = BytesMut::with_capacity(data.len() + 16);
                put_chunk(&mut out, std::iter::once(&data[..]), data.len());
                out.freeze()
            }
            Outgoing::Chunked => Bytes::new(),
            _ => data,
        })
    }

    /// The end of the body, framed for the shard.
    pub(super) fn end(&mut self) -> Result<Bytes, BodyError> {
        inspect(&mut self.phase, &[], true)?;
        Ok(match self.outgoing {
            Outgoing::Chunked => {
                let mut out = BytesMut::with_capacity(5);
                put_last_chunk(&mut out, &[]);
                out.freeze()
            }
            _ => Bytes::new(),
        })
    }
}

/// The end of a body the shard receives in chunks: the last chunk and
/// the trailer fields a shard may take — the one trailer rule
/// ([`trailer_fields`]), and none shardgate owns nor the embedder's `edit`
/// sets or removes.
fn put_end(out: &mut BytesMut, trailers: &[u8], limits: &BodyLimits, edit: Option<&UpstreamEdit>) {
    let ours = |name: &str| limits.owned.owns(name) || edit.is_some_and(|e| e.replaces(name));
    put_last_chunk(out, &trailer_fields(trailers, ours));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_body: Option<u64>) -> BodyLimits {
        BodyLimits {
            max_body,
            max_trailers: 64,
            owned: Owned {
                tenant_header: "x-tenant-id",
                request_id_header: "x-request-id",
                trust_forwarded_for: false,
                traceparent: false,
                tracestate: false,
            },
        }
    }

    /// Feeds `wire` in pieces of `step` bytes; the shard's bytes and what
    /// was left over.
    fn feed(
        framing: Framing,
        wire: &[u8],
        step: usize,
        max: Option<u64>,
    ) -> Result<(Vec<u8>, Vec<u8>), BodyError> {
        let mut body = H1Body::new(framing, limits(max));
        let (mut out, mut input) = (Vec::new(), BytesMut::new());
        for piece in wire.chunks(step) {
            input.extend_from_slice(piece);
            if !body.is_done() {
                out.extend_from_slice(&body.take(&mut input)?);
            }
        }
        Ok((out, input.to_vec()))
    }

    #[test]
    fn chunks_are_written_anew_with_the_trailers_a_shard_may_take() {
        let wire = b"3;ext=1\r\nabc\r\n00000000000000000000000000000000000000002\r\nde\r\n0\r\nX-Sum: 1\r\nX-Tenant-Id: evil\r\nContent-Length: 9\r\n\r\nNEXT";
        for step in [1, 2, 7, wire.len()] {
            let (out, rest) = feed(Framing::chunked(), wire, step, None).unwrap();
            let text = String::from_utf8(out).unwrap();
            // Split reads may cut the data into more chunks; their content
            // and the trailers are the same.
            let mut framing = Framing::chunked();
            let mut content = Vec::new();
            let mut trailer = Vec::new();
            framing
                .decode(text.as_bytes(), |p| match p {
                    Part::Data(r) => content.extend_from_slice(&text.as_bytes()[r]),
                    Part::Trailer(r) => trailer.extend_from_slice(&text.as_bytes()[r]),
                    Part::Chunk(_) => {}
                })
                .unwrap();
            assert!(framing.is_done(), "{text:?}");
            assert_eq!(content, b"abcde", "step {step}: {text:?}");
            assert_eq!(trailer, b"X-Sum: 1\r\n", "step {step}: {text:?}");
            assert!(
                !text.contains("ext=1") && !text.contains("0000"),
                "{text:?}"
            );
            assert_eq!(rest, b"NEXT");
        }
        let (out, _) = feed(Framing::chunked(), wire, wire.len(), None).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "5\r\nabcde\r\n0\r\nX-Sum: 1\r\n\r\n"
        );
    }

    #[test]
    fn a_length_is_passed_on_as_it_comes() {
        let (out, rest) = feed(Framing::Length(5), b"helloGET", 3, None).unwrap();
        assert_eq!(
            (out.as_slice(), rest.as_slice()),
            (&b"hello"[..], &b"GET"[..])
        );
    }

    #[test]
    fn a_chunk_announcing_more_than_is_left_is_refused_at_once() {
        // 8 bytes allowed: the second chunk's size line alone is refused,
        // before its data arrives.
        let err = feed(Framing::chunked(), b"5\r\nhello\r\n4\r\n", 64, Some(8)).unwrap_err();
        assert_eq!(err, BodyError::TooLarge);
        assert!(feed(
            Framing::chunked(),
            b"5\r\nhello\r\n3\r\nabc\r\n0\r\n\r\n",
            64,
            Some(8)
        )
        .is_ok());
        assert_eq!(
            feed(Framing::chunked(), b"zz\r\n", 64, None).unwrap_err(),
            BodyError::Malformed
        );
        let many = format!(
            "0\r\n{}\r\n",
            "X-Long: aaaaaaaaaaaaaaaaaaaaaa\r\n".repeat(4)
        );
        assert_eq!(
            feed(Framing::chunked(), many.as_bytes(), 64, None).unwrap_err(),
            BodyError::TrailersTooLarge
        );
    }

    #[test]
    fn framing_around_little_content_counts_against_the_limit() {
        // 100 bytes of content allowed: 1 000 one-byte chunks are under it
        // in content, far over it in framing.
        let many = format!("{}0\r\n\r\n", "1;ext=aaaaaaaaaa\r\nx\r\n".repeat(1000));
        assert_eq!(
            feed(Framing::chunked(), many.as_bytes(), 4096, Some(1000)).unwrap_err(),
            BodyError::TooLarge
        );
        let few = format!("{}0\r\n\r\n", "1;ext=aaaaaaaaaa\r\nx\r\n".repeat(10));
        assert!(feed(Framing::chunked(), few.as_bytes(), 4096, Some(1000)).is_ok());
    }

    #[test]
    fn http2_data_is_framed_for_the_shard_within_the_limit() {
        let mut body = H2Body::new(Outgoing::Chunked, Some(6));
        assert_eq!(
            &body.data(Bytes::from_static(b"abc")).unwrap()[..],
            b"3\r\nabc\r\n"
        );
        assert_eq!(
            body.data(Bytes::from_static(b"defg")).unwrap_err(),
            BodyError::TooLarge
        );
        assert_eq!(&body.end().expect("no phase")[..], b"0\r\n\r\n");
        let mut body = H2Body::new(Outgoing::Length(3), None);
        assert_eq!(&body.data(Bytes::from_static(b"abc")).unwrap()[..], b"abc");
        assert!(body.end().expect("no phase").is_empty());
    }
}

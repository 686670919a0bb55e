//! Wrapping [`Gateway`] in a `ProxyHttp` of your own, for those who need
//! Pingora's `Session`, without writing (or forgetting) the delegation:
//! implement [`GatewayWrapper`] — `gateway()` and the phases you add — and
//! build with [`crate::server::Builder::build_wrapped`]. Every phase you do
//! not write is shardgate's; one you do write calls shardgate's itself
//! (`self.gateway().request_filter(session, &mut ctx.gateway)`) where it
//! wants it. Forgetting that call is caught at run time for the phases
//! later ones depend on (`request_filter`, `upstream_peer`,
//! `connected_to_upstream`, `upstream_response_filter`: the request fails,
//! 500, and the log names the phase) and named in the log for
//! `request_body_filter` and `response_filter`; not for `fail_to_connect`,
//! `error_while_proxy`, `fail_to_proxy`, `upstream_response_trailer_filter`
//! (a gRPC shard's status for the log) and `logging` (see `pingora/`).
//! The front end's own answers (the head reader's refusals, the edge's,
//! reset HTTP/2 streams) are logged by shardgate and the hooks' logging
//! phase, not through a wrapper's `logging`.
//!
//! [`Wrapped`] is the `ProxyHttp` the server runs: each of its phases is
//! the wrapper's. Those without a rule of shardgate's (cache, modules,
//! subrequests) keep Pingora's defaults: write your own `ProxyHttp` if
//! you need them, and forward every phase `Gateway` implements.

use super::ctx::RequestCtx;
use super::Gateway;
use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::protocols::Digest;
use pingora::upstreams::peer::HttpPeer;
use pingora_proxy::{FailToProxy, ProxyHttp, Session};
use std::time::Duration;

/// A wrapper's per-request context: shardgate's, and the wrapper's own.
pub struct WrapperCtx<C> {
    pub gateway: RequestCtx,
    pub own: C,
}

/// A `ProxyHttp` phase by phase, each defaulting to shardgate's: override
/// the ones you add to. Pingora's phases, with `Session` and a
/// [`WrapperCtx`].
#[async_trait]
pub trait GatewayWrapper: Send + Sync + 'static {
    /// Your own per-request state (`()` if you keep none).
    type Ctx: Default + Send + Sync;

    /// The gateway this wraps.
    fn gateway(&self) -> &Gateway;

    async fn early_request_filter(
        &self,
        session: &mut Session,
        ctx: &mut WrapperCtx<Self::Ctx>,
    ) -> Result<()> {
        self.gateway()
            .early_request_filter(session, &mut ctx.gateway)
            .await
    }

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut WrapperCtx<Self::Ctx>,
    ) -> Result<bool> {
        self.gateway()
            .request_filter(session, &mut ctx.gateway)
            .await
    }

    async fn upstream_peer(
        &self,
        session: &mut Session,
        ctx: &mut WrapperCtx<Self::Ctx>,
    ) -> Result<Box<HttpPeer>> {
        self.gateway()
            .upstream_peer(session, &mut ctx.gateway)
            .await
    }

    async fn connected_to_upstream(
        &self,
        session: &mut Session,
        reused: bool,
        peer: &HttpPeer,
        fd: std::os::unix::io::RawFd,
        digest: Option<&Digest>,
        ctx: &mut WrapperCtx<Self::Ctx>,
    ) -> Result<()> {
        self.gateway()
            .connected_to_upstream(session, reused, peer, fd, digest, &mut ctx.gateway)
            .await
    }

    async fn request_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut WrapperCtx<Self::Ctx>,
    ) -> Result<()> {
        self.gateway()
            .request_body_filter(session, body, end_of_stream, &mut ctx.gateway)
            .await
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut WrapperCtx<Self::Ctx>,
    ) -> Result<()> {
        self.gateway()
            .upstream_request_filter(session, upstream_request, &mut ctx.gateway)
            .await
    }

    async fn upstream_response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut WrapperCtx<Self::Ctx>,
    ) -> Result<()> {
        self.gateway()
            .upstream_response_filter(session, upstream_response, &mut ctx.gateway)
            .await
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut WrapperCtx<Self::Ctx>,
    ) -> Result<()> {
        self.gateway()
            .response_filter(session, upstream_response, &mut ctx.gateway)
            .await
    }

    fn upstream_response_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut WrapperCtx<Self::Ctx>,
    ) -> Result<Option<Duration>> {
        self.gateway()
            .upstream_response_body_filter(session, body, end_of_stream, &mut ctx.gateway)
    }

    fn upstream_response_trailer_filter(
        &self,
        session: &mut Session,
        trailers: &mut http::HeaderMap,
        ctx: &mut WrapperCtx<Self::Ctx>,
    ) -> Result<()> {
        self.gateway()
            .upstream_response_trailer_filter(session, trailers, &mut ctx.gateway)
    }

    fn response_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut WrapperCtx<Self::Ctx>,
    ) -> Result<Option<Duration>> {
        self.gateway()
            .response_body_filter(session, body, end_of_stream, &mut ctx.gateway)
    }

    fn fail_to_connect(
        &self,
        session: &mut Session,
        peer: &HttpPeer,
        ctx: &mut WrapperCtx<Self::Ctx>,
        e: Box<Error>,
    ) -> Box<Error> {
        self.gateway()
            .fail_to_connect(session, peer, &mut ctx.gateway, e)
    }

    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut WrapperCtx<Self::Ctx>,
        client_reused: bool,
    ) -> Box<Error> {
        self.gateway()
            .error_while_proxy(peer, session, e, &mut ctx.gateway, client_reused)
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut WrapperCtx<Self::Ctx>,
    ) -> FailToProxy {
        self.gateway()
            .fail_to_proxy(session, e, &mut ctx.gateway)
            .await
    }

    async fn logging(
        &self,
        session: &mut Session,
        e: Option<&Error>,
        ctx: &mut WrapperCtx<Self::Ctx>,
    ) {
        self.gateway().logging(session, e, &mut ctx.gateway).await
    }

    fn suppress_error_log(
        &self,
        session: &Session,
        ctx: &WrapperCtx<Self::Ctx>,
        error: &Error,
    ) -> bool {
        self.gateway()
            .suppress_error_log(session, &ctx.gateway, error)
    }
}

/// The `ProxyHttp` of a [`GatewayWrapper`]: every phase is the wrapper's.
pub struct Wrapped<W>(pub W);

#[async_trait]
impl<W: GatewayWrapper> ProxyHttp for Wrapped<W> {
    type CTX = WrapperCtx<W::Ctx>;

    fn new_ctx(&self) -> Self::CTX {
        WrapperCtx {
            gateway: self.0.gateway().new_ctx(),
            own: W::Ctx::default(),
        }
    }

    async fn early_request_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<()> {
        self.0.early_request_filter(session, ctx).await
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<bool> {
        self.0.request_filter(session, ctx).await
    }

    async fn upstream_peer(
        &self,
        session: &mut Session,
        ctx: &mut Self::CTX,
    ) -> Result<Box<HttpPeer>> {
        self.0.upstream_peer(session, ctx).await
    }

    async fn connected_to_upstream(
        &self,
        session: &mut Session,
        reused: bool,
        peer: &HttpPeer,
        fd: std::os::unix::io::RawFd,
        digest: Option<&Digest>,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        (self.0)
            .connected_to_upstream(session, reused, peer, fd, digest, ctx)
            .await
    }

    async fn request_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        (self.0)
            .request_body_filter(session, body, end_of_stream, ctx)
            .await
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        (self.0)
            .upstream_request_filter(session, upstream_request, ctx)
            .await
    }

    async fn upstream_response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        (self.0)
            .upstream_response_filter(session, upstream_response, ctx)
            .await
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        (self.0)
            .response_filter(session, upstream_response, ctx)
            .await
    }

    fn upstream_response_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<Option<Duration>> {
        (self.0).upstream_response_body_filter(session, body, end_of_stream, ctx)
    }

    fn upstream_response_trailer_filter(
        &self,
        session: &mut Session,
        trailers: &mut http::HeaderMap,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        (self.0).upstream_response_trailer_filter(session, trailers, ctx)
    }

    fn response_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<Option<Duration>> {
        (self.0).response_body_filter(session, body, end_of_stream, ctx)
    }

    fn fail_to_connect(
        &self,
        session: &mut Session,
        peer: &HttpPeer,
        ctx: &mut Self::CTX,
        e: Box<Error>,
    ) -> Box<Error> {
        self.0.fail_to_connect(session, peer, ctx, e)
    }

    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut Self::CTX,
        client_reused: bool,
    ) -> Box<Error> {
        self.0
            .error_while_proxy(peer, session, e, ctx, client_reused)
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut Self::CTX,
    ) -> FailToProxy {
        self.0.fail_to_proxy(session, e, ctx).await
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Self::CTX) {
        self.0.logging(session, e, ctx).await
    }

    fn suppress_error_log(&self, session: &Session, ctx: &Self::CTX, error: &Error) -> bool {
        self.0.suppress_error_log(session, ctx, error)
    }
}

#[cfg(test)]
mod tests {
    /// Each `fn` in the block of `source` that opens with `opening` (up to
    /// the next line that is just `}`): its name and its text.
    fn fns_in<'s>(source: &'s str, opening: &str) -> Vec<(&'s str, &'s str)> {
        let start = source.find(opening).expect("the block is there");
        let block = &source[start..];
        let end = block.find("\n}\n").expect("the block ends");
        (block[..end].split("fn ").skip(1))
            .filter_map(|text| Some((text.split(['(', '<']).next()?.trim(), text)))
            .filter(|(name, _)| !name.is_empty() && !name.contains(char::is_whitespace))
            .collect()
    }

    /// Every phase `Gateway` implements is a phase of `GatewayWrapper`
    /// that defaults to `Gateway`'s, and `Wrapped` forwards every phase of
    /// `GatewayWrapper` to it: a phase added to `Gateway` and not here, or
    /// a default that calls something else, fails this test.
    #[test]
    fn every_phase_of_gateway_is_forwarded_by_default() {
        let gateway = fns_in(
            include_str!("pingora/mod.rs"),
            "impl ProxyHttp for Gateway {",
        );
        let here = include_str!("wrap.rs");
        let wrapper = fns_in(here, "pub trait GatewayWrapper");
        let wrapped = fns_in(here, "impl<W: GatewayWrapper> ProxyHttp for Wrapped<W> {");
        assert!(gateway.len() >= 12, "{gateway:?}");
        let find = |fns: &[(&str, &'static str)], phase: &str| {
            (fns.iter().find(|(name, _)| *name == phase)).map(|(_, text)| *text)
        };
        for (phase, _) in gateway.iter().filter(|(p, _)| *p != "new_ctx") {
            let default = find(&wrapper, phase).unwrap_or_else(|| panic!("no {phase}"));
            assert!(
                default.contains("self.gateway()") && default.contains(&format!(".{phase}(")),
                "GatewayWrapper's {phase} does not default to Gateway's"
            );
        }
        for (phase, _) in wrapper.iter().filter(|(p, _)| *p != "gateway") {
            let forward = find(&wrapped, phase).unwrap_or_else(|| panic!("Wrapped lacks {phase}"));
            assert!(
                forward.contains("self.0") && forward.contains(&format!(".{phase}(")),
                "Wrapped's {phase} does not call the wrapper's"
            );
        }
        assert!(find(&wrapped, "new_ctx").is_some_and(|t| t.contains(".new_ctx()")));
    }
}

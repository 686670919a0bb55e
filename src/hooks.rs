//! What an embedding server may decide for shardgate: whether a tenant may
//! be served, a check of each request (answer it, or edit its upstream
//! head), a check of each request body, an edit of each response head, a
//! look at each finished request, what happens when a shard fails, and
//! the per-shard load fed to `rendezvous`/`hrw`. Every method has the
//! standalone binary's behaviour as its default, and every one runs on
//! both transports (shardgate's own HTTP/1.1 forwarding and Pingora's
//! proxy) for every request.

use crate::routing::{Router, ShardId};
pub use crate::summary::{RequestSummary, UpstreamFailure};
use http::{HeaderName, HeaderValue};
use std::fmt;

/// A client request as the hooks see it, whichever transport carries it.
#[derive(Clone, Copy)]
pub struct RequestView<'a> {
    /// The method as sent (`GET`, …).
    pub method: &'a str,
    /// The request target as sent: origin form (`/path?query`) or the
    /// absolute form's text.
    pub target: &'a str,
    /// The path, without query.
    pub path: &'a str,
    /// An absolute-form target's authority, if the target had one.
    pub authority: Option<&'a str>,
    fields: Fields<'a>,
    request_id: &'a str,
    trace: Option<&'a crate::trace::TraceContext>,
}

/// The request's fields, as each transport holds them.
#[derive(Clone, Copy)]
enum Fields<'a> {
    Raw(&'a [(&'a str, &'a [u8])]),
    Map(&'a http::HeaderMap),
}

impl<'a> RequestView<'a> {
    /// A view of a head parsed into (name, value) pairs.
    pub fn from_raw(
        method: &'a str,
        target: &'a str,
        path: &'a str,
        fields: &'a [(&'a str, &'a [u8])],
    ) -> Self {
        RequestView {
            method,
            target,
            path,
            authority: None,
            fields: Fields::Raw(fields),
            request_id: "",
            trace: None,
        }
    }

    /// The same view, with an absolute-form target's authority.
    pub fn with_authority(mut self, authority: Option<&'a str>) -> Self {
        self.authority = authority;
        self
    }

    /// A view of a Pingora request head.
    pub fn from_pingora(req: &'a pingora::http::RequestHeader) -> Self {
        RequestView {
            method: req.method.as_str(),
            target: std::str::from_utf8(req.raw_path()).unwrap_or_else(|_| req.uri.path()),
            path: req.uri.path(),
            authority: req.uri.authority().map(|a| a.as_str()),
            fields: Fields::Map(&req.headers),
            request_id: "",
            trace: None,
        }
    }

    /// The same view, with the request's ID.
    pub(crate) fn with_request_id(mut self, id: &'a str) -> Self {
        self.request_id = id;
        self
    }

    /// The request's ID (DESIGN §7): the value of `request_id.header` on
    /// the upstream request and on the answer.
    pub fn request_id(&self) -> &'a str {
        self.request_id
    }

    /// The same view, with the request's trace.
    pub(crate) fn with_trace(mut self, trace: Option<&'a crate::trace::TraceContext>) -> Self {
        self.trace = trace;
        self
    }

    /// The request's trace (DESIGN §7), when tracing is on: its trace ID,
    /// shardgate's span for the request (the parent of an embedder's own
    /// spans) and whether it is sampled. The client's `traceparent` is
    /// among the fields as sent.
    pub fn trace(&self) -> Option<&'a crate::trace::TraceContext> {
        self.trace
    }

    /// Every value of the field `name` (case-insensitive), in order.
    pub fn values<'s>(&'s self, name: &'s str) -> Values<'a, 's> {
        match self.fields {
            Fields::Raw(fields) => Values::Raw(fields.iter(), name),
            Fields::Map(map) => Values::Map(map.get_all(name).into_iter()),
        }
    }

    /// [`Self::values`] of a name known as a `HeaderName` (an HTTP/2 or
    /// HTTP/3 head's map then finds it without reading the name again).
    pub(crate) fn values_of<'s>(&'s self, name: &'s HeaderName) -> Values<'a, 's> {
        match self.fields {
            Fields::Raw(fields) => Values::Raw(fields.iter(), name.as_str()),
            Fields::Map(map) => Values::Map(map.get_all(name).into_iter()),
        }
    }

    /// The first value of the field `name`, known as a `HeaderName`.
    pub(crate) fn header_of(&self, name: &HeaderName) -> Option<&'a [u8]> {
        self.values_of(name).next()
    }

    /// How many fields the head has, as an HTTP/1 head would: each value
    /// of a field counted, but `Cookie`'s as one (HTTP/2 and HTTP/3 may
    /// split it into a field per cookie, RFC 9113 §8.2.3, and browsers
    /// do; it is sent on joined). A head held as a map counts so whatever
    /// its protocol: an HTTP/1 head on Pingora's path with two `Cookie`
    /// lines counts one less than the same head on the fast transport.
    pub fn field_count(&self) -> usize {
        match self.fields {
            Fields::Raw(fields) => fields.len(),
            Fields::Map(map) => {
                let cookies = map.get_all(http::header::COOKIE).iter().count();
                map.len() - cookies.saturating_sub(1)
            }
        }
    }

    /// The first value of the field `name`.
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        match self.fields {
            Fields::Raw(fields) => fields
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| *v),
            Fields::Map(map) => map.get(name).map(|v| v.as_bytes()),
        }
    }
}

/// Whether a response edit (or an embedder's own answer) may set the
/// field `name`: not framing, hop-by-hop or `Date`.
pub(crate) fn editable(name: &HeaderName) -> bool {
    let name = name.as_str();
    !crate::wire::fields::is_hop_by_hop(name) && name != "content-length" && name != "date"
}

/// The values of one field of a [`RequestView`] (no allocation).
pub enum Values<'a, 's> {
    Raw(std::slice::Iter<'a, (&'a str, &'a [u8])>, &'s str),
    Map(http::header::ValueIter<'a, HeaderValue>),
}

impl<'a> Iterator for Values<'a, '_> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        match self {
            Values::Raw(fields, name) => fields
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| *v),
            Values::Map(values) => values.next().map(|v| v.as_bytes()),
        }
    }
}

/// What [`GatewayHooks::check_request`] decided. New ways to decide may
/// be added: match it with a wildcard arm.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub enum RequestCheck {
    /// Route and proxy the request as usual.
    #[default]
    Proceed,
    /// Route and proxy it with these fields added to the upstream request
    /// (after the client's; a field shardgate owns, such as the tenant
    /// header or `X-Forwarded-For`, cannot be set this way and is ignored).
    AddFields(Vec<(HeaderName, HeaderValue)>),
    /// Route and proxy it with the upstream head edited: fields set
    /// (replacing the client's) and fields removed. The same fields as
    /// `AddFields` are shardgate's and left alone: `Host`, framing,
    /// hop-by-hop fields, the tenant header, the forwarding fields.
    Edit(UpstreamEdit),
    /// Answer `status` with `body` (sent as `application/json`); nothing
    /// is routed, no token is spent.
    Refuse { status: u16, body: String },
    /// Answer the request yourself: `status` (outside 200–599: 500),
    /// `fields` (say `content-type` here; framing, hop-by-hop fields and
    /// `Date` are the transports' and are dropped, and so is a value that
    /// is not visible ASCII; `Cache-Control: no-store` unless you set one)
    /// and `body` (none on a 204, 205 or 304). Nothing is routed, no token
    /// is spent.
    Answer {
        status: u16,
        fields: Vec<(HeaderName, HeaderValue)>,
        body: String,
    },
}

/// What [`GatewayHooks::request_body`] decided of a piece of a body.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub enum BodyCheck {
    /// Let the piece go on to the shard.
    #[default]
    Proceed,
    /// Stop the request: the shard's attempt is abandoned (it sees the
    /// body cut short and its connection closed), and the client gets
    /// `status` with `body` (as `application/json`), if no response has
    /// started; its connection closes.
    Refuse { status: u16, body: String },
}

/// An edit of the upstream request head, for [`RequestCheck::Edit`]:
/// `UpstreamEdit::default().insert(name, value).remove(name)`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UpstreamEdit {
    /// Fields set, each replacing the client's of the same name (and its
    /// look-alikes with `_` for `-`).
    pub(crate) add: Vec<(HeaderName, HeaderValue)>,
    /// Fields removed, look-alikes included.
    pub(crate) remove: Vec<HeaderName>,
}

impl UpstreamEdit {
    /// Sets `name` to `value` upstream, in place of the client's (call it
    /// again with the same name to send several values).
    pub fn insert(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.add.push((name, value));
        self
    }

    /// Sends no `name` field upstream (nor its look-alikes), whatever the
    /// client sent, and drops what this edit set of it before.
    pub fn remove(mut self, name: HeaderName) -> Self {
        let same = crate::wire::fields::same_field;
        self.add.retain(|(n, _)| !same(n.as_str(), name.as_str()));
        self.remove.push(name);
        self
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.add.is_empty() && self.remove.is_empty()
    }

    /// Whether the client's field `name` is replaced or removed.
    pub(crate) fn replaces(&self, name: &str) -> bool {
        let same = |n: &HeaderName| crate::wire::fields::same_field(name, n.as_str());
        self.add.iter().any(|(n, _)| same(n)) || self.remove.iter().any(same)
    }
}

/// A response head on its way to the client, as a hook may edit it.
#[derive(Debug, Default)]
pub struct ResponseEdit {
    status: u16,
    pub(crate) add: Vec<(HeaderName, HeaderValue)>,
    pub(crate) remove: Vec<HeaderName>,
}

impl ResponseEdit {
    pub(crate) fn new(status: u16) -> Self {
        ResponseEdit {
            status,
            add: Vec::new(),
            remove: Vec::new(),
        }
    }

    /// Applies the edit to a Pingora response head.
    pub(crate) fn apply(&self, resp: &mut pingora::http::ResponseHeader) -> pingora::Result<()> {
        for name in &self.remove {
            resp.remove_header(name);
        }
        for (name, value) in &self.add {
            resp.append_header(name.clone(), value.clone())?;
        }
        Ok(())
    }

    /// The shard's status code.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// Sets `name` to `value` (replacing what the shard sent). Framing,
    /// hop-by-hop fields and `Date` are the transports' to write: editing
    /// them is refused (`false`).
    pub fn insert(&mut self, name: HeaderName, value: HeaderValue) -> bool {
        if !editable(&name) {
            return false;
        }
        self.add.retain(|(n, _)| *n != name);
        self.remove.push(name.clone());
        self.add.push((name, value));
        true
    }

    /// Removes every `name` field the shard sent (`false`, and nothing
    /// removed, for framing, hop-by-hop fields and `Date`).
    pub fn remove(&mut self, name: HeaderName) -> bool {
        if !editable(&name) {
            return false;
        }
        self.add.retain(|(n, _)| *n != name);
        self.remove.push(name);
        true
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.add.is_empty() && self.remove.is_empty()
    }

    /// Adds a field of shardgate's own, after the shard's.
    pub(crate) fn append(&mut self, name: HeaderName, value: HeaderValue) {
        self.add.push((name, value));
    }

    /// Whether the shard's field `name` is to go.
    pub(crate) fn removes(&self, name: &[u8]) -> bool {
        self.remove
            .iter()
            .any(|r| r.as_str().as_bytes().eq_ignore_ascii_case(name))
    }
}

/// What a transport tells of a request when it is over, for the access
/// log and the hooks' logging phase.
#[derive(Clone, Copy)]
pub(crate) struct RequestLine<'a> {
    pub client: Option<&'a pingora::protocols::l4::socket::SocketAddr>,
    pub method: &'a str,
    /// The target (HTTP/2: the URI).
    pub target: &'a dyn fmt::Display,
    pub host: Option<&'a str>,
    pub protocol: &'static str,
}

pub trait GatewayHooks: Send + Sync + 'static {
    /// Whether `tenant` may be served at all (after the deny list). Called
    /// only once shards for the request exist, as the reference does.
    fn allow(&self, _tenant: &str) -> bool {
        true
    }

    /// Called for every failed upstream attempt. The default marks an
    /// unreachable shard unhealthy at once (active health checks bring it
    /// back after `health.rise` good probes) and leaves alone a slow one
    /// and one that dropped a request but still accepts connections. For a
    /// reset it is called once the probe it triggers has concluded, from a
    /// task of its own.
    fn on_upstream_failure(&self, router: &Router, shard: &ShardId, failure: UpstreamFailure) {
        if failure.is_unreachable() {
            router.mark_unhealthy(shard.as_str());
        }
    }

    /// Checks a request once its tenant is known, before it is routed: let
    /// it through (optionally with extra upstream fields), refuse it, or
    /// answer it.
    fn check_request(&self, _tenant: &str, _request: &RequestView<'_>) -> RequestCheck {
        RequestCheck::Proceed
    }

    /// Whether [`GatewayHooks::request_body`] is to be called. Read once,
    /// when the gateway is built: with `false` (the default) the body
    /// phase costs nothing.
    fn inspects_request_bodies(&self) -> bool {
        false
    }

    /// The body phase (only if `inspects_request_bodies`): each piece of a
    /// request's body as it arrives from the client, in order, before it
    /// goes on to the shard — decoded (no chunk framing), never empty but
    /// for a last call that says only `end` — with `end: true` on the last
    /// call. The end is said before the shard has the whole request (with
    /// the piece that completes a length, before the last chunk), so a
    /// refusal at the end still cuts the shard's request short. Not
    /// called for a request without a body, nor again for a body resent
    /// on a retry; the end is not said of a body the shard answered
    /// before it ended, or whose client went away. Runs on the request's
    /// thread, once per read: keep it short.
    fn request_body(&self, _tenant: &str, _data: &[u8], _end: bool) -> BodyCheck {
        BodyCheck::Proceed
    }

    /// Edits a shard's response head before it goes to the client (not
    /// shardgate's own answers). `tenant` and `shard` say who served it.
    fn edit_response(&self, _tenant: &str, _shard: &ShardId, _response: &mut ResponseEdit) {}

    /// Called once per request when it is over (answered, refused, or its
    /// client or shard gone), after the access log line, on every
    /// transport: every request the access log has a line for, the head
    /// reader's refusals and the edge's own answers included (README
    /// "Logging"). Its admission is already released.
    /// Runs on the request's thread: keep it short (hand heavy work to a
    /// channel).
    fn logging(&self, _summary: &RequestSummary<'_>) {}

    /// Whether [`GatewayHooks::load`] supplies loads (otherwise
    /// `routing.load` from the configuration applies).
    fn provides_load(&self) -> bool {
        false
    }

    /// A shard's current load for `rendezvous`/`hrw` (effective weight =
    /// weight / max(load, 0.0001)); read only if `provides_load`.
    fn load(&self, _shard: &ShardId) -> f64 {
        1.0
    }
}

/// The standalone binary's hooks: every default.
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultHooks;

impl GatewayHooks for DefaultHooks {}
